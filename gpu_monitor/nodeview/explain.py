"""``gpu-monitor explain REASON``: what a reason means, how sure it is, what to do.

Why it exists: a reason token (``NvLinkDown``, ``Xid79``, ``PortDowntimeExceeded``) is what an
operator sees in a NodeCondition, an Event, an alert or ``gpu-monitor status``; the runbook
explains it, but the runbook is not at hand inside a pod. This answers from the packaged
extract of the runbook (runbook.py), so the two say the same thing.

Lookup order: the runbook's table rows for the reason (one per check that declares it; a
``check/Reason`` argument keeps that check's), else the ``###`` sections whose prose names it
in backticks, else, for ``Xid<n>``, the xid section and its catalog row for other codes; an
``SXid<n>`` is answered by the nvswitch rows for ``SXid<code>``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["explain", "known_reasons"]

_RUNBOOK_URL = "docs/runbook.md"
# How sure, where a row does not say: by the status the reason comes with (the runbook's
# "How sure is a finding?" levels).
_LEVEL_BY_STATUS = (("unknown", "undecided"), ("degraded", "signal"))


def _how_sure_paragraph(text: str) -> str:
    m = re.search(r"\*\*How sure\*\*:?\s*(.*?)(?:\n\n|$)", text, re.S)
    return " ".join(m.group(1).split()) if m else ""


def _how_sure(entry: Mapping[str, Any], section: Mapping[str, str] | None,
              confidence: Mapping[str, str]) -> str:
    if entry.get("how_sure"):
        return str(entry["how_sure"])
    para = _how_sure_paragraph(section["text"]) if section else ""
    if para:
        return para
    # A section that names one level in bold ("a hardware fault -- **certain**") says it.
    levels = [lv for lv in confidence if section and f"**{lv}**" in section["text"]]
    if len(levels) == 1 and str(entry.get("status", "")).startswith("failed"):
        return f"{levels[0]}: {confidence[levels[0]]}"
    status = str(entry.get("status", ""))
    if status.startswith("skipped") or status.startswith("ok"):
        return "not a problem: nothing to be sure of"
    for word, level in _LEVEL_BY_STATUS:
        if status.startswith(word):
            return f"{level}: {confidence.get(level, '')}".rstrip(": ")
    return "see the section"


def known_reasons(data: Mapping[str, Any]) -> set[str]:
    return {e["reason"] for e in data["entries"]}


def _with_check(reason: str) -> tuple[str | None, str]:
    check, sep, rest = reason.partition("/")
    return (check, rest) if sep else (None, reason)


def explain(data: Mapping[str, Any], argument: str) -> dict[str, Any]:
    """The answer for ``argument`` (``Reason`` or ``check/Reason``): ``found`` False with
    ``close`` matches when the runbook does not know it."""
    check, reason = _with_check(argument.strip())
    sections = data["sections"]
    # A numbered SXid is explained by the runbook's `SXid<code>` rows (fatal and non-fatal).
    wanted = {reason}
    if re.fullmatch(r"SXid\d+", reason):
        wanted.add("SXid<code>")
    answers = []
    for e in data["entries"]:
        if e["reason"] not in wanted or (check and e["section"] != check):
            continue
        sec = sections.get(e["section"])
        answers.append({"check": e["section"] if e["section"] != "checks-and-reasons"
                        else None, "row": e["row"].replace("`", ""),
                        "status": e["status"], "meaning": e["meaning"],
                        "how_sure": _how_sure(e, sec, data["confidence"]),
                        "what_to_do": e["what_to_do"],
                        "runbook": f"{_RUNBOOK_URL}#{e['section']}"})
    if not answers:
        needle = f"`{reason}`"
        for anchor, sec in sections.items():
            if needle in sec["text"] and (not check or anchor == check):
                answers.append({"check": anchor, "status": "", "meaning": sec["text"],
                                "how_sure": _how_sure_paragraph(sec["text"]) or "see the text",
                                "what_to_do": "", "runbook": f"{_RUNBOOK_URL}#{anchor}"})
    if not answers and re.fullmatch(r"Xid\d+", reason) and "xid" in sections:
        other = [e for e in data["entries"] if e["reason"] == "Xid<other>"]
        row = other[0] if other else {"status": "", "meaning": "", "what_to_do": ""}
        answers.append({"check": "xid", "status": row["status"],
                        "meaning": f"{reason} is not in the runbook's table; "
                                   f"{row['meaning']}. " + sections["xid"]["text"],
                        "how_sure": "see the text", "what_to_do": row["what_to_do"],
                        "runbook": f"{_RUNBOOK_URL}#xid"})
    if answers:
        return {"reason": reason, "found": True, "answers": answers}
    close = difflib.get_close_matches(reason, sorted(known_reasons(data)), n=5, cutoff=0.6)
    return {"reason": reason, "found": False, "answers": [], "close": close}
