"""The ``Profile`` value: one SKU's expectations, immutable, as every check reads them.

Checks never hard-code a threshold: they ask ``Context.setting(check, key)``, which consults the
config first and then ``Profile.check_setting``. Checks never branch on "am I simulated": the
``simulation`` block carries the CPU-calibrated numbers and ``for_simulation()`` merges it over
the profile. Overrides (the config's ``profile_overrides``) return a new, re-validated profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpu_monitor.profiles.nested import deep_merge, dig, freeze, thaw
from gpu_monitor.profiles.profile_schema import ProfileError, validate_profile
from gpu_monitor.profiles.schema import short_repr
from gpu_monitor.profiles.settings import check_sections, setting_spec


@dataclass(frozen=True, eq=False)
class Profile:
    """An immutable profile. ``load_profile`` validates; constructing one directly from a
    dict (tests) freezes the data but does not validate it."""

    data: Mapping[str, Any]
    source: str = ""
    simulated: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.data, MappingProxyType):
            object.__setattr__(self, "data", freeze(self.data))

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def description(self) -> str:
        return str(self.data.get("description") or "")

    @property
    def expected_gpus(self) -> int:
        return int(self.data["gpu"]["count"])

    def get(self, dotted: str, default: Any = None) -> Any:
        """``profile.get("pcie.gen")``; a missing key or an explicit null gives ``default``."""
        value = dig(self.data, dotted)
        return default if value is None else value

    def check_setting(self, check: str, key: str) -> Any:
        """``checks.<check>.<key>``, else the key in the check's hardware section(s)
        (``Check.sections``), else the profile-wide ``warning_band``; None when unset.
        ``UndeclaredSetting`` when ``key`` is not declared for ``check``."""
        setting_spec(check, key)
        block = dig(self.data, f"checks.{check}")
        if isinstance(block, Mapping) and block.get(key) is not None:
            return block[key]
        for section in check_sections(check):
            value = dig(self.data, f"{section}.{key}")
            if value is not None:
                return value
        if key == "warning_band":
            return self.data.get("warning_band")
        return None

    def with_overrides(self, overrides: Mapping[str, Any], source: str | None = None) -> Profile:
        """A new profile with ``overrides`` deep-merged in and the result re-validated."""
        if not overrides:
            return self
        label = source or f"profile {self.name} (with overrides)"
        if not isinstance(overrides, Mapping):
            raise ProfileError(label, [("", f"overrides must be a mapping, got {short_repr(overrides)}")])
        merged = deep_merge(self.data, overrides)
        return Profile(validate_profile(merged, label), self.source, self.simulated)

    def for_simulation(self) -> Profile:
        """The profile with its ``simulation`` block merged in (idempotent)."""
        if self.simulated:
            return self
        sim = self.data.get("simulation") or {}
        merged = deep_merge(self.data, sim)
        return Profile(validate_profile(merged, f"profile {self.name} (simulation)"),
                       self.source, simulated=True)

    def to_dict(self) -> dict[str, Any]:
        return thaw(self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        return self.simulated == other.simulated and thaw(self.data) == thaw(other.data)

    def __hash__(self) -> int:
        return hash((self.name, self.simulated))

    def __repr__(self) -> str:
        sim = ", simulated" if self.simulated else ""
        return f"Profile({self.name!r}, {self.expected_gpus} GPUs{sim})"
