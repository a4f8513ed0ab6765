"""The schema of a profile file, and the validation every profile passes before it is used.

A profile that loads is valid: every key is declared (type, range, required), unknown keys are
rejected with a "did you mean", the error names the field path (``profile h100-sxm-8:
nvlink.links_per_gpu: expected a non-negative integer, got 'x'``), and ordered pairs (a
degraded threshold below its failed one) hold, also after the ``simulation`` block is merged
in. Overrides and the ``simulation`` block are validated the same way.

A profile file lists only what differs from the checks' declared defaults; a validated profile
holds them all (``with_declared_defaults``), so every consumer reads one complete value.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpu_monitor.profiles.nested import deep_merge, dig
from gpu_monitor.profiles.schema import (
    FRACTION,
    Any_,
    Int,
    List,
    Map,
    Partial,
    Problems,
    SchemaError,
    Spec,
    Str,
    is_number,
    schema_paths,
    validate,
)
from gpu_monitor.profiles.sections import ORDERED_KEYS, SECTIONS
from gpu_monitor.profiles.settings import (
    check_block_spec,
    check_settings,
    ordered_settings,
    setting_defaults,
)

SCHEMA_VERSION = 1


class ProfileError(SchemaError):
    """A profile that cannot be found, parsed or validated."""


@functools.cache
def profile_schema() -> Map:
    """The schema of a profile file: the hardware sections, and a ``checks`` block per known
    check holding that check's declared settings (composed from the declarations on first use).
    Unknown check names are plugin settings (free-form), unless they look like a typo of a known
    check, which is an error ("burnin" -> "burn_in")."""
    checks = Map(
        {name: check_block_spec(name) for name in check_settings()},
        extra=Map({}, extra=Any_(), doc="a mapping of plugin check settings"),
        typo_cutoff=0.8,
        doc="a mapping of check name -> settings",
    )
    body: dict[str, Spec] = {
        "description": Str(what="a string"),
        **SECTIONS,
        "warning_band": FRACTION,
        "checks": checks,
    }
    return Map({
        "schema": Int(SCHEMA_VERSION, SCHEMA_VERSION),
        "name": Str(pattern=r"[a-z0-9][a-z0-9._\-]*",
                    what="a lower-case name of letters, digits, '.', '_' and '-'"),
        "match": List(Str()),
        "match_exclude": List(Str()),
        **body,
        # What changes when the host is the simulated node: the same sections, all optional.
        "simulation": Partial(Map(dict(body), doc="a mapping of profile sections")),
    }, required=frozenset({"schema", "name", "match", "gpu", "nvlink", "pcie", "rdma", "nccl",
                           "dcgm", "warning_band"}), doc="a mapping")


def profile_keys() -> list[str]:
    """Every declared profile key path (``checks.<check>.<key>`` included)."""
    return schema_paths(profile_schema())


def with_declared_defaults(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every known check's declared defaults under ``checks.<name>`` where the
    profile does not set the key: a profile file lists only what differs from the defaults,
    the loaded profile holds every value a check reads."""
    checks = dict(data.get("checks") or {})
    for name in check_settings():
        checks[name] = {**setting_defaults(name), **(checks.get(name) or {})}
    return {**data, "checks": checks}


def _cross_checks(data: Mapping[str, Any]) -> Problems:
    problems: Problems = []
    for a, b in (*ORDERED_KEYS, *ordered_settings()):
        va, vb = dig(data, a), dig(data, b)
        if is_number(va) and is_number(vb) and va > vb:
            problems.append((a, f"{va} is above {b} ({vb})"))
    return problems


def validate_profile(data: Any, source: str) -> dict[str, Any]:
    """``data`` (parsed YAML) as a valid profile's plain data; ``ProfileError`` naming every
    problem otherwise."""
    if data is None:
        raise ProfileError(source, [("", "empty profile")])
    if isinstance(data, Mapping) and "schema" in data and data["schema"] != SCHEMA_VERSION:
        raise ProfileError(source, [("schema", f"unsupported schema version {data['schema']!r} "
                                               f"(this gpu-monitor reads {SCHEMA_VERSION})")])
    out, problems = validate(profile_schema(), data)
    if not problems:
        out = with_declared_defaults(out)
        problems += _cross_checks(out)
        sim = out.get("simulation")
        if sim:
            merged = deep_merge(out, sim)
            problems += [(p, m + " (after merging the simulation block)")
                         for p, m in _cross_checks(merged)]
    if problems:
        raise ProfileError(source, problems)
    return out
