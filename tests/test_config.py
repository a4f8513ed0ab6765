"""The operator's config: defaults, precedence, profile application, and one error per kind of
mistake, each naming the file and the field."""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.check import Context
from gpu_monitor.config import (
    DEFAULT_CONFIG,
    Config,
    ConfigError,
    config_keys,
    config_schema,
    load_config,
    parse_config,
)
from gpu_monitor.hw.paths import DEFAULT_REBOOT_SENTINEL
from gpu_monitor.profiles import UndeclaredSetting, load_profile
from tests.fuzz import load_any_bytes

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "configuration.md"


def _load(tmp_path: Path, text: str, env: dict | None = None) -> Config:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(str(path), env=env if env is not None else {})


def _error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    return err.value


# --- defaults ------------------------------------------------------------------------------------


def test_default_config_is_safe_by_default():
    c = DEFAULT_CONFIG
    assert c.profile == "auto"
    assert c.remediation.enabled is False
    assert c.remediation.dry_run is True
    assert c.remediation.drain.force_delete is False
    assert c.remediation.taint_key == "gpu-monitor.io/unhealthy"
    assert c.remediation.breaker.budget_fraction == 0.10
    assert c.remediation.reboot_sentinel == DEFAULT_REBOOT_SENTINEL
    assert c.daemon.listen == "0.0.0.0:9425"
    assert c.daemon.kmsg_replay is True
    assert c.log_format == "text" and c.log_level == "info"
    assert c.expected_gpus is None and c.state_path is None
    assert c.nccl.ib_timeout is None and c.nccl.ib_retry_cnt is None
    assert c.check_enabled("anything")


def test_no_file_and_an_empty_file_give_the_defaults(tmp_path):
    assert load_config(None, env={"NODE_NAME": "n"}) == dataclasses.replace(
        DEFAULT_CONFIG, node_name="n")
    assert _load(tmp_path, "", {"NODE_NAME": "n"}) == dataclasses.replace(
        DEFAULT_CONFIG, node_name="n")
    assert _load(tmp_path, "# only a comment\n", {"NODE_NAME": "n"}).node_name == "n"


def test_node_name_comes_from_the_file_then_node_name_env_then_hostname(tmp_path):
    assert _load(tmp_path, "node_name: gpu-a\n", {"NODE_NAME": "gpu-b"}).node_name == "gpu-a"
    assert _load(tmp_path, "profile: auto\n", {"NODE_NAME": "gpu-b"}).node_name == "gpu-b"
    assert _load(tmp_path, "profile: auto\n", {}).node_name == socket.gethostname()


def test_config_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_CONFIG.profile = "x"  # type: ignore[misc]


FULL = """
node_name: gpu-node-17
profile: h100-sxm-8
expected_gpus: 4
profile_overrides:
  rdma: {ports: ["mlx5_3:1", "mlx5_4:1"]}
  nvlink: {boot_grace_s: 600}
checks:
  burn_in: {duration_s: 30, enabled: true, observe_only: false, timeout_s: 300}
  temperature: {observe_only: true, interval_s: 15}
  vendor_plugin: {threshold: 3}
enabled_checks: null
disabled_checks: [fabric_probe]
state_path: /var/lib/gpu-monitor/other.db
log_format: JSON
log_level: Warning
daemon: {listen: "127.0.0.1:9500", report_dir: /tmp/reports, kmsg_replay: false}
remediation:
  enabled: true
  dry_run: false
  taint_key: example.com/gpu-bad
  hysteresis_polls: 5
  hysteresis_s: 120
  breaker: {budget_fraction: 0.05, max_nodes: 3, cooldown_s: 60, ttl_s: 120}
  drain: {timeout_s: 60, gpu_pods_only: false, delete_emptydir_data: false, force_delete: true}
  reboot_sentinel: null
  retest_max_failures: 1
nccl: {ib_timeout: 20, ib_retry_cnt: 5}
"""


def test_every_key_is_read(tmp_path):
    c = _load(tmp_path, FULL)
    assert c.node_name == "gpu-node-17" and c.profile == "h100-sxm-8" and c.expected_gpus == 4
    assert c.profile_overrides["nvlink"]["boot_grace_s"] == 600
    assert c.checks["vendor_plugin"]["threshold"] == 3
    assert c.enabled_checks is None and c.disabled_checks == ("fabric_probe",)
    assert c.state_path == "/var/lib/gpu-monitor/other.db"
    assert (c.log_format, c.log_level) == ("json", "warning")
    assert c.daemon.listen == "127.0.0.1:9500" and c.daemon.report_dir == "/tmp/reports"
    assert c.daemon.kmsg_replay is False
    r = c.remediation
    assert (r.enabled, r.dry_run, r.taint_key) == (True, False, "example.com/gpu-bad")
    assert (r.hysteresis_polls, r.hysteresis_s, r.retest_max_failures) == (5, 120, 1)
    assert r.breaker.budget_fraction == 0.05 and r.breaker.max_nodes == 3
    assert (r.breaker.cooldown_s, r.breaker.ttl_s) == (60, 120)
    assert (r.drain.timeout_s, r.drain.gpu_pods_only) == (60, False)
    assert (r.drain.delete_emptydir_data, r.drain.force_delete) == (False, True)
    assert r.reboot_sentinel is None
    assert (c.nccl.ib_timeout, c.nccl.ib_retry_cnt) == (20, 5)
    assert c.source == str(tmp_path / "config.yaml")


def test_docs_example_config_loads(tmp_path):
    block = re.search(r"<!-- example: config -->\s*```yaml\n(.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/configuration.md lost its config example"
    c = _load(tmp_path, block.group(1))
    c.validate_checks(["burn_in", "temperature", "fabric_probe"])
    assert c.apply_to(load_profile("h100-sxm-8")).get("rdma.ports")[1] == "mlx5_3:1"


def test_docs_list_every_config_key_with_its_default():
    text = DOCS.read_text()
    missing = [k for k in config_keys() if f"`{k}`" not in text]
    assert not missing, f"docs/configuration.md does not document: {missing}"
    for key in ("enabled", "observe_only", "interval_s", "timeout_s"):
        assert f"`{key}`" in text


# --- checks --------------------------------------------------------------------------------------


def test_check_setting_reads_the_checks_block_and_the_nccl_fallback(tmp_path):
    c = _load(tmp_path, "checks: {burn_in: {duration_s: 30}, rdma_ports: {nccl_ib_retry_cnt: 6}}\n"
                        "nccl: {ib_timeout: 20, ib_retry_cnt: 3}\n")
    assert c.check_setting("burn_in", "duration_s") == 30
    assert c.check_setting("burn_in", "dtypes") is None
    assert c.check_setting("xid", "app_xid_window_s") is None
    with pytest.raises(UndeclaredSetting):
        c.check_setting("xid", "duration_s")  # not an xid setting
    assert c.check_setting("rdma_ports", "nccl_ib_timeout") == 20  # top-level nccl
    assert c.check_setting("rdma_ports", "nccl_ib_retry_cnt") == 6  # the check's own wins
    assert DEFAULT_CONFIG.check_setting("rdma_ports", "nccl_ib_timeout") is None


def test_context_setting_takes_config_over_profile_over_default(tmp_path):
    c = _load(tmp_path, "checks: {burn_in: {duration_s: 30},"
                        " nccl_allreduce: {allreduce_busbw_floor_gb_per_s: 400}}\n")
    ctx = Context(host=None, profile=load_profile("h100-sxm-8"), config=c)  # type: ignore[arg-type]
    assert ctx.setting("burn_in", "duration_s") == 30  # config
    assert ctx.setting("burn_in", "matrix_size") == 8192  # profile check block
    assert ctx.setting("nccl_allreduce", "allreduce_busbw_floor_gb_per_s") == 400  # config
    assert ctx.setting("nvlink_peer", "p2p_floor_gb_per_s") == 335  # profile section
    assert ctx.setting("rdma_ports", "nccl_ib_timeout") == 18  # profile (config nccl unset)
    assert ctx.setting("inventory", "boot_grace_s", 42) == 42  # default
    with pytest.raises(UndeclaredSetting):
        ctx.setting("burn_in", "no_such_key", 42)  # never a silent default


@pytest.mark.parametrize(("text", "name", "want"), [
    ("{}", "xid", True),
    ("disabled_checks: [xid]", "xid", False),
    ("disabled_checks: [xid]", "burn_in", True),
    ("enabled_checks: [xid]", "burn_in", False),
    ("enabled_checks: [xid]", "xid", True),
    ("enabled_checks: [xid]\nchecks: {burn_in: {enabled: true}}", "burn_in", True),
    ("checks: {burn_in: {enabled: false}}", "burn_in", False),
    ("enabled_checks: []", "xid", False),
], ids=["default", "disabled", "other-not-disabled", "not-in-enabled", "in-enabled",
        "explicit-on-beats-list", "explicit-off", "empty-enabled-list"])
def test_check_enabled_precedence(tmp_path, text, name, want):
    assert _load(tmp_path, text + "\n").check_enabled(name) is want


def test_check_enabled_default_applies_only_without_any_rule(tmp_path):
    assert DEFAULT_CONFIG.check_enabled("sdc_probe", default=False) is False
    assert _load(tmp_path, "checks: {sdc_probe: {enabled: true}}\n").check_enabled(
        "sdc_probe", default=False) is True


def test_observe_only(tmp_path):
    c = _load(tmp_path, "checks: {temperature: {observe_only: true}}\n")
    assert c.check_observe_only("temperature") and not c.check_observe_only("xid")


def test_unknown_check_names_pass_loading_and_fail_validation(tmp_path):
    c = _load(tmp_path, "checks: {burnin: {duration_s: 3}, vendor_plugin: {x: 1}}\n"
                        "disabled_checks: [xdi]\n")
    c.validate_checks(["burnin", "vendor_plugin", "xdi"])  # all known: fine
    with pytest.raises(ConfigError) as err:
        c.validate_checks(["burn_in", "xid", "vendor_plugin"])
    problems = dict(err.value.problems)
    assert "did you mean 'burn_in'" in problems["checks.burnin"]
    assert "did you mean 'xid'" in problems["disabled_checks[0]"]
    assert "checks.vendor_plugin" not in problems
    assert str(err.value).startswith(f"config {tmp_path / 'config.yaml'}: ")
    assert isinstance(err.value, ValueError)  # the CLI turns ValueError into exit 2


def test_undeclared_settings_of_a_known_check_are_refused(tmp_path):
    """A key the check does not declare would be read by nothing, or read untyped."""
    err = _error(tmp_path, "checks: {burn_in: {progress_bar: false}}\n")
    problems = dict(err.problems)
    assert "unknown key 'progress_bar'" in problems["checks.burn_in.progress_bar"]
    assert "duration_s" in problems["checks.burn_in.progress_bar"]  # lists what is declared


def test_the_issues_check_setting_is_refused_at_load(tmp_path):
    """``boot_grace_s: soon`` was accepted and then crashed pcie_aer on float('soon')."""
    err = _error(tmp_path, "checks: {pcie_aer: {boot_grace_s: soon}}\n")
    assert err.field == "checks.pcie_aer.boot_grace_s"
    assert "got 'soon'" in str(err)


# --- the profile ---------------------------------------------------------------------------------


def test_apply_to_sets_expected_gpus_and_merges_overrides(tmp_path):
    c = _load(tmp_path, FULL)
    base = load_profile("h100-sxm-8")
    p = c.apply_to(base)
    assert p.expected_gpus == 4
    assert p.get("rdma.ports") == ("mlx5_3:1", "mlx5_4:1")
    assert p.get("nvlink.boot_grace_s") == 600
    assert p.get("nvlink.links_per_gpu") == 18
    assert base.expected_gpus == 8
    assert DEFAULT_CONFIG.apply_to(base) is base


def test_expected_gpus_zero_is_allowed(tmp_path):
    c = _load(tmp_path, "expected_gpus: 0\n")
    assert c.apply_to(load_profile("h100-sxm-8")).expected_gpus == 0


def test_simulation_block_survives_config_application(tmp_path):
    c = _load(tmp_path, "checks: {burn_in: {duration_s: 1}}\nexpected_gpus: 2\n")
    p = c.apply_to(load_profile("h100-sxm-8")).for_simulation()
    assert p.expected_gpus == 2 and p.simulated
    assert p.check_setting("burn_in", "dtypes") == ("fp32",)


def test_overrides_breaking_an_order_are_named_when_applied(tmp_path):
    c = _load(tmp_path, "profile_overrides: {nccl: {sweep_min_bytes: 4294967296}}\n")
    with pytest.raises(ConfigError) as err:
        c.apply_to(load_profile("h100-sxm-8"))
    assert err.value.field == "profile_overrides.nccl.sweep_min_bytes"
    assert "applied to profile h100-sxm-8" in str(err.value)


def test_resolve_profile(tmp_path):
    auto = DEFAULT_CONFIG
    assert auto.resolve_profile(["NVIDIA H200"] * 8).name == "h200-sxm-8"
    assert auto.resolve_profile([]).name == "cpu-only"
    with pytest.raises(ConfigError, match=r"profile: auto: no shipped profile matches"):
        auto.resolve_profile(["NVIDIA B200"])
    named = _load(tmp_path, "profile: a100-sxm-8\nexpected_gpus: 6\n")
    assert named.resolve_profile().expected_gpus == 6
    with pytest.raises(ConfigError, match=r"did you mean 'a100-sxm-8'"):
        _load(tmp_path, "profile: a100-sxm8\n").resolve_profile()


# --- refusing bad configs ------------------------------------------------------------------------

BAD_CONFIGS = [
    # (id, yaml, field, words)
    ("unknown_top_key", "profil: auto", "profil", "did you mean 'profile'"),
    ("unknown_nested_key", "remediation: {dryrun: true}", "remediation.dryrun",
     "did you mean 'dry_run'"),
    ("unknown_key_no_hint", "zzz: 1", "zzz", "expected one of"),
    ("bool_as_string", "remediation: {dry_run: 'no'}", "remediation.dry_run",
     "expected true or false, got 'no'"),
    ("fraction_out_of_range", "remediation: {breaker: {budget_fraction: 1.5}}",
     "remediation.breaker.budget_fraction", "in (0, 1]"),
    ("fraction_zero", "remediation: {breaker: {budget_fraction: 0}}",
     "remediation.breaker.budget_fraction", "in (0, 1]"),
    ("hysteresis_polls_zero", "remediation: {hysteresis_polls: 0}",
     "remediation.hysteresis_polls", "a positive integer"),
    ("negative_expected_gpus", "expected_gpus: -1", "expected_gpus", "non-negative integer"),
    ("float_expected_gpus", "expected_gpus: 7.5", "expected_gpus", "got 7.5"),
    ("log_format", "log_format: jsn", "log_format", "did you mean 'json'"),
    ("log_level", "log_level: verbose", "log_level", "one of 'debug'"),
    ("listen_without_port", "daemon: {listen: '0.0.0.0'}", "daemon.listen", "host:port"),
    ("listen_port_range", "daemon: {listen: '0.0.0.0:70000'}", "daemon.listen", "host:port"),
    ("taint_key", "remediation: {taint_key: 'bad key!'}", "remediation.taint_key",
     "Kubernetes taint key"),
    ("ib_timeout_range", "nccl: {ib_timeout: 32}", "nccl.ib_timeout", "from 1 to 31"),
    ("ib_retry_range", "nccl: {ib_retry_cnt: 8}", "nccl.ib_retry_cnt", "from 0 to 7"),
    ("enabled_checks_not_list", "enabled_checks: xid", "enabled_checks", "a list"),
    ("checks_not_mapping", "checks: [xid]", "checks", "a mapping"),
    ("check_block_not_mapping", "checks: {xid: true}", "checks.xid", "a mapping"),
    ("check_setting_typo", "checks: {burn_in: {duration: 5}}", "checks.burn_in.duration",
     "did you mean 'duration_s'"),
    ("check_setting_type", "checks: {burn_in: {duration_s: soon}}", "checks.burn_in.duration_s",
     "a positive number"),
    ("section_setting_type", "checks: {nccl_allreduce: {allreduce_busbw_floor_gb_per_s: -4}}",
     "checks.nccl_allreduce.allreduce_busbw_floor_gb_per_s", ">= 0"),
    ("plugin_switch_type", "checks: {vendor_plugin: {enabled: 'yes'}}",
     "checks.vendor_plugin.enabled", "true or false"),
    ("interval_zero", "checks: {xid: {interval_s: 0}}", "checks.xid.interval_s",
     "a positive number"),
    ("override_type", "profile_overrides: {nvlink: {links_per_gpu: x}}",
     "profile_overrides.nvlink.links_per_gpu", "non-negative integer, got 'x'"),
    ("override_unknown", "profile_overrides: {pcie: {lanes: 16}}", "profile_overrides.pcie.lanes",
     "unknown key 'lanes'"),
    ("disabled_and_enabled", "enabled_checks: [xid]\ndisabled_checks: [xid]",
     "disabled_checks[0]", "also in enabled_checks"),
    ("disabled_but_forced_on", "disabled_checks: [xid]\nchecks: {xid: {enabled: true}}",
     "checks.xid.enabled", "is in disabled_checks"),
    ("top_level_list", "- a\n- b", "", "expected a mapping"),
    ("null_profile", "profile: null", "profile", "got null"),
]


@pytest.mark.parametrize(("text", "field", "words"), [b[1:] for b in BAD_CONFIGS],
                         ids=[b[0] for b in BAD_CONFIGS])
def test_invalid_config_is_refused_naming_the_field_and_file(tmp_path, text, field, words):
    err = _error(tmp_path, text + "\n")
    problems = dict(err.problems)
    assert field in problems, str(err)
    assert words in problems[field], problems[field]
    assert str(err).startswith(f"config {tmp_path / 'config.yaml'}: ")


@pytest.mark.parametrize(("text", "line"), [
    ("profile: auto\nremediation:\n  dry_run: true\n   enabled: false\n", 4),
    ("profile: auto\nchecks: {burn_in: {duration_s: 3}\n", 3),
    ("profile: auto\nlog_level: info\nprofile: h100-sxm-8\n", 3),
    ("profile: auto\n\tlog_level: info\n", 2),
], ids=["bad-indent", "unclosed-flow-mapping", "duplicate-key", "tab"])
def test_malformed_yaml_names_the_line(tmp_path, text, line):
    err = _error(tmp_path, text)
    assert err.line == line
    assert f"malformed YAML at line {line}" in str(err)


def test_missing_file_and_directory_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config .*/nope.yaml: file not found"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))


def test_all_problems_are_reported_together(tmp_path):
    err = _error(tmp_path, "log_level: loud\nexpected_gpus: x\nremediation: {dryrun: 1}\n")
    assert {p for p, _ in err.problems} == {"log_level", "expected_gpus", "remediation.dryrun"}


def test_disabled_by_names_the_field_that_disables_a_check(tmp_path):
    c = _load(tmp_path, "disabled_checks: [xid, temperature]\nchecks:\n  pcie: {enabled: false}\n")
    assert c.disabled_by("temperature") == "disabled_checks[1]"
    assert c.disabled_by("pcie") == "checks.pcie.enabled: false"
    assert c.disabled_by("burn_in") == ""
    only = _load(tmp_path, "enabled_checks: [inventory]\n")
    assert only.disabled_by("burn_in") == "not in enabled_checks"
    assert only.disabled_by("inventory") == ""
    for name in ("xid", "temperature", "pcie", "burn_in"):
        assert bool(c.disabled_by(name)) == (not c.check_enabled(name))


@pytest.mark.parametrize(("body", "words"), [
    (b"profile: auto\nnode_name: n\xe9ud\n", "not UTF-8 text: invalid continuation byte at byte "
                                            "26 (line 2)"),
    (b"a: " + b"[" * 3000 + b"]" * 3000, "nested deeper than"),
    (b"#" * (2 << 20), "larger than"),
], ids=["latin1", "deep", "too-large"])
def test_file_level_problems_are_config_errors_naming_the_file(tmp_path, body, words):
    path = tmp_path / "config.yaml"
    path.write_bytes(body)
    with pytest.raises(ConfigError, match=re.escape(words)) as err:
        load_config(str(path), env={})
    assert str(err.value).startswith(f"config {path}: ")


def test_a_plugin_block_is_free_form_but_its_common_keys_are_typed(tmp_path):
    c = _load(tmp_path, "checks: {vendor_plugin: {threshold: [1, 2], interval_s: 5}}\n")
    assert c.checks["vendor_plugin"]["threshold"] == (1, 2)
    err = _error(tmp_path, "checks: {vendor_plugin: {interval_s: .inf}}\n")
    assert err.field == "checks.vendor_plugin.interval_s"


def test_section_keys_a_check_block_may_override_are_typed(tmp_path):
    c = _load(tmp_path, "checks: {pcie_aer: {gen: 5}}\n")
    assert c.check_setting("pcie_aer", "gen") == 5
    err = _error(tmp_path, "checks: {pcie_aer: {gen: 9}}\n")
    assert err.field == "checks.pcie_aer.gen"
    err = _error(tmp_path, "checks: {pcie_aer: {links_per_gpu: 18}}\n")  # not pcie_aer's
    assert err.field == "checks.pcie_aer.links_per_gpu"


# --- property: nothing but ConfigError escapes loading ---------------------------------------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                     st.text(max_size=8), st.sampled_from(["auto", "json", "xid", "0.0.0.0:1"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=10), st.sampled_from(
        ["enabled", "interval_s", "dry_run", "breaker", "ports", "rdma", "xid", "burn_in"])),
        inner, max_size=4)),
    max_leaves=20)
_TOP = st.sampled_from([*config_schema().fields, "zz"])


@settings(deadline=None, derandomize=True, max_examples=300)
@given(st.dictionaries(_TOP, _VALUES, max_size=6))
def test_parse_config_raises_only_config_errors(data):
    try:
        config = parse_config(data, "c.yaml", env={})
    except ConfigError:
        return
    try:  # a config that loads also applies (or is refused as a ConfigError)
        config.apply_to(load_profile("h100-sxm-8"))
    except ConfigError:
        pass


@settings(deadline=None, derandomize=True, max_examples=150)
@given(st.binary(max_size=200))
def test_load_config_raises_only_config_errors_on_any_bytes(data):
    load_any_bytes(lambda path: load_config(path, env={}), data, "c.yaml", ConfigError)


def test_remediation_overrides_in_a_check_block_are_typed(tmp_path):
    c = _load(tmp_path, "checks: {xid: {remediation: {Xid79: Drain, Xid94: ignore}},"
                        " throttle: {remediation: event}, vendor_plugin: {remediation: cordon}}\n")
    assert dict(c.checks["xid"]["remediation"]) == {"Xid79": "drain", "Xid94": "ignore"}
    assert c.checks["throttle"]["remediation"] == "event"
    for text, field in [("checks: {xid: {remediation: nuke}}", "checks.xid.remediation"),
                        ("checks: {xid: {remediation: {Xid79: nuke}}}",
                         "checks.xid.remediation.Xid79"),
                        ("checks: {xid: {remediation: [drain]}}", "checks.xid.remediation"),
                        ("checks: {vendor_plugin: {remediation: 3}}",
                         "checks.vendor_plugin.remediation")]:
        assert _error(tmp_path, text + "\n").field == field, text


def test_the_remediation_operations_are_the_policys():
    from gpu_monitor.config import REMEDIATION_OPS
    from gpu_monitor.remediate.policy import IGNORE, Op

    assert set(REMEDIATION_OPS) == {o.value for o in Op} | {IGNORE}
