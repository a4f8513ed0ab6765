import json

from gpu_monitor.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_bootstrap_simulated_h100_json_is_healthy(capsys):
    code, out, _ = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--output", "json",
                       "--log-level", "error")
    report = json.loads(out)
    assert code == 0, out
    assert report["schema"] == 1 and report["verdict"] == "healthy"
    assert report["profile"] == "h100-sxm-8"
    assert {"check", "status", "target", "reason", "message", "details", "action",
            "observed_at"} <= set(report["results"][0])


def test_bootstrap_gpu_missing_exits_1_naming_gpu(capsys):
    code, out, _ = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--inject",
                       "gpu-missing@gpu:7", "--log-level", "error")
    assert code == 1
    assert "gpu:7" in out and "GpuMissing" in out


def test_bad_config_exits_2_naming_field(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("expected_gpus: lots\n")
    code, _, err = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--config", str(cfg))
    assert code == 2
    assert "expected_gpus" in err


def test_inject_without_simulate_is_a_usage_error(capsys):
    code, _, err = run(capsys, "bootstrap", "--inject", "xid@gpu:1,code=79")
    assert code == 2 and "--simulate" in err


def test_malformed_inject_is_a_usage_error(capsys):
    code, _, err = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--inject", "xid@gpu")
    assert code == 2 and "gpu target" in err


def test_unknown_profile_is_a_usage_error(capsys):
    code, _, err = run(capsys, "bootstrap", "--simulate", "h900-sxm-8")
    assert code == 2 and "h900" in err


def test_unknown_check_is_a_usage_error(capsys):
    code, _, err = run(capsys, "check", "nope", "--simulate", "h100-sxm-8")
    assert code == 2 and "unknown check" in err


def test_list_checks_lists_inventory_as_json(capsys):
    code, out, _ = run(capsys, "list-checks", "--output", "json")
    rows = json.loads(out)
    assert code == 0
    inv = next(r for r in rows if r["name"] == "inventory")
    assert inv["enabled"] is True and "bootstrap" in inv["kinds"]


def test_list_checks_table(capsys):
    code, out, _ = run(capsys, "list-checks")
    assert code == 0 and "inventory" in out and "SUMMARY" in out


def test_check_command_runs_one_check(capsys):
    code, out, _ = run(capsys, "check", "inventory", "--simulate", "a100-sxm-8", "-o", "json",
                       "--log-level", "error")
    assert code == 0
    assert {r["check"] for r in json.loads(out)["results"]} == {"inventory"}


def test_skip_and_checks_flags(capsys):
    code, out, _ = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--checks", "inventory",
                       "-o", "json", "--log-level", "error")
    assert code == 0 and {r["check"] for r in json.loads(out)["results"]} == {"inventory"}
    code, out, _ = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--skip", "inventory",
                       "-o", "json", "--log-level", "error")
    # Not run, and said so: a bootstrap never just leaves a check out of its report.
    (skipped,) = [r for r in json.loads(out)["results"] if r["check"] == "inventory"]
    assert (skipped["status"], skipped["reason"]) == ("skipped", "DisabledByConfig")
    assert "disabled by --skip on the command line" in skipped["message"]


def test_help_documents_inject_kinds(capsys):
    assert main(["bootstrap", "--help"]) == 0
    out = capsys.readouterr().out
    assert "port-down@ib:mlx5_0:1" in out and "nvml-error@gpu:" in out


def test_real_host_without_gpus_is_examined_not_simulated(capsys, tmp_path):
    # An empty sysfs/procfs: no NVIDIA functions on the bus, no NVML on this machine.
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    code, out, _ = run(capsys, "check", "inventory", "--path.sysfs", str(tmp_path / "sys"),
                       "--path.procfs", str(tmp_path / "proc"), "--state",
                       str(tmp_path / "s.db"), "-o", "json", "--log-level", "error")
    report = json.loads(out)
    assert report["profile"] == "cpu-only" and code == 0


def test_real_host_with_gpus_on_bus_but_no_nvml_is_unhealthy(capsys, tmp_path):
    from gpu_monitor.profiles import load_profile
    from gpu_monitor.sim.node import build_spec
    from gpu_monitor.sim.sysfs_tree import write_tree

    write_tree(str(tmp_path), build_spec(load_profile("h100-sxm-8")))
    code, out, _ = run(capsys, "check", "inventory", "--path.sysfs", str(tmp_path / "sys"),
                       "--path.procfs", str(tmp_path / "proc"), "--state",
                       str(tmp_path / "s.db"), "-o", "json", "--log-level", "error")
    report = json.loads(out)
    assert code == 1
    assert report["results"][0]["reason"] == "NvmlUnavailable"


def test_corrupt_state_file_exits_2_with_recovery_text(capsys, tmp_path):
    db = tmp_path / "state.db"
    db.write_bytes(b"this is not a sqlite database" * 100)
    code, _, err = run(capsys, "check", "inventory", "--simulate", "h100-sxm-8", "--state",
                       str(db))
    assert code == 2
    assert str(db) in err and "move" in err.lower()
    assert "Traceback" not in err


def test_json_log_format_emits_json_lines(capsys, tmp_path):
    code, _, err = run(capsys, "bootstrap", "--simulate", "h100-sxm-8", "--log-format", "json",
                       "--log-level", "debug", "--state", str(tmp_path / "s.db"), "-o", "json")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "expected debug log lines"
    for ln in lines:
        rec = json.loads(ln)
        assert {"ts", "level", "logger", "msg"} <= set(rec)


def test_kmsg_with_simulate_replays_a_saved_log_on_the_profile(capsys, fixtures_dir):
    log = fixtures_dir / "xid_kmsg" / "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt"
    code, out, _ = run(capsys, "check", "nvswitch", "--simulate", "h100-sxm-8", "--kmsg",
                       str(log), "-o", "json", "--log-level", "error")
    results = json.loads(out)["results"]
    assert code == 1
    assert {(r["target"], r["reason"]) for r in results if r["status"] == "failed"} == {
        ("nvswitch:0", "SXid20034")}
    assert {r["target"] for r in results if r["reason"] == "Ok"} >= {"nvswitch:1", "nvswitch:3"}


def test_kmsg_with_simulate_that_cannot_be_read_is_unknown(capsys, tmp_path):
    code, out, _ = run(capsys, "check", "xid", "--simulate", "h100-sxm-8", "--kmsg",
                       str(tmp_path / "gone.log"), "-o", "json", "--log-level", "error")
    results = json.loads(out)["results"]
    assert code == 3
    assert {(r["status"], r["reason"]) for r in results} == {("unknown", "KmsgReadError")}
    assert len(results) == 8 and "gone.log" in results[0]["message"]


def test_list_checks_refuses_a_bad_profile_file_instead_of_ignoring_it(capsys, tmp_path):
    bad = tmp_path / "b200.yaml"
    bad.write_text("schema: 1\nname: b200\n")
    code, out, err = run(capsys, "list-checks", "--profile", str(bad))
    assert code == 2 and out == ""
    assert f"profile {bad}: gpu: required key is missing" in err


def test_list_checks_refuses_unknown_check_names_in_the_config(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("disabled_checks: [xdi]\n")
    code, _, err = run(capsys, "list-checks", "--config", str(cfg))
    assert code == 2
    assert "disabled_checks[0]: unknown check 'xdi' (did you mean 'xid'?)" in err


def test_list_checks_applies_the_configs_overrides_to_the_profile(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("profile_overrides: {nccl: {sweep_min_bytes: 4294967296}}\n")
    code, _, err = run(capsys, "list-checks", "--config", str(cfg), "--profile", "h100-sxm-8")
    assert code == 2 and "profile_overrides.nccl.sweep_min_bytes" in err
