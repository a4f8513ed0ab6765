"""How a ``Report`` is printed: a table for a person, JSON for a program.

``gpu-monitor bootstrap``, ``check`` and ``daemon --once`` all end by printing their report
the same way; the JSON form is the public schema (docs/report-schema.md, ``Report.to_dict``).
The table lists each check once with its worst status, counts its targets, and spells out every
result that is not ``ok``.
"""

from __future__ import annotations

import json

from gpu_monitor import __version__
from gpu_monitor.model import STATUS_SEVERITY, Report, Status

_MARK = {Status.OK: "ok", Status.DEGRADED: "DEGRADED", Status.FAILED: "FAILED",
         Status.UNKNOWN: "UNKNOWN", Status.SKIPPED: "skipped"}


# How a check's targets are counted in the table: healthy first, then not applicable, then the
# problems from least to most severe ("14 ok, 2 skipped, 1 failed").
_COUNT_ORDER = (Status.OK, Status.SKIPPED, Status.DEGRADED, Status.UNKNOWN, Status.FAILED)


def _counts(results) -> str:
    n = {s: 0 for s in _COUNT_ORDER}
    for r in results:
        n[r.status] += 1
    return ", ".join(f"{n[s]} {s.value}" for s in _COUNT_ORDER if n[s])


def render_table(report: Report) -> str:
    lines = [f"gpu-monitor {__version__}  node {report.node}  profile {report.profile}"]
    by_check: dict[str, list] = {}
    for r in report.results:
        by_check.setdefault(r.check, []).append(r)
    for check, results in by_check.items():
        worst = max(results, key=lambda r: STATUS_SEVERITY[r.status]).status
        oks = [r for r in results if r.status is Status.OK]
        head = f"{_MARK[worst]:<9} {check}"
        if oks and len(oks) == len(results):
            msg = oks[0].message if len(oks) == 1 else f"{len(oks)} targets ok"
            lines.append(f"{head:<32} {msg}")
            continue
        lines.append(f"{head:<32} {_counts(results)}")
        for r in results:
            if r.status is Status.OK:
                continue
            lines.append(f"  {_MARK[r.status]:<9} {r.target:<22} {r.reason:<22} {r.message}")
    lines.append(f"verdict: {report.verdict.value} "
                 f"({len(report.results)} results, "
                 f"{(report.finished_at - report.started_at).total_seconds():.1f} s)")
    return "\n".join(lines)


def emit(report: Report, output: str) -> None:
    """Print ``report`` as ``output`` says: ``json`` (the schema) or ``table``."""
    if output == "json":
        print(json.dumps(report.to_dict(), indent=2, sort_keys=False))
    else:
        print(render_table(report))
