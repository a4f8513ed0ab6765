"""Everything whose settings a profile or the config may set, gathered in one place.

The profile and config schemas (``profiles/settings.py``) are composed from declarations: each
built-in check's (``Check.settings``, ``Check.sections``) and the multi-node fabric probe's,
which is a Job, not a check (``fabric/declaration.py``). Those declarations live above the
schema library they use, so the schema cannot import them while it loads: it asks this module
on first use. That lookup (``profiles.settings -> gpu_monitor.declarations``) is the one
upward import the layers allow, named in the contracts in pyproject.toml; this module sits
high enough to see the checks and the fabric alike, and nothing imports it at module level.
"""

from __future__ import annotations

from gpu_monitor.fabric.declaration import FabricProbe
from gpu_monitor.registry import all_check_classes


def setting_declarations() -> list:
    """The built-in checks in their declared order (the bootstrap suite's), then the fabric
    probe. Plugins' settings are free-form (they are not loaded to validate a file)."""
    return [*all_check_classes(plugins=False), FabricProbe]
