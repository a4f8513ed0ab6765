"""Which checks exist: the built-in ``checks.ALL_CHECKS`` plus third-party plugins.

A third-party package adds checks through the ``gpu_monitor.checks`` entry-point group; each
entry point names a ``Check`` subclass (or a tuple of them). A plugin that fails to load is
logged and left out, never fatal: one broken plugin must not stop node monitoring.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import entry_points

from gpu_monitor.check import Check
from gpu_monitor.model import Kind

ENTRY_POINT_GROUP = "gpu_monitor.checks"
log = logging.getLogger(__name__)


class RegistryError(ValueError):
    pass


def _plugin_checks() -> list[type[Check]]:
    found: list[type[Check]] = []
    try:
        eps = entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # noqa: BLE001
        log.error("cannot list %s entry points: %s", ENTRY_POINT_GROUP, exc)
        return found
    for ep in eps:
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001
            log.error("check plugin %s failed to load: %s", ep.name, exc)
            continue
        items = obj if isinstance(obj, (tuple, list)) else (obj,)
        for item in items:
            if isinstance(item, type) and issubclass(item, Check) and item.name:
                found.append(item)
            else:
                log.error("check plugin %s: %r is not a Check subclass with a name", ep.name, item)
    return found


def all_check_classes(plugins: bool = True) -> list[type[Check]]:
    """Built-in checks in their declared order, then plugins; names must be unique."""
    from checks import ALL_CHECKS

    classes = list(ALL_CHECKS)
    if plugins:
        names = {c.name for c in classes}
        for cls in _plugin_checks():
            if cls.name in names:
                log.error("check plugin %s duplicates a built-in check name; ignored", cls.name)
                continue
            names.add(cls.name)
            classes.append(cls)
    return classes


def problem_classes() -> dict[str, str]:
    """Check name -> the NodeCondition type its findings set, for every built-in check that
    declares one (``Check.condition``). Plugins are left out: the admission policy lists the
    condition types a node may set, so theirs share the default one."""
    return {c.name: c.condition for c in all_check_classes(plugins=False) if c.condition}


def select(classes: Iterable[type[Check]], kinds: Iterable[Kind] | None = None,
           only: Iterable[str] | None = None, skip: Iterable[str] = ()) -> list[type[Check]]:
    """Filter by kind and by ``--checks`` / ``--skip`` names (unknown names are an error)."""
    classes = list(classes)
    known = {c.name for c in classes}
    only = list(only) if only else None
    skip = list(skip)
    for name in [*(only or []), *skip]:
        if name not in known:
            raise RegistryError(
                f"unknown check {name!r}; known checks: {', '.join(sorted(known))}"
            )
    wanted = set(kinds) if kinds is not None else None
    out = []
    for cls in classes:
        if only is not None and cls.name not in only:
            continue
        if cls.name in skip:
            continue
        if wanted is not None and only is None and not (cls.kinds & wanted):
            continue
        out.append(cls)
    return out
