"""Which settings each check may read, with their types: one ``Spec`` per key.

A check reads its thresholds through ``Context.setting(check, key)``; the key must be declared
for that check, or the read raises ``UndeclaredSetting`` (a programming error, not a default),
because no file could ever set an undeclared key and its value would never have been
type-checked. A check's declared settings are the keys every check block may hold
(``COMMON_CHECK_KEYS``), its own keys and the keys of the hardware sections it is judged
against (its own win).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpu_monitor.profiles.schema import (
    BYTES,
    COUNT,
    FRACTION,
    POSITIVE,
    POSITIVE_INT,
    SECONDS,
    SECONDS0,
    Any_,
    Bool,
    Int,
    List,
    Map,
    Nullable,
    Num,
    Spec,
    Str,
    suggest,
)
from gpu_monitor.profiles.sections import DTYPE, DTYPES, SECTIONS


class UndeclaredSetting(LookupError):
    """A check asked for a setting its declaration does not list: a programming error.

    Not a ``ValueError``: no file caused it, so it must not read as a configuration error."""

    def __init__(self, check: str, key: str, declared: Iterable[str]):
        self.check, self.key = check, key
        hint = suggest(key, declared)
        super().__init__(f"check {check!r} reads setting {key!r}, which is not declared "
                         f"(declare it in gpu_monitor/profiles CHECK_SETTINGS)"
                         + (f"; did you mean {hint!r}?" if hint else ""))


# Keys every check block may hold.
COMMON_CHECK_KEYS: dict[str, Spec] = {
    "interval_s": SECONDS,
    "timeout_s": SECONDS,
    "warning_band": FRACTION,
    # Whether a bootstrap must run the check (over its declaration, Check.required): a SKU
    # without DCGM support says ``checks.dcgm_diag.required: false``.
    "required": Bool(),
}

# Per-check settings (profile ``checks.<name>.<key>``), one ``Spec`` per key: the type and
# domain a check may rely on. docs/configuration.md lists each one; a test scans every
# ``ctx.setting(...)`` call in the code and holds this table complete.
CHECK_SETTINGS: dict[str, dict[str, Spec]] = {
    "inventory": {
        "boot_grace_s": SECONDS0,
    },
    "burn_in": {
        "duration_s": SECONDS,
        "min_fraction_of_peak": Num(0, 1, lo_open=True),
        "median_tolerance": Num(0, 1, hi_open=True),
        "dtypes": List(DTYPE, min_len=1),
        "matrix_size": Int(16),
        "max_temp_celsius": POSITIVE,
        "reference_block": Int(1),
        "reference_interval_s": SECONDS,
        "reference_tolerance": Map({d: POSITIVE for d in DTYPES}, doc="a mapping dtype -> tolerance"),
    },
    "nvlink_peer": {
        "copy_bytes": BYTES,
        "repeats": POSITIVE_INT,
        "error_increase_degraded": POSITIVE_INT,
        "error_increase_failed": POSITIVE_INT,
    },
    "nccl_allreduce": {
        "iterations": POSITIVE_INT,
        "warmup_iterations": COUNT,
    },
    "ecc_memory": {
        "remap_low_banks_degraded": POSITIVE_INT,
        "remap_low_banks_failed": POSITIVE_INT,
        "remap_none_banks_degraded": POSITIVE_INT,
        "remap_none_banks_failed": POSITIVE_INT,
        "corrected_total_degraded": POSITIVE_INT,
        "corrected_total_failed": POSITIVE_INT,
        "retired_pages_limit": COUNT,
    },
    "pcie": {
        "copy_bytes": BYTES,
        "repeats": POSITIVE_INT,
        "replay_increase_degraded": POSITIVE_INT,
        "copy_timeout_s": SECONDS,
    },
    "rdma_loopback": {
        "use_cuda": Bool(),
        "iterations": POSITIVE_INT,
        "tcp_port_base": Int(1024, 65535),
        "gid_index": Nullable(COUNT),
        "run_timeout_s": SECONDS,
        "server_start_s": SECONDS,
        "connect_retries": COUNT,
        "server_exit_s": SECONDS,
    },
    "dcgm_diag": {
        "host": Nullable(Str(what="a DCGM host engine address such as 'localhost:5555'")),
        "parameters": Nullable(Str(what="dcgmi diag -p parameters")),
    },
    "sdc_probe": {
        "seed": COUNT,
        "batch_size": POSITIVE_INT,
        "hidden_size": POSITIVE_INT,
        "layers": POSITIVE_INT,
        "reference_path": Nullable(Str(what="a file path")),
    },
    "xid": {
        "app_xid_repeat_count": POSITIVE_INT,
        "app_xid_window_s": SECONDS,
        "app_xid_dedup_s": SECONDS0,
        "replace_after_resets": POSITIVE_INT,
        "replay_max_age_s": SECONDS,
    },
    "nvswitch": {
        "nonfatal_window_s": SECONDS,
    },
    "throttle": {
        "window_s": SECONDS,
        "degraded_fraction": Num(0, 1, lo_open=True),
        "failed_fraction": Num(0, 1, lo_open=True),
    },
    "nvlink_state": {
        "window_s": SECONDS,
        "error_rate_per_min_degraded": POSITIVE,
    },
    "rdma_ports": {
        "window_s": SECONDS,
        "downtime_budget_s": SECONDS,
        "downtime_warning_fraction": Num(0, 1, lo_open=True),
        "nccl_ib_timeout": Int(1, 31),
        "nccl_ib_retry_cnt": Int(0, 7),
        "boot_grace_s": SECONDS0,
    },
    "pcie_aer": {
        "window_s": SECONDS,
        "correctable_per_min_degraded": POSITIVE,
        "boot_grace_s": SECONDS0,
    },
    "temperature": {
        "gradient_limit_celsius": POSITIVE,
        "peer_deviation_celsius": POSITIVE,
    },
    "fabric_probe": {
        "iterations": POSITIVE_INT,
        "warmup_iterations": COUNT,
    },
}
KNOWN_CHECKS = frozenset(CHECK_SETTINGS)

# Where ``check_setting`` looks after ``checks.<check>``: the hardware sections the check is
# judged against, so ``ctx.setting("nccl_allreduce", "allreduce_busbw_floor_gb_per_s")`` works
# and a config ``checks.nccl_allreduce`` entry can override a section value for one check.
CHECK_SECTIONS: dict[str, tuple[str, ...]] = {
    "inventory": ("gpu",),
    "burn_in": ("gpu",),
    "temperature": ("gpu",),
    "nvlink_peer": ("nvlink",),
    "nvlink_state": ("nvlink",),
    "nvswitch": ("nvlink",),
    "pcie": ("pcie",),
    "pcie_aer": ("pcie",),
    "rdma_loopback": ("rdma",),
    "rdma_ports": ("rdma",),
    "nccl_allreduce": ("nccl",),
    "fabric_probe": ("fabric", "nccl"),
    "dcgm_diag": ("dcgm",),
}


def check_block_spec(check: str, extra: Spec | None = None) -> Map:
    """The schema of one ``checks.<check>`` block (``extra`` admits unknown keys)."""
    return Map({**COMMON_CHECK_KEYS, **CHECK_SETTINGS.get(check, {})}, extra=extra,
               doc=f"a mapping of {check} settings")


def declared_settings(check: str) -> Mapping[str, Spec] | None:
    """Every setting ``check`` may read, with its Spec: the common keys, its own
    ``CHECK_SETTINGS`` and the keys of its ``CHECK_SECTIONS`` (its own win). None for a check
    the schema does not know (a plugin: its settings are free-form)."""
    if check not in CHECK_SETTINGS:
        return None
    out: dict[str, Spec] = {}
    for section in reversed(CHECK_SECTIONS.get(check, ())):
        out.update(SECTIONS[section].fields)
    out.update(COMMON_CHECK_KEYS)
    out.update(CHECK_SETTINGS[check])
    return out


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
