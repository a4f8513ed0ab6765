"""Which settings each check may read, composed from the checks' own declarations.

A check declares its settings on its class (``Check.settings``: one ``Setting`` per key, with
its ``Spec``, default, meaning and source) and the profile sections it is judged against
(``Check.sections``); this module only gathers them, from the registry of built-in checks and
the other things that take settings (the fabric probe), so no table here names a check.

A check reads its thresholds through ``Context.setting(check, key)``; the key must be declared
for that check, or the read raises ``UndeclaredSetting`` (a programming error, not a default),
because no file could ever set an undeclared key and its value would never have been
type-checked. A check's declared settings are the keys every check block may hold
(``COMMON_CHECK_KEYS``), its own keys and the keys of the hardware sections it is judged
against (its own win).

Composed on first use, not at import: the checks import this package's schema library, so the
package cannot import the checks while it loads (gpu_monitor/declarations.py gathers them).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from gpu_monitor.profiles.schema import FRACTION, SECONDS, Any_, Bool, Map, Spec, suggest
from gpu_monitor.profiles.sections import SECTIONS


class UndeclaredSetting(LookupError):
    """A check asked for a setting its declaration does not list: a programming error.

    Not a ``ValueError``: no file caused it, so it must not read as a configuration error."""

    def __init__(self, check: str, key: str, declared: Iterable[str]):
        self.check, self.key = check, key
        hint = suggest(key, declared)
        super().__init__(f"check {check!r} reads setting {key!r}, which is not declared "
                         f"(declare it in the check's settings)"
                         + (f"; did you mean {hint!r}?" if hint else ""))


class Declaration(Protocol):
    """What declares settings: a check class, or the fabric probe's declaration."""

    name: str
    settings: Mapping[str, Any]  # key -> gpu_monitor.check.Setting
    sections: tuple[str, ...]


# Keys every check block may hold.
COMMON_CHECK_KEYS: dict[str, Spec] = {
    "interval_s": SECONDS,
    "timeout_s": SECONDS,
    "warning_band": FRACTION,
    # Whether a bootstrap must run the check (over its declaration, Check.required): a SKU
    # without DCGM support says ``checks.dcgm_diag.required: false``.
    "required": Bool(),
}


@functools.cache
def declarations() -> Mapping[str, Declaration]:
    """Every declaration by name, in the registry's order (the bootstrap suite's): the one
    upward lookup of the layers (gpu_monitor/declarations.py says why)."""
    from gpu_monitor.declarations import setting_declarations

    return MappingProxyType({d.name: d for d in setting_declarations()})


def known_checks() -> frozenset[str]:
    """The names whose settings the schema knows (the built-in checks, ``fabric_probe``)."""
    return frozenset(declarations())


@functools.cache
def check_settings() -> Mapping[str, Mapping[str, Spec]]:
    """Each known check's own settings (``checks.<name>.<key>``), one ``Spec`` per key."""
    return MappingProxyType({
        name: MappingProxyType({key: s.spec for key, s in d.settings.items()})
        for name, d in declarations().items()})


def check_sections(check: str) -> tuple[str, ...]:
    """Where ``Profile.check_setting`` looks after ``checks.<check>``: the hardware sections
    the check is judged against, so ``ctx.setting("nccl_allreduce",
    "allreduce_busbw_floor_gb_per_s")`` works and a config ``checks.nccl_allreduce`` entry can
    override a section value for one check."""
    d = declarations().get(check)
    return tuple(d.sections) if d is not None else ()


def setting_defaults(check: str) -> dict[str, Any]:
    """The declared defaults of ``check``'s own settings (keys without one are left out)."""
    d = declarations().get(check)
    if d is None:
        return {}
    return {key: s.default for key, s in d.settings.items() if s.default is not None}


def ordered_settings() -> list[tuple[str, str]]:
    """Pairs of dotted keys (``checks.throttle.degraded_fraction``,
    ``checks.throttle.failed_fraction``) whose first may not exceed the second."""
    return [(f"checks.{name}.{key}", f"checks.{name}.{s.at_most}")
            for name, d in declarations().items() for key, s in d.settings.items()
            if s.at_most]


def check_block_spec(check: str, extra: Spec | None = None) -> Map:
    """The schema of one ``checks.<check>`` block (``extra`` admits unknown keys)."""
    return Map({**COMMON_CHECK_KEYS, **check_settings().get(check, {})}, extra=extra,
               doc=f"a mapping of {check} settings")


@functools.cache
def declared_settings(check: str) -> Mapping[str, Spec] | None:
    """Every setting ``check`` may read, with its Spec: the common keys, its own settings and
    the keys of its sections (its own win). None for a check the schema does not know (a
    plugin: its settings are free-form)."""
    own = check_settings().get(check)
    if own is None:
        return None
    out: dict[str, Spec] = {}
    for section in reversed(check_sections(check)):
        out.update(SECTIONS[section].fields)
    out.update(COMMON_CHECK_KEYS)
    out.update(own)
    return MappingProxyType(out)


def setting_spec(check: str, key: str) -> Spec:
    """The Spec of ``checks.<check>.<key>``; ``UndeclaredSetting`` when a known check's
    declaration lacks ``key``. A plugin's keys are free-form (``Any_``) but for the common
    ones."""
    declared = declared_settings(check)
    if declared is None:
        return COMMON_CHECK_KEYS.get(key) or Any_()
    spec = declared.get(key)
    if spec is None:
        raise UndeclaredSetting(check, key, declared)
    return spec
