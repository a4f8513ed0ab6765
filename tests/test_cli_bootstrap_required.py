"""`gpu-monitor bootstrap`: a bootstrap that did not run its required checks is not healthy.

Every run is in-process through ``cli.main`` on a simulated node; tools and runtimes are taken
away with ``--inject missing@node,what=...`` (the passive image: ``what=torch``, whose workers'
interpreter cannot import torch). ``--checks`` / ``--skip`` keep the active checks out where the
point is the gate, not the checks.
"""

from __future__ import annotations

import json
import shutil

import pytest

from gpu_monitor.cli import main
from gpu_monitor.profiles import load_profile

no_real_dcgmi = pytest.mark.skipif(shutil.which("dcgmi") is not None,
                                   reason="this host has a real dcgmi")

# The active checks whose run takes a while on CPU workers; the gate tests leave them out.
SLOW = "burn_in,nccl_allreduce,nvlink_peer,sdc_probe,rdma_loopback"


def bootstrap(capsys, *argv):
    rc = main(["bootstrap", *argv, "-o", "json", "--log-level", "error"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, (json.loads(out) if out.strip() else None), err


def by_check(report, name):
    return [r for r in report["results"] if r["check"] == name]


@no_real_dcgmi
def test_no_dcgmi_on_a_simulated_h100_is_unknown_exit_3_naming_dcgmi(capsys):
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8",
                              "--inject", "missing@node,what=dcgmi",
                              "--checks", "inventory,dcgm_diag")
    assert rc == 3 and report["verdict"] == "unknown"
    (r,) = by_check(report, "dcgm_diag")
    assert (r["status"], r["reason"]) == ("unknown", "RequirementMissing")
    assert "dcgmi" in r["message"] and "required for the bootstrap" in r["message"]


def test_dcgmi_without_a_host_engine_is_unknown_naming_the_host_engine(capsys):
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8",
                              "--inject", "missing@node,what=nv-hostengine",
                              "--checks", "dcgm_diag")
    assert rc == 3
    (r,) = by_check(report, "dcgm_diag")
    assert (r["status"], r["reason"]) == ("unknown", "DcgmUnavailable")
    assert "host engine" in r["message"]


def test_the_passive_image_cannot_pass_naming_torch_for_each_torch_check(capsys):
    torch_checks = ("burn_in", "nccl_allreduce", "nvlink_peer", "sdc_probe")
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8",
                              "--inject", "missing@node,what=torch",
                              "--checks", ",".join(("inventory",) + torch_checks))
    assert rc == 3 and report["verdict"] == "unknown"
    for name in torch_checks:
        (r,) = by_check(report, name)
        assert (r["status"], r["reason"]) == ("unknown", "RequirementMissing"), r
        assert "torch is not installed" in r["message"]
    assert all(r["status"] == "ok" for r in by_check(report, "inventory"))


@no_real_dcgmi
def test_a_check_disabled_in_config_says_so_and_the_rest_decides(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("checks:\n  dcgm_diag: {enabled: false}\n")
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8", "--config", str(cfg),
                              "--inject", "missing@node,what=dcgmi", "--skip", SLOW)
    assert rc == 0 and report["verdict"] == "healthy"
    (r,) = by_check(report, "dcgm_diag")
    assert (r["status"], r["reason"]) == ("skipped", "DisabledByConfig")
    assert "disabled by config" in r["message"]
    assert r["details"]["disabled_by"] == "checks.dcgm_diag.enabled: false"
    assert by_check(report, "inventory"), "the rest of the suite ran"


def test_disabled_checks_lists_are_named_in_the_report(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("disabled_checks: [temperature]\n")
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8", "--config", str(cfg),
                              "--skip", SLOW + ",dcgm_diag")
    (r,) = by_check(report, "temperature")
    assert r["reason"] == "DisabledByConfig" and "disabled_checks[0]" in r["message"]
    assert rc == 0


def test_a_disabled_check_named_with_checks_runs_anyway(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("disabled_checks: [inventory]\n")
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8", "--config", str(cfg),
                              "--checks", "inventory")
    assert rc == 0 and all(r["reason"] != "DisabledByConfig" for r in report["results"])


def _h100_profile_file(tmp_path, required):
    import yaml

    data = load_profile("h100-sxm-8").to_dict()
    data["name"] = "h100-no-dcgm"
    data["checks"].setdefault("dcgm_diag", {})["required"] = required
    path = tmp_path / "h100-no-dcgm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@no_real_dcgmi
def test_a_profile_may_make_dcgm_diag_not_required_for_its_sku(capsys, tmp_path):
    profile = _h100_profile_file(tmp_path, False)
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8", "--profile", str(profile),
                              "--inject", "missing@node,what=dcgmi",
                              "--checks", "inventory,dcgm_diag")
    assert rc == 0 and report["profile"] == "h100-no-dcgm"
    (r,) = by_check(report, "dcgm_diag")
    assert (r["status"], r["reason"]) == ("skipped", "RequirementMissing")
    assert "dcgmi" in r["message"]


@no_real_dcgmi
def test_profile_overrides_in_the_config_do_the_same(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("profile_overrides:\n  checks:\n    dcgm_diag: {required: false}\n")
    rc, _, _ = bootstrap(capsys, "--simulate", "h100-sxm-8", "--config", str(cfg),
                         "--inject", "missing@node,what=dcgmi", "--checks", "dcgm_diag")
    assert rc == 0


@pytest.mark.parametrize("where, text, field", [
    ("profile", "maybe", "checks.dcgm_diag.required"),
    ("config", "checks:\n  burn_in: {required: 3}\n", "checks.burn_in.required"),
], ids=["profile-file", "config-file"])
def test_a_required_that_is_not_a_bool_fails_at_start_naming_the_field(capsys, tmp_path,
                                                                        where, text, field):
    if where == "profile":
        args = ["--profile", str(_h100_profile_file(tmp_path, text))]
    else:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(text)
        args = ["--config", str(cfg)]
    rc, report, err = bootstrap(capsys, "--simulate", "h100-sxm-8", *args)
    assert rc == 2 and report is None
    assert field in err and "gpu-monitor: error:" in err


@no_real_dcgmi
def test_a_cpu_only_node_never_waits_for_gpu_tools(capsys):
    rc, report, _ = bootstrap(capsys, "--simulate", "cpu-only",
                              "--inject", "missing@node,what=torch",
                              "--inject", "missing@node,what=dcgmi",
                              "--inject", "missing@node,what=ib_write_bw")
    assert rc == 0 and report["verdict"] == "healthy"
    for name in ("burn_in", "dcgm_diag", "rdma_loopback", "sdc_probe"):
        (r,) = by_check(report, name)
        assert r["status"] == "skipped" and r["details"]["not_applicable"] is True, r


def test_the_simulated_pcie_copy_test_is_not_a_missing_requirement(capsys):
    """CPU workers stand in for the GPUs and cannot pin-copy: not applicable, exit 0."""
    rc, report, _ = bootstrap(capsys, "--simulate", "h100-sxm-8", "--checks", "pcie")
    assert rc == 0
    (note,) = [r for r in by_check(report, "pcie") if r["target"] == "node"]
    assert (note["status"], note["reason"]) == ("skipped", "CopyTestSkipped")


def test_list_checks_says_which_checks_a_bootstrap_requires(capsys):
    assert main(["list-checks", "-o", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["dcgm_diag"]["required"] is True and rows["burn_in"]["required"] is True
