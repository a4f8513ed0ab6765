"""The operator's configuration file: which profile, which checks, how remediation behaves.

Profiles say what healthy hardware of a SKU looks like; the config says what *this* fleet wants:
the profile to use (``auto`` picks by NVML product name), a partial machine (``expected_gpus``),
site-specific profile corrections (``profile_overrides``, e.g. the real RDMA port names),
per-check switches and settings, and remediation's safety rails (dry-run by default).

Guarantees:

1. A config that loads is valid. Unknown keys (with a "did you mean"), wrong types,
   out-of-range numbers, malformed YAML (with its line), a file that is missing, a directory,
   not UTF-8 or over the size bounds raise ``ConfigError`` naming the file and the field path.
   ``profile_overrides`` is checked against the profile schema at load time, not when the
   profile is applied.
2. Unknown check *names* are accepted at load (checks also come from plugins) and rejected by
   ``Config.validate_checks(known_names)`` once the registry is known. A built-in check's
   block holds only its declared settings (``profiles.declared_settings``), each type-checked,
   so a check never reads a value of the wrong type; a plugin's block is free-form but for the
   common keys.
3. ``Config`` is an immutable value; every default is written once, here, and documented in
   docs/configuration.md (a test keeps the two in step).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpu_monitor.hw.paths import DEFAULT_REBOOT_SENTINEL
from gpu_monitor.profiles import (
    COMMON_CHECK_KEYS,
    Profile,
    ProfileError,
    check_settings,
    declared_settings,
    load_profile,
    match_profile,
    profile_schema,
    setting_spec,
)
from gpu_monitor.profiles.nested import freeze
from gpu_monitor.profiles.schema import (
    SECONDS,
    SECONDS0,
    Any_,
    Bool,
    Int,
    List,
    Map,
    Nullable,
    Num,
    Partial,
    SchemaError,
    Spec,
    Str,
    schema_paths,
    suggest,
    validate,
)
from gpu_monitor.profiles.yaml_reader import read_text, read_yaml

__all__ = [
    "DEFAULT_CONFIG",
    "BreakerConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "DrainConfig",
    "FailfastConfig",
    "NcclConfig",
    "RemediationConfig",
    "config_keys",
    "load_config",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_LISTEN = "0.0.0.0:9425"
DEFAULT_TAINT_KEY = "gpu-monitor.io/unhealthy"

# What ``checks.<name>.remediation`` may name: remediate.policy's Op values and "ignore" (a
# test keeps the two in step; config does not import the remediation layer).
REMEDIATION_OPS = ("event", "cordon", "drain", "reset_gpu", "reboot", "replace", "ignore")
_OP = Str(choices=REMEDIATION_OPS, lower=True)


@dataclass(frozen=True)
class _OpOrByReason(Spec):
    """``checks.<name>.remediation``: one operation for all the check's findings, or a
    mapping reason -> operation (docs/remediation.md)."""

    desc = "an operation (" + ", ".join(REMEDIATION_OPS) + ") or a mapping reason -> operation"

    def check(self, value, path, problems, partial=False):
        if isinstance(value, Mapping):
            by_reason = Map({}, extra=_OP, typo_cutoff=None, doc="a mapping reason -> operation")
            return by_reason.check(value, path, problems, partial)
        if isinstance(value, str):
            return _OP.check(value, path, problems, partial)
        return self.bad(value, path, problems)


# Keys a config ``checks.<name>`` block may hold for any check, built-in or plugin.
SWITCH_KEYS: dict[str, Spec] = {
    "enabled": Bool(),
    "observe_only": Bool(),
    "remediation": _OpOrByReason(),
}


class ConfigError(SchemaError):
    """A configuration file that cannot be read, parsed or validated (exit code 2)."""


# --- the values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonConfig:
    listen: str = DEFAULT_LISTEN  # host:port of /metrics and the HTTP API
    report_dir: str | None = None  # None: the daemon's default (see docs/configuration.md)
    kmsg_replay: bool = True  # replay the kernel ring buffer at start-up
    bootstrap_on_start: bool = True  # run the bootstrap suite until the node has a recorded pass
    bootstrap_retry_s: float = 600.0  # retry an undecided/failed bootstrap after this long
    # At start, move a damaged state file aside and start empty instead of exiting (the
    # DaemonSet would crash-loop, leaving the node unmonitored); never deletes anything.
    recover_corrupt_state: bool = True
    backend: str = "kubernetes"  # where remediation delivers: kubernetes | slurm


BACKENDS = ("kubernetes", "slurm")


@dataclass(frozen=True)
class SlurmConfig:
    """Remediation's delivery through Slurm's tools (docs/slurm.md)."""

    partitions: tuple[str, ...] = ()  # whose GPU nodes the breaker counts; (): all
    gres: str | None = "gpu"  # a GPU node's GRES name; None: every node of the partitions
    requeue_on: tuple[str, ...] = ()  # reason tokens whose drain requeues the jobs; "*": all
    command_timeout_s: float = 10.0  # each scontrol/squeue call


@dataclass(frozen=True)
class BreakerConfig:
    budget_fraction: float = 0.10  # of GPU nodes quarantined at once (DESIGN.md §7)
    max_nodes: int = 20  # absolute cap on simultaneously quarantined nodes
    cooldown_s: float = 600.0  # after the breaker trips or a storm ends
    ttl_s: float = 3600.0  # a slot not renewed for this long is abandoned


@dataclass(frozen=True)
class DrainConfig:
    timeout_s: float = 900.0  # one deadline for the whole node
    gpu_pods_only: bool = True
    delete_emptydir_data: bool = True
    force_delete: bool = False


@dataclass(frozen=True)
class RemediationConfig:
    enabled: bool = False
    dry_run: bool = True
    taint_key: str = DEFAULT_TAINT_KEY
    hysteresis_polls: int = 3
    hysteresis_s: float = 300.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    reboot_sentinel: str | None = DEFAULT_REBOOT_SENTINEL
    retest_max_failures: int = 2
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass(frozen=True)
class NcclConfig:
    """NCCL settings of the fleet's jobs; None = the profile's (NCCL 2.x defaults 18 / 7)."""

    ib_timeout: int | None = None
    ib_retry_cnt: int | None = None


@dataclass(frozen=True)
class WorkloadsConfig:
    """Attribution of devices to pods (docs/workloads.md)."""

    source: str = "auto"  # auto: the kubelet's socket when it exists, else NVML's processes
    socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    refresh_s: float = 30.0
    timeout_s: float = 2.0
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu",)  # plus every nvidia.com/mig-* resource
    rdma_resources: tuple[str, ...] = ()


WORKLOAD_SOURCES = ("auto", "kubelet", "nvml", "off")

#: What a fail-fast notice does to the workloads holding an affected GPU (docs/workloads.md).
FAILFAST_ACTIONS = ("event", "file", "signal", "delete")
FAILFAST_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGABRT", "SIGKILL")


@dataclass(frozen=True)
class FailfastConfig:
    """The fail-fast notice: tell the workloads a fabric fault has already doomed (docs/
    workloads.md#the-fail-fast-notice)."""

    enabled: bool = True
    actions: tuple[str, ...] = ("event", "file")
    dry_run: bool | None = None  # None: remediation.dry_run
    notice_dir: str = "/run/gpu-monitor/notices"
    signal: str = "SIGTERM"
    on_xid: bool = False  # also on a fatal GPU Xid (the xid check's failed class)
    max_age_s: float = 30.0  # an outage that ended longer ago than this notifies nobody
    delete_grace_s: float = 0.0  # the delete action's grace; the API takes whole seconds (ceil)


@dataclass(frozen=True)
class CleaningConfig:
    """The check between workloads: hold the node when its last GPU pod leaves, run the active
    suite, release it on a pass (docs/cleaning.md). Off by default."""

    enabled: bool = False
    budget_s: float = 1800.0  # one run of the suite; checked between checks
    retry_after_s: float = 900.0  # after an unknown run the next try; after a fail, the handoff
    max_attempts: int = 3  # unknown runs in a row before the node is given back uncleaned
    interval_s: float = 5.0  # the loop's pass: bounds the window before the hold is queued
    hold_image: str = "registry.k8s.io/pause:3.10"
    priority_class: str = "gpu-monitor-cleaning"
    namespace: str | None = None  # the hold's namespace; None: $POD_NAMESPACE, else gpu-monitor


@dataclass(frozen=True)
class Config:
    """One validated configuration. ``DEFAULT_CONFIG`` is the no-file value."""

    node_name: str = "localhost"
    profile: str = "auto"
    expected_gpus: int | None = None
    profile_overrides: Mapping[str, Any] = field(default_factory=lambda: freeze({}))
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: freeze({}))
    enabled_checks: tuple[str, ...] | None = None
    disabled_checks: tuple[str, ...] = ()
    state_path: str | None = None
    log_format: str = "text"
    log_level: str = "info"
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    workloads: WorkloadsConfig = field(default_factory=WorkloadsConfig)
    failfast: FailfastConfig = field(default_factory=FailfastConfig)
    cleaning: CleaningConfig = field(default_factory=CleaningConfig)
    source: str | None = field(default=None, compare=False)

    # --- checks ---------------------------------------------------------------------------

    def check_setting(self, check: str, key: str) -> Any:
        """``checks.<check>.<key>`` from the file, else None (the profile then decides).
        ``nccl_ib_timeout`` / ``nccl_ib_retry_cnt`` fall back to the top-level ``nccl``.
        ``UndeclaredSetting`` when ``key`` is not declared for ``check``."""
        setting_spec(check, key)
        block = self.checks.get(check)
        if block is not None and block.get(key) is not None:
            return block[key]
        if key == "nccl_ib_timeout":
            return self.nccl.ib_timeout
        if key == "nccl_ib_retry_cnt":
            return self.nccl.ib_retry_cnt
        return None

    def check_enabled(self, name: str, default: bool = True) -> bool:
        """``disabled_checks`` > ``checks.<name>.enabled`` > ``enabled_checks`` > default."""
        if name in self.disabled_checks:
            return False
        explicit = (self.checks.get(name) or {}).get("enabled")
        if explicit is not None:
            return bool(explicit)
        if self.enabled_checks is not None:
            return name in self.enabled_checks
        return default

    def disabled_by(self, name: str) -> str:
        """The field that disables check ``name`` (as ``check_enabled`` decides), for reports
        that say why a check did not run; empty when it is enabled."""
        if name in self.disabled_checks:
            return f"disabled_checks[{self.disabled_checks.index(name)}]"
        explicit = (self.checks.get(name) or {}).get("enabled")
        if explicit is not None:
            return "" if explicit else f"checks.{name}.enabled: false"
        if self.enabled_checks is not None and name not in self.enabled_checks:
            return "not in enabled_checks"
        return ""

    def check_observe_only(self, name: str) -> bool:
        """Observe-only checks are stored and exported but never drive remediation."""
        return bool((self.checks.get(name) or {}).get("observe_only", False))

    def validate_checks(self, known_names: Iterable[str]) -> None:
        """Reject check names that no built-in check or plugin declares."""
        known = sorted(set(known_names))
        problems: list[tuple[str, str]] = []
        named = [(f"checks.{n}", n) for n in self.checks]
        named += [(f"enabled_checks[{i}]", n) for i, n in enumerate(self.enabled_checks or ())]
        named += [(f"disabled_checks[{i}]", n) for i, n in enumerate(self.disabled_checks)]
        for path, name in named:
            if name not in known:
                hint = suggest(name, known)
                problems.append((path, f"unknown check {name!r}" + (
                    f" (did you mean {hint!r}?)" if hint else
                    f"; known checks: {', '.join(known)}")))
        if problems:
            raise ConfigError(self._label(), problems)

    # --- profile --------------------------------------------------------------------------

    def apply_to(self, profile: Profile) -> Profile:
        """The profile with ``profile_overrides`` and ``expected_gpus`` applied."""
        overrides: dict[str, Any] = {k: v for k, v in self.profile_overrides.items()}
        if self.expected_gpus is not None:
            gpu = dict(overrides.get("gpu") or {})
            gpu["count"] = self.expected_gpus
            overrides["gpu"] = gpu
        if not overrides:
            return profile
        try:
            return profile.with_overrides(overrides)
        except ProfileError as exc:
            problems = [(self._override_path(p), m) for p, m in exc.problems]
            raise ConfigError(f"{self._label()} (applied to profile {profile.name})",
                              problems) from None

    def resolve_profile(self, gpu_names: Sequence[str] | None = None) -> Profile:
        """The configured profile (``auto``: matched by NVML names) with this config applied."""
        if self.profile == "auto":
            found = match_profile(list(gpu_names or ()))
            if found is None:
                raise ConfigError(self._label(), [("profile", (
                    f"auto: no shipped profile matches the GPUs {sorted(set(gpu_names or ()))}; "
                    "set profile to a name or a file"))])
            return self.apply_to(found)
        try:
            return self.apply_to(load_profile(self.profile))
        except ProfileError as exc:
            raise ConfigError(self._label(), [("profile", str(exc))]) from None

    def _override_path(self, path: str) -> str:
        if path == "gpu.count" and self.expected_gpus is not None:
            return "expected_gpus"
        return f"profile_overrides.{path}" if path else "profile_overrides"

    def _label(self) -> str:
        return f"config {self.source}" if self.source else "config"


DEFAULT_CONFIG = Config()


# --- the schema ---------------------------------------------------------------------------------

def _check_block(name: str) -> Map:
    """A config ``checks.<name>`` block of a built-in check: the switches and every setting the
    check declares (its own, the common keys, its sections' keys), each typed. Nothing else:
    an undeclared key is an error (with a "did you mean"), not a value passed on untyped."""
    declared = declared_settings(name) or {}
    return Map({**SWITCH_KEYS, **declared}, doc=f"a mapping of {name} settings")


_GENERIC_CHECK = Map(dict(SWITCH_KEYS) | dict(COMMON_CHECK_KEYS), extra=Any_(), typo_cutoff=0.8,
                     doc="a mapping of check settings")


@dataclass(frozen=True)
class _Listen(Spec):
    desc = "'host:port' with a port from 1 to 65535, such as '0.0.0.0:9425'"

    def check(self, value, path, problems, partial=False):
        if not isinstance(value, str) or ":" not in value:
            return self.bad(value, path, problems)
        _, port = value.rsplit(":", 1)
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            return self.bad(value, path, problems)
        return value


# A Kubernetes taint key: optional DNS-subdomain prefix "/" name of <= 63 characters.
_TAINT_KEY = Str(pattern=r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
                         r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
                 what="a Kubernetes taint key such as 'gpu-monitor.io/unhealthy'")


# A Kubernetes extended resource name: a DNS-subdomain prefix "/" a name.
_RESOURCE_NAME = Str(pattern=r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
                     what="an extended resource name such as 'nvidia.com/gpu'")


# A Kubernetes object name (DNS subdomain): a namespace, a PriorityClass.
_K8S_NAME = Str(pattern=r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
                what="a Kubernetes object name such as 'gpu-monitor'")


# A Slurm partition or GRES name: no spaces, commas or '=' (they separate scontrol's fields).
_SLURM_NAME = Str(pattern=r"[A-Za-z0-9_.-]+", what="a Slurm name such as 'gpu'")


@functools.cache
def config_schema() -> Map:
    """The schema of the config file. Composed on first use: its ``checks`` blocks and
    ``profile_overrides`` follow the checks' declarations (``gpu_monitor.profiles.settings``)."""
    checks = Map({name: _check_block(name) for name in check_settings()},
                 extra=_GENERIC_CHECK,
                 typo_cutoff=None,  # names are checked by validate_checks(), never guessed here
                 doc="a mapping of check name -> settings")
    return Map({
        "node_name": Nullable(Str()),
        "profile": Str(what="'auto', a shipped profile name or a profile file path"),
        "expected_gpus": Nullable(Int(0)),
        "profile_overrides": Partial(profile_schema()),
        "checks": checks,
        "enabled_checks": Nullable(List(Str(what="a check name"))),
        "disabled_checks": List(Str(what="a check name")),
        "state_path": Nullable(Str(what="a file path or ':memory:'")),
        "log_format": Str(choices=LOG_FORMATS, lower=True),
        "log_level": Str(choices=LOG_LEVELS, lower=True),
        "daemon": Map({
            "listen": _Listen(),
            "report_dir": Nullable(Str(what="a directory path")),
            "kmsg_replay": Bool(),
            "bootstrap_on_start": Bool(),
            "bootstrap_retry_s": SECONDS,
            "recover_corrupt_state": Bool(),
            "backend": Str(choices=BACKENDS, lower=True),
        }),
        "remediation": Map({
            "enabled": Bool(),
            "dry_run": Bool(),
            "taint_key": _TAINT_KEY,
            "hysteresis_polls": Int(1),
            "hysteresis_s": SECONDS0,
            "breaker": Map({
                "budget_fraction": Num(0, 1, lo_open=True),
                "max_nodes": Int(1),
                "cooldown_s": SECONDS0,
                "ttl_s": SECONDS,
            }),
            "drain": Map({
                "timeout_s": SECONDS,
                "gpu_pods_only": Bool(),
                "delete_emptydir_data": Bool(),
                "force_delete": Bool(),
            }),
            "reboot_sentinel": Nullable(Str(what="a file path")),
            "retest_max_failures": Int(1),
            "slurm": Map({
                "partitions": List(_SLURM_NAME),
                "gres": Nullable(_SLURM_NAME),
                "requeue_on": List(Str(pattern=r"\*|[A-Za-z][A-Za-z0-9_.-]*",
                                       what="a reason token such as 'Xid79', or '*'")),
                "command_timeout_s": SECONDS,
            }),
        }),
        "nccl": Map({
            "ib_timeout": Nullable(Int(1, 31)),
            "ib_retry_cnt": Nullable(Int(0, 7)),
        }),
        "workloads": Map({
            "source": Str(choices=WORKLOAD_SOURCES, lower=True),
            "socket": Str(what="a unix socket path"),
            "refresh_s": SECONDS,
            "timeout_s": SECONDS,
            "gpu_resources": List(_RESOURCE_NAME),
            "rdma_resources": List(_RESOURCE_NAME),
        }),
        "failfast": Map({
            "enabled": Bool(),
            "actions": List(Str(choices=FAILFAST_ACTIONS, lower=True)),
            "dry_run": Nullable(Bool()),
            "notice_dir": Str(what="an absolute directory path", pattern=r"/.*"),
            "signal": Str(choices=FAILFAST_SIGNALS),
            "on_xid": Bool(),
            "max_age_s": SECONDS0,
            "delete_grace_s": SECONDS0,
        }),
        "cleaning": Map({
            "enabled": Bool(),
            "budget_s": SECONDS,
            "retry_after_s": SECONDS,
            "max_attempts": Int(1),
            "interval_s": SECONDS,
            "hold_image": Str(what="a container image reference", pattern=r"\S+"),
            "priority_class": _K8S_NAME,
            "namespace": Nullable(_K8S_NAME),
        }),
    }, doc="a mapping")


def config_keys() -> list[str]:
    """Every declared config key path except those under ``profile_overrides`` / ``checks``
    (which follow the profile schema and the check settings)."""
    return [p for p in schema_paths(config_schema())
            if not p.startswith(("profile_overrides.", "checks."))]


# --- loading ------------------------------------------------------------------------------------


def _build(cls: type, values: Mapping[str, Any], nested: Mapping[str, type] | None = None):
    kwargs: dict[str, Any] = {}
    names = {f.name for f in fields(cls)}
    for key, value in values.items():
        if key not in names:
            continue
        if nested and key in nested:
            value = _build(nested[key], value or {})
        kwargs[key] = value
    return cls(**kwargs)


def _cross_checks(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    enabled = data.get("enabled_checks")
    disabled = list(data.get("disabled_checks") or ())
    for i, name in enumerate(disabled):
        if enabled is not None and name in enabled:
            problems.append((f"disabled_checks[{i}]", f"{name!r} is also in enabled_checks"))
        if ((data.get("checks") or {}).get(name) or {}).get("enabled") is True:
            problems.append((f"checks.{name}.enabled",
                             f"true, but {name!r} is in disabled_checks"))
    workloads = data.get("workloads") or {}
    refresh = workloads.get("refresh_s", WorkloadsConfig.refresh_s)
    if workloads.get("timeout_s", WorkloadsConfig.timeout_s) > refresh:
        problems.append(("workloads.timeout_s", f"longer than workloads.refresh_s ({refresh:g})"))
    seen: set[str] = set()
    for i, action in enumerate((data.get("failfast") or {}).get("actions") or ()):
        if action in seen:
            problems.append((f"failfast.actions[{i}]", f"{action!r} is listed twice"))
        seen.add(action)
    cleaning = data.get("cleaning") or {}
    backend = (data.get("daemon") or {}).get("backend", DaemonConfig.backend)
    if cleaning.get("enabled") and backend == "slurm":
        problems.append(("cleaning.enabled", "true, but daemon.backend is slurm: the hold that "
                         "keeps new work off the node is a Kubernetes pod"))
    return problems


def _resolve_node_name(value: str | None, env: Mapping[str, str]) -> str:
    return value or env.get("NODE_NAME") or socket.gethostname() or "localhost"


def parse_config(data: Any, source: str | None = None,
                 env: Mapping[str, str] | None = None) -> Config:
    """Validate already-parsed YAML (a mapping, or None for an empty file) into a Config."""
    label = f"config {source}" if source else "config"
    env = os.environ if env is None else env
    if data is None:
        data = {}
    out, problems = validate(config_schema(), data)
    if not problems:
        problems = _cross_checks(out)
    if problems:
        raise ConfigError(label, problems)
    values = dict(out)
    values["node_name"] = _resolve_node_name(values.get("node_name"), env)
    for key in ("enabled_checks", "disabled_checks"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    workloads = dict(values.get("workloads") or {})
    for key in ("gpu_resources", "rdma_resources"):
        if key in workloads:
            workloads[key] = tuple(workloads[key])
    failfast = dict(values.get("failfast") or {})
    if "actions" in failfast:
        failfast["actions"] = tuple(failfast["actions"])
    for key in ("profile_overrides", "checks"):
        if key in values:
            values[key] = freeze(values[key])
    values["source"] = source
    remediation = dict(values.get("remediation") or {})
    slurm = dict(remediation.get("slurm") or {})
    for key in ("partitions", "requeue_on"):
        if key in slurm:
            slurm[key] = tuple(slurm[key])
    if "slurm" in remediation:
        remediation["slurm"] = slurm
    values["remediation"] = remediation
    remediation_nested = {"breaker": BreakerConfig, "drain": DrainConfig, "slurm": SlurmConfig}
    config = Config(**{k: v for k, v in values.items()
                       if k not in ("daemon", "remediation", "nccl", "workloads", "failfast",
                                     "cleaning")})
    return replace(config,
                   daemon=_build(DaemonConfig, values.get("daemon") or {}),
                   remediation=_build(RemediationConfig, values.get("remediation") or {},
                                      remediation_nested),
                   nccl=_build(NcclConfig, values.get("nccl") or {}),
                   workloads=_build(WorkloadsConfig, workloads),
                   failfast=_build(FailfastConfig, failfast),
                   cleaning=_build(CleaningConfig, values.get("cleaning") or {}))


def load_config(path: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None) -> Config:
    """The configuration in ``path`` (YAML), or the defaults when ``path`` is None.

    ``env`` (default ``os.environ``) supplies ``NODE_NAME`` when the file sets no node_name.
    """
    if path is None:
        return parse_config({}, None, env)
    ref = os.fspath(path)
    label = f"config {ref}"
    data = read_yaml(read_text(ref, label, ConfigError), label, ConfigError)
    return parse_config(data, ref, env)
