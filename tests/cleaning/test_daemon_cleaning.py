"""The check between workloads as the daemon wires it (``make_cleaning``): the simulated node's
real bootstrap checks, the real kubernetes client into the fake apiserver with its kubelet, the
stand-in scheduler, the cleaner on its own thread and clock. The slow active checks are disabled
by config (a bootstrap reports them ``DisabledByConfig``); the rest run for real."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_monitor.cleaning import plan
from gpu_monitor.cleaning.hold import hold_name
from gpu_monitor.cleaning.metrics import cleaning_collector
from gpu_monitor.cli import build_env, build_parser, main
from gpu_monitor.daemon import Daemon, make_cleaning
from gpu_monitor.metrics import StoreCollector
from gpu_monitor.model import Status, iso
from gpu_monitor.remediate.bootstrap_gate import KV_NAMESPACE as GATE_NAMESPACE
from gpu_monitor.remediate.bootstrap_gate import KV_PASSED as GATE_PASSED
from gpu_monitor.remediate.policy import Op
from gpu_monitor.remediate.record import QuarantineRecord, save_record
from gpu_monitor.state import Store
from tests.cleaning.conftest import NODE
from tests.cleaning.test_cleaner_api import node_of, running, wait_for, workload

SLOW = ["pcie", "nvlink_peer", "dcgm_diag", "rdma_loopback", "burn_in", "nccl_allreduce",
        "sdc_probe"]


def config(tmp_path, gate: bool = False, **cleaning) -> str:
    """Cleaning on, a pass every 50 ms, the slow checks disabled; the bootstrap gate off
    unless ``gate`` (a daemon with it on waits for its pass first)."""
    path = tmp_path / "config.yaml"
    opts = {"enabled": True, "interval_s": 0.05, **cleaning}
    path.write_text(f"cleaning: {opts}\n".replace("True", "true")
                    + f"daemon: {{bootstrap_on_start: {str(gate).lower()}}}\n"
                    + f"disabled_checks: {SLOW}\n")
    return str(path)


def scrape(service) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(Store.open(":memory:"),
                                extra=[cleaning_collector(service.cleaner, service.suite)]))
    return generate_latest(reg).decode()


class Consumer:
    """Remediation as the daemon hands it results (``Daemon._consume``)."""

    def __init__(self) -> None:
        self.results = []

    def on_results(self, results) -> None:
        self.results.extend(results)


@contextmanager
def cleaning_daemon(tmp_path, kube, *faults: str, after_record=None, gate: bool = False,
                    **cleaning) -> Iterator:
    """The daemon's cleaner on its thread (``after_record(service)``: called after each outcome
    the suite records, hooked in before the start)."""
    argv = ["daemon", "--simulate", "h100-sxm-8", "--node-name", NODE,
            "--config", config(tmp_path, gate, **cleaning), "--state", str(tmp_path / "state.db")]
    for f in faults:
        argv += ["--inject", f]
    env = build_env(build_parser().parse_args(argv))
    env.host.start(env.clock)
    consumer = Consumer()
    daemon = Daemon([], env.context(force=False, one_shot=False), remediator=consumer)
    service = make_cleaning(env, daemon, kube_factory=lambda: kube)
    assert service is not None
    if after_record is not None:
        real = service.suite.record

        def record(outcome):
            real(outcome)
            after_record(service)
        service.suite.record = record
    service.start()
    try:
        yield env, service, consumer
    finally:
        daemon.stop()
        service.thread.join(timeout=120)
        assert not service.thread.is_alive()
        env.close()


def test_the_daemon_holds_the_idle_node_runs_its_bootstrap_checks_and_releases_on_a_pass(
        tmp_path, fake_api, kube, node, scheduler) -> None:
    workload(kube, "train-0")
    wait_for(lambda: running(fake_api, "team", "train-0"), "train-0 running")
    with cleaning_daemon(tmp_path, kube) as (env, service, consumer):
        # In use: the hold queues behind the workload, Pending.
        wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is not None, "the hold")
        assert service.cleaner.counts.state == plan.STATE_IN_USE
        assert node_of(fake_api, "gpu-monitor", hold_name(NODE)) is None
        kube.delete_pod("team", "train-0")
        # The last GPU pod left: the hold binds first, the suite runs, the pass releases.
        wait_for(lambda: service.cleaner.counts.released == 1, "released after a pass")
        wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is None, "hold deleted")
        assert service.cleaner.counts.state == plan.STATE_CLEAN
        last = service.suite.last
        assert last is not None and last.verdict.value == "healthy" and not last.stopped
        # The real bootstrap checks ran, as a bootstrap; their outcomes were stored and handed
        # on to remediation like a poll's; the disabled ones were reported, not run.
        ran = {r.check for r in consumer.results}
        assert {"inventory", "ecc_memory", "temperature"} <= ran
        skipped = {r.check for r in consumer.results if r.reason == "DisabledByConfig"}
        assert skipped == set(SLOW)
        assert env.store.last_run("inventory") is not None
        assert service.cleaner.memory().last_clean is not None
        text = scrape(service)
        for line in ('gpu_monitor_cleaning_state{state="clean"} 1.0',
                     'gpu_monitor_cleaning_state{state="in_use"} 0.0',
                     'gpu_monitor_cleaning_runs_total{verdict="healthy"} 1.0',
                     'gpu_monitor_cleaning_runs_total{verdict="unknown"} 0.0',
                     "gpu_monitor_cleaning_releases_total 1.0",
                     "gpu_monitor_cleaning_missed_total 0.0"):
            assert line in text
        assert "gpu_monitor_cleaning_last_clean_timestamp_seconds " in text
        if shutil.which("promtool"):
            out = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                                 capture_output=True, timeout=60)
            assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout
        # The next workload gets the node at once; the node is dirty again behind it.
        workload(kube, "train-1")
        wait_for(lambda: running(fake_api, "team", "train-1"), "train-1 running")
        wait_for(lambda: service.cleaner.counts.state == plan.STATE_IN_USE, "in use again")


def test_a_failed_suite_keeps_the_node_held_and_remediation_gets_the_failure(
        tmp_path, fake_api, kube, node, scheduler) -> None:
    with cleaning_daemon(tmp_path, kube, "row-remap-failure@gpu:2") as (env, service, consumer):
        wait_for(lambda: service.cleaner.counts.state == plan.STATE_FAILED, "failed")
        assert running(fake_api, "gpu-monitor", hold_name(NODE))  # still held
        failed = [r for r in consumer.results if r.status is Status.FAILED]
        assert {(r.check, r.target) for r in failed} == {("ecc_memory", "gpu:2")}
        # A workload that arrives now waits: the node is not given back on a fail.
        workload(kube, "train-2")
        assert node_of(fake_api, "team", "train-2") is None
        # Remediation quarantines (its record in the store): the cleaner gives the hold back.
        save_record(env.store, QuarantineRecord(op=Op.REPLACE, reason="RowRemapFailure",
                                                since=env.clock.now()))
        wait_for(lambda: service.cleaner.counts.state == plan.STATE_QUARANTINED, "quarantined")
        wait_for(lambda: fake_api.pod("gpu-monitor", hold_name(NODE)) is None, "hold given back")


def test_a_daemon_stopping_mid_suite_stops_between_checks_and_no_pass_is_recorded(
        tmp_path, fake_api, kube, node, scheduler) -> None:
    def sigterm(service) -> None:  # after the first check
        service.stop.set()

    with cleaning_daemon(tmp_path, kube, after_record=sigterm) as (env, service, consumer):
        service.thread.join(timeout=120)
        assert not service.thread.is_alive()
        last = service.suite.last
        assert last is not None and (last.stopped, last.checks_run) == ("daemon_stopping", 1)
        assert last.verdict.value == "unknown"
        mem = service.cleaner.memory()
        assert mem.dirty and mem.last_clean is None  # cleaned again after the restart
        assert running(fake_api, "gpu-monitor", hold_name(NODE))  # and held meanwhile


def test_while_the_bootstrap_gate_is_closed_the_cleaner_waits_and_its_pass_is_the_clean(
        tmp_path, fake_api, kube, node, scheduler) -> None:
    with cleaning_daemon(tmp_path, kube, gate=True) as (env, service, consumer):
        wait_for(lambda: service.cleaner.counts.state == plan.STATE_PROVISIONING,
                 "waiting for the gate")
        assert fake_api.pod("gpu-monitor", hold_name(NODE)) is None  # no second suite
        # The gate's suite passes (recorded as bootstrap_gate.py records it): that is the clean.
        env.store.set_kv(GATE_NAMESPACE, GATE_PASSED, iso(env.clock.now()))
        wait_for(lambda: service.cleaner.counts.state == plan.STATE_CLEAN, "clean")
        assert service.suite.last is None and consumer.results == []  # nothing ran twice
        assert fake_api.pod("gpu-monitor", hold_name(NODE)) is None
        # The first workload makes the node dirty; its end is cleaned as usual.
        workload(kube, "train-0")
        wait_for(lambda: service.cleaner.counts.state == plan.STATE_IN_USE, "in use")
        kube.delete_pod("team", "train-0")
        wait_for(lambda: service.cleaner.counts.released == 1, "cleaned after the workload")


@pytest.mark.parametrize("flag", [[], ["--inject", "missing@node,what=torch"]])
def test_cleaning_on_the_passive_image_is_refused_at_start_naming_the_field(
        tmp_path, capsys, flag) -> None:
    argv = ["daemon", "--simulate", "h100-sxm-8", "--config", config(tmp_path),
            "--listen", "127.0.0.1:0", "--state", str(tmp_path / "s.db"), *flag]
    if not flag:
        # The full image is not refused: shown by the same start getting past the check (the
        # daemon then runs; a SIGTERM-free way to stop it is a bad listen address).
        argv[argv.index("127.0.0.1:0")] = "999.1.1.1:99999"
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    if flag:
        assert "cleaning.enabled" in err and "torch" in err
    else:
        assert "cannot listen" in err and "cleaning.enabled" not in err
