"""Which checks a command runs: the selection both the CLI and the daemon make.

A one-shot command, the daemon's passive loop, the provisioning gate and the retest after a
quarantine all pick checks the same way: by kind from the registry, narrowed by ``--checks`` /
``--skip``, minus what the config disables. The daemon needs this as much as the CLI does, so it
lives here, below both: the daemon never imports the CLI.

Guarantees:
1. An unknown check name (in ``--checks``, ``--skip`` or the config) is a ``UsageError``
   (exit 2) naming the known checks, never a silent no-op.
2. A check named with ``--checks`` runs whatever the config says; otherwise a check the config
   disables is left out -- except by a bootstrap, which reports what it did not run
   (``bootstrap_suite``: the runner turns each into one ``skipped`` ``DisabledByConfig``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_monitor.check import Check
from gpu_monitor.config import Config
from gpu_monitor.model import Kind, UsageError
from gpu_monitor.registry import RegistryError, all_check_classes, select

# What a bootstrap's report names as the reason for a check left out with ``--skip``.
SKIP_FLAG = "--skip"


def select_checks(config: Config, kinds: Iterable[Kind] | None, only=None, skip=(),
                  keep_disabled: bool = False) -> list[Check]:
    """The checks to run, in suite order. Checks the config disables are left out, unless
    ``keep_disabled`` (a bootstrap reports them; see ``disabled_by_config``). ``--checks``
    names run whatever the config says."""
    classes = all_check_classes()
    try:
        config.validate_checks([c.name for c in classes])
        chosen = select(classes, kinds=kinds, only=only or None, skip=skip)
    except RegistryError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not only and not keep_disabled:
        chosen = [c for c in chosen if config.check_enabled(c.name)]
    return [c() for c in chosen]


def disabled_by_config(config: Config, checks, only=None) -> dict[str, str]:
    """Check name -> the config field that disables it, for the checks given (none when the
    checks were named with ``--checks``: a named check runs)."""
    if only:
        return {}
    return {c.name: config.disabled_by(c.name) for c in checks
            if not config.check_enabled(c.name)}


def bootstrap_suite(config: Config, kinds: Iterable[Kind], only=None, skip=()):
    """(checks in suite order, the ones not to run among them and why) for a bootstrap run.

    A check left out with ``--skip`` stays in the report like one the config disables: a
    bootstrap says what it did not run, it never just leaves it out."""
    select_checks(config, kinds=kinds, only=only, skip=skip)  # names checked, as for --checks
    checks = select_checks(config, kinds=kinds, only=only, keep_disabled=True)
    disabled = disabled_by_config(config, checks, only)
    disabled.update({name: SKIP_FLAG for name in skip if name in {c.name for c in checks}})
    return checks, disabled
