"""What the built-in checks' declarations share, so that each declares only what differs.

Not a check: :class:`BuiltinCheck`, the base of every check in this package. A built-in check
is named after its module (``checks/<name>.py`` declares ``<name>``; the registry and the docs
hold them equal) and a bootstrap requires it (``required``) unless it says otherwise; a SKU's
profile or the config may still say ``checks.<name>.required: false``. Third-party checks
derive from ``gpu_monitor.check.Check`` itself, whose defaults are neither: a plugin names
itself and is not required.
"""

from __future__ import annotations

from typing import Any

from gpu_monitor.check import Check


class BuiltinCheck(Check):
    required = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        package, _, module = cls.__module__.rpartition(".")
        # A shared base (checks/_*.py) has no name; a subclass elsewhere keeps the one it
        # inherits.
        if "name" not in vars(cls) and package == "checks" and not module.startswith("_"):
            cls.name = module
