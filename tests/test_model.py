import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.model import (
    Action,
    Report,
    Result,
    Status,
    Verdict,
    canonical_pci,
    freeze,
    iso,
    thaw,
    verdict_of,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "raw, want",
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML busId
        ("PCI:0000:3b:00", "0000:3b:00.0"),  # kernel log Xid line
        ("0000:03:00", "0000:03:00.0"),  # old Xid form without PCI:
        ("0018:01:00.1", "0018:01:00.1"),  # GB200 domains
        ("3b:00.0", "0000:3b:00.0"),
        (" 00000008:01:00.0 ", "0008:01:00.0"),
    ],
    ids=["nvml", "kmsg", "old-xid", "gb200-domain", "no-domain", "padded"],
)
def test_canonical_pci_normalises_every_source_form(raw, want):
    assert canonical_pci(raw) == want


@pytest.mark.parametrize("bad", ["", "gpu0", "0000:zz:00.0", "100000000:3b:00.0", "3b"])
def test_canonical_pci_rejects_non_addresses(bad):
    with pytest.raises(ValueError):
        canonical_pci(bad)


def test_result_rejects_non_camelcase_reason():
    with pytest.raises(ValueError, match="CamelCase"):
        Result(check="x", status=Status.OK, reason="xid_79", observed_at=T0)


def test_result_rejects_naive_timestamp():
    with pytest.raises(ValueError, match="timezone"):
        Result(check="x", status=Status.OK, observed_at=datetime(2026, 1, 1))


def test_result_details_are_frozen_and_round_trip():
    r = Result(check="ecc_memory", status="failed", target="gpu:2", reason="RowRemapPending",
               details={"banks": [1, 2], "nested": {"a": 1}}, action="reset_gpu",
               observed_at=T0)
    with pytest.raises(TypeError):
        r.details["banks"] = 3  # type: ignore[index]
    again = Result.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r
    assert again.status is Status.FAILED and again.action is Action.RESET_GPU


def test_result_details_get_text_keys_and_lose_nan_on_the_way_to_json():
    r = Result(check="pcie", status="ok", details={3: {"gbps": float("nan")}, "rows": (1, 2)},
               observed_at=T0)
    assert list(r.details) == ["3", "rows"]
    assert r.to_dict()["details"] == {"3": {"gbps": None}, "rows": [1, 2]}


def test_freeze_and_thaw_keep_keys_and_values_as_they_are_unless_asked():
    value = {1: [{"x": float("inf")}, 2], "nan": float("nan")}
    frozen = freeze(value)
    assert list(frozen) == [1, "nan"] and frozen[1] == ({"x": float("inf")}, 2)
    with pytest.raises(TypeError):
        frozen[1][0]["x"] = 0  # type: ignore[index]
    back = thaw(frozen)
    assert back[1] == [{"x": float("inf")}, 2] and back["nan"] != back["nan"]  # still NaN
    assert thaw(frozen, json_safe=True)["nan"] is None


def _freeze_reference(value, *, str_keys=False):
    """freeze as it was before its scalar fast path: the ABC checks for every value."""
    if isinstance(value, Mapping):
        return MappingProxyType({(str(k) if str_keys else k): _freeze_reference(
            v, str_keys=str_keys) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze_reference(v, str_keys=str_keys) for v in value)
    return value


def _thaw_reference(value, *, json_safe=False):
    if isinstance(value, Mapping):
        return {k: _thaw_reference(v, json_safe=json_safe) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw_reference(v, json_safe=json_safe) for v in value]
    if json_safe and isinstance(value, float) and value != value:
        return None
    return value


class _Text(str):
    pass


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                  st.sampled_from([Status.OK, Action.RESET_GPU, _Text("t"), 3.5j, b"b"]))
_NESTED = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), inner, max_size=4)),
    max_leaves=20)


def _same(a, b) -> bool:
    """Equal, type for type, with NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)


@settings(deadline=None, derandomize=True, max_examples=300)
@given(_NESTED, st.booleans())
def test_freeze_and_thaw_give_what_the_full_type_checks_gave(value, flag):
    assert _same(freeze(value, str_keys=flag), _freeze_reference(value, str_keys=flag))
    frozen = _freeze_reference(value)
    assert _same(thaw(frozen, json_safe=flag), _thaw_reference(frozen, json_safe=flag))


def test_iso_is_utc_with_z_suffix():
    assert iso(T0) == "2026-03-01T12:00:00Z"
    assert iso(T0 + timedelta(microseconds=5)) == "2026-03-01T12:00:00.000005Z"


@pytest.mark.parametrize(
    "statuses, verdict",
    [
        (["ok", "degraded", "skipped"], Verdict.HEALTHY),
        (["ok", "unknown"], Verdict.UNKNOWN),
        (["unknown", "failed"], Verdict.UNHEALTHY),
        ([], Verdict.HEALTHY),
    ],
)
def test_verdict_rules(statuses, verdict):
    results = [Result(check="c", status=s, observed_at=T0) for s in statuses]
    assert verdict_of(results) is verdict


def test_report_json_contract_fields_and_exit_code():
    r = Report(node="n1", profile="h100-sxm-8", started_at=T0, finished_at=T0,
               results=(Result(check="inventory", status="failed", target="gpu:7",
                               reason="GpuMissing", observed_at=T0),))
    d = r.to_dict()
    assert list(d) == ["schema", "tool_version", "node", "profile", "started_at",
                       "finished_at", "verdict", "results"]
    assert d["schema"] == 1 and d["verdict"] == "unhealthy"
    assert list(d["results"][0]) == ["check", "status", "target", "reason", "message",
                                     "details", "action", "observed_at"]
    assert r.exit_code == 1
    assert Report.from_dict(d).results == r.results


def test_worst_finding_is_the_most_serious_then_the_checks_priority():
    from gpu_monitor.check import Finding, worst

    prio = ("Mismatch", "Slow", "Hot")
    hot, slow = Finding(Status.FAILED, "Hot", "h"), Finding(Status.FAILED, "Slow", "s")
    mismatch, odd = Finding(Status.FAILED, "Mismatch", "m"), Finding(Status.FAILED, "Other", "o")
    unknown = Finding(Status.UNKNOWN, "Mismatch", "u")
    assert worst([hot, unknown, mismatch, slow], prio) is mismatch  # failed beats unknown
    assert worst([hot, slow], prio) is slow
    assert worst([odd, hot], prio) is hot  # a reason the priority does not name comes last
    assert worst([unknown, Finding(Status.DEGRADED, "Mismatch", "d")], prio) is unknown
    assert worst([], prio) is None
