"""The schema library's number domains (profiles/schema.py)."""

from __future__ import annotations

import pytest

from gpu_monitor.profiles.schema import MAX_SECONDS, SECONDS, SECONDS0, Int, Num, validate


@pytest.mark.parametrize(("spec", "value", "ok"), [
    (Int(0), 2**63 - 1, True),
    (Int(0), 2**63, False),
    (Int(), -(2**63), False),
    (Int(0), True, False),
    (Num(0), 2**63, False),
    (Num(0), float("nan"), False),
    (Num(0), float("inf"), False),
    (Num(0), False, False),
    (SECONDS, MAX_SECONDS, True),
    (SECONDS, MAX_SECONDS + 1, False),
    (SECONDS, 0, False),
    (SECONDS0, 0, True),
    (SECONDS0, -1, False),
    (SECONDS, "30", False),
], ids=["int64-max", "past-int64", "past-int64-negative", "bool-as-int", "num-past-int64",
        "nan", "inf", "bool-as-num", "seconds-at-max", "seconds-past-max", "seconds-zero",
        "seconds0-zero", "seconds0-negative", "seconds-as-string"])
def test_number_domains(spec, value, ok):
    _, problems = validate(spec, value, path="x")
    assert (not problems) is ok, problems
