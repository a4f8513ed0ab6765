"""The bad-input suite's one way of running a case: in-process through ``cli.main()``.

A case garbles one input (an NVML call, a kernel-log path or line, a sysfs value, a tool's
output, a config or profile file) and says which check and target it garbled. Running it
asserts the contract of the "an `ok` must be earned" rule:

1. no traceback anywhere (stdout, stderr, logs) and no ``CheckCrashed`` result;
2. the exit code is one the case allows (1 or 3 for bad data by default; 2 for bad config);
3. for bad data: the garbled target has a result, none of its results is ``ok``, and every
   one is in the case's allowed statuses (``unknown`` or ``failed`` by default);
4. the message (or details, or the usage error) names the file, field or call.

Cases are plain data so that each class's table can be generated (every reader, every NVML
call a check makes) and read as a list of ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_monitor.cli import main

BAD_DATA_EXITS = frozenset({1, 3})
NOT_OK = frozenset({"unknown", "failed"})


@dataclass(frozen=True)
class Case:
    """One bad input. ``argv`` and ``mentions`` may hold ``{tmp}``, replaced by the test's
    temporary directory; ``setup(tmp)`` writes the garbled files there before the run."""

    id: str
    argv: tuple[str, ...]
    check: str = ""            # whose result is judged (empty for a config error)
    target: str = ""
    mentions: tuple[str, ...] = ()
    statuses: frozenset[str] = NOT_OK
    exits: frozenset[int] = BAD_DATA_EXITS
    setup: Callable[[Path], None] | None = field(default=None, compare=False)

    @property
    def is_config(self) -> bool:
        return self.exits == frozenset({2})


def config_case(id: str, argv: Iterable[str], mentions: Iterable[str],
                setup: Callable[[Path], None] | None = None) -> Case:
    return Case(id=id, argv=tuple(argv), mentions=tuple(mentions), exits=frozenset({2}),
                setup=setup)


def ids(cases: Iterable[Case]) -> list[str]:
    return [c.id for c in cases]


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def run_case(case: Case, tmp: Path, capsys, caplog) -> dict | None:
    """Run one case and assert the contract; returns the JSON report (None for exit 2)."""
    if case.setup is not None:
        case.setup(tmp)
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    mentions = [m.replace("{tmp}", str(tmp)) for m in case.mentions]
    if not case.is_config and "-o" not in argv and "--output" not in argv:
        argv += ["-o", "json"]
    rc = main(argv)
    out, err = capsys.readouterr()
    logged = "\n".join(r.getMessage() + (str(r.exc_info) if r.exc_info else "")
                       for r in caplog.records)
    everything = "\n".join((out, err, logged))
    assert "Traceback" not in everything, f"{case.id}: traceback\n{everything[-3000:]}"
    assert rc in case.exits, f"{case.id}: exit {rc}, expected {sorted(case.exits)}\n{err[-2000:]}"
    if case.is_config:
        assert "gpu-monitor: error:" in err, f"{case.id}: no usage error on stderr: {err!r}"
        for word in mentions:
            assert word in err, f"{case.id}: the error does not name {word!r}: {err!r}"
        return None
    report = json.loads(out)
    results = report["results"]
    crashed = [r for r in results if r["reason"] == "CheckCrashed"]
    assert not crashed, f"{case.id}: a check crashed: {crashed}"
    mine = [r for r in results if r["check"] == case.check and r["target"] == case.target]
    assert mine, (f"{case.id}: no {case.check} result for {case.target}; got "
                  f"{sorted({(r['check'], r['target']) for r in results})}")
    bad = [r for r in mine if r["status"] not in case.statuses]
    assert not bad, f"{case.id}: {case.target} reported {[r['status'] for r in bad]}: {bad}"
    said = _text([(r["message"], r["details"]) for r in mine])
    for word in mentions:
        assert word in said, f"{case.id}: the result does not name {word!r}: {said}"
    return report
