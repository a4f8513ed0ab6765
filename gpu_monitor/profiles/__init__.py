"""Per-SKU expectations: what a healthy node of a given GPU model looks like, as data.

A profile is a YAML file (shipped ones live beside this package) holding hardware facts (GPU
count and model, NVLink links, PCIe generation, RDMA ports), per-SKU floors from public
sources (Azure HPC health checks, DCGM diag-skus, NVIDIA specifications) and per-check
thresholds. The package is cut by what each part owns:

- ``schema``: the schema library (``Spec`` and its kinds, ``validate``, ``SchemaError``), shared
  with ``gpu_monitor.config``: one validator, one error format for both files;
- ``yaml_reader``: bytes to text to YAML, refusing what would hurt (``read_text``,
  ``read_yaml``);
- ``sections``: the hardware sections' schema (``gpu``, ``nvlink``, ``pcie``, ...);
- ``settings``: which settings each check may read, gathered from the checks' declarations
  (``Check.settings``, ``Check.sections``; ``declared_settings``);
- ``profile_schema``: the whole profile's schema and ``validate_profile``;
- ``nested``: the immutable nested data a profile holds;
- ``profile``: the ``Profile`` value; ``loader``: ``load_profile``, ``match_profile``.

Guarantees, in order of importance:

1. A profile that loads is valid (``profile_schema``); overrides and the ``simulation`` block
   are validated the same way.
2. A ``Profile`` is an immutable value: ``.data`` is a read-only nested mapping; overrides
   return a new profile.
3. Checks never branch on "am I simulated": the ``simulation`` block carries the
   CPU-calibrated numbers and ``for_simulation()`` merges it over the profile.
4. Every setting a check reads is declared with its type and domain (one ``Spec`` per key,
   ``declared_settings``), so a value that loads is a value the check can use; reading an
   undeclared key raises ``UndeclaredSetting`` (a programming error, not a default).
5. Reading a file never escapes as anything but ``SchemaError`` (``yaml_reader``).
"""

from gpu_monitor.profiles.loader import list_profiles, load_profile, match_profile
from gpu_monitor.profiles.profile import Profile
from gpu_monitor.profiles.profile_schema import (
    ProfileError,
    profile_keys,
    profile_schema,
    validate_profile,
)
from gpu_monitor.profiles.schema import SchemaError
from gpu_monitor.profiles.settings import (
    COMMON_CHECK_KEYS,
    UndeclaredSetting,
    check_sections,
    check_settings,
    declared_settings,
    known_checks,
    setting_spec,
)

__all__ = [
    "COMMON_CHECK_KEYS",
    "Profile",
    "ProfileError",
    "SchemaError",
    "UndeclaredSetting",
    "check_sections",
    "check_settings",
    "declared_settings",
    "list_profiles",
    "load_profile",
    "match_profile",
    "known_checks",
    "profile_keys",
    "profile_schema",
    "setting_spec",
    "validate_profile",
]
