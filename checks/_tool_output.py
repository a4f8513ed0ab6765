"""What the checks that run an external tool (``dcgm_diag``'s ``dcgmi``, ``rdma_loopback``'s
``ib_write_bw``) keep of its output in a result's details.

Why one place: an operator reading a failed result looks for the tool's own last words, and
both checks must keep the same amount of them, from the same end, marked the same way.
"""

from __future__ import annotations

# Characters of a tool's output a result keeps: its end, where tools print what went wrong.
TAIL_CHARS = 600


def output_tail(text: str) -> str:
    """The last ``TAIL_CHARS`` characters of ``text`` (stripped), with ``...`` where it was
    cut."""
    text = text.strip()
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]
