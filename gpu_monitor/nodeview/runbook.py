"""The runbook as data: what ``gpu-monitor explain REASON`` answers from.

Why it exists: docs/runbook.md is the one place that says, per check and reason, what a
finding means, how sure it is and what to do; ``explain`` must say the same, and the docs
directory is not in the image. So the runbook stays the source, written by hand, and
``extract`` reads it into a small JSON document that ships in the package
(``runbook.json`` beside this module). ``python -m gpu_monitor.docs_gen`` rewrites it and
tests/test_docs_gen.py fails when it no longer matches the runbook.

What is extracted:
1. Every row of a table whose first column is ``reason`` or ``code``: the reasons in its first
   cell (each backticked token; an Xid table's numbers become ``Xid<n>``, ranges included),
   with the row's cells by column name and the section (check) it sits in.
2. Every ``###`` section's prose, so a reason the runbook explains in a paragraph (throttle,
   power, rdma_ports) is answered with that paragraph.
3. The confidence table of "How sure is a finding?", by level.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["PACKAGED", "extract", "load", "render_json", "slug"]

PACKAGED = Path(__file__).resolve().parent / "runbook.json"
_TICKED = re.compile(r"`([^`]+)`")
_RANGE = re.compile(r"(\d+)\s*[–-]\s*(\d+)")


def slug(title: str) -> str:
    """GitHub's anchor of a heading (lower case, punctuation but - and _ dropped)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _cells(line: str) -> list[str]:
    body = line.strip().strip("|")
    # ``\|`` inside a cell is a literal bar (shell pipelines in "what to do").
    parts = re.split(r"(?<!\\)\|", body)
    return [p.strip().replace("\\|", "|") for p in parts]


def _reasons(cell: str, header: str) -> list[str]:
    ticked = [t for t in _TICKED.findall(cell) if re.fullmatch(r"[A-Z][A-Za-z0-9<>]*", t)]
    if header != "code":
        return ticked
    codes: list[str] = []
    for lo, hi in _RANGE.findall(cell):
        codes += [f"Xid{n}" for n in range(int(lo), int(hi) + 1)]
    cell_wo_ranges = _RANGE.sub("", cell)
    codes += [f"Xid{n}" for n in re.findall(r"(?<![\w`])(\d+)(?![\w`])", cell_wo_ranges)]
    if cell.strip() == "other":
        codes.append("Xid<other>")
    return codes + ticked


def extract(markdown: str) -> dict[str, Any]:
    """The runbook's reasons, sections and confidence levels (see the module docstring)."""
    entries: list[dict[str, Any]] = []
    sections: dict[str, dict[str, str]] = {}
    confidence: dict[str, str] = {}
    title, anchor, prose = "", "", []
    header: list[str] | None = None

    def close_section() -> None:
        if anchor:
            text = "\n".join(prose).strip()
            sections[anchor] = {"title": title, "text": text}

    for line in markdown.splitlines():
        m = re.match(r"(#{2,3})\s+(.*)", line)
        if m:
            close_section()
            title, anchor, prose, header = m.group(2).strip(), slug(m.group(2)), [], None
            continue
        if not line.startswith("|"):
            header = None
            prose.append(line)
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        row = dict(zip(header, cells, strict=False))
        if anchor == "how-sure-is-a-finding" and header[0] == "confidence":
            confidence[cells[0].strip("*")] = row.get("what it rests on", "")
            continue
        if header[0] not in ("reason", "code"):
            continue
        for reason in _reasons(cells[0], header[0]):
            entries.append({"reason": reason, "row": cells[0], "section": anchor, "title": title,
                            "status": row.get("status", row.get("status, action", "")),
                            "meaning": row.get("meaning", ""),
                            "how_sure": row.get("how sure", ""),
                            "what_to_do": row.get("what to do", "")})
    close_section()
    return {"source": "docs/runbook.md", "entries": entries, "sections": sections,
            "confidence": confidence}


def render_json(markdown: str) -> str:
    """The packaged file's text for ``markdown`` (stable, so drift shows as a diff)."""
    return json.dumps(extract(markdown), indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def load() -> dict[str, Any]:
    """The packaged extract."""
    return json.loads(PACKAGED.read_text(encoding="utf-8"))
