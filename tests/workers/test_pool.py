"""The worker framework: subprocess per device, hard timeouts, named causes, no torch in the
parent; the simulation seam; and (``gpu`` marker) the CUDA identity of workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gpu_monitor.host import WorkerSettings
from gpu_monitor.workers.faults import TEST_FAULT_ENV, TestFault, parse_test_faults
from gpu_monitor.workers.pool import DeviceRef, Outcome, Task, WorkerPool, _blame, _check_uuids

PROBE = "gpu_monitor.workers.device:probe"


def cpu_pool(fork: bool = True, **env: str) -> WorkerPool:
    return WorkerPool(WorkerSettings(device_type="cpu", env=dict(env)), fork_server=fork)


BOTH = pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])


def probe_tasks(n: int, **args) -> list[Task]:
    return [Task(PROBE, (DeviceRef(i, f"GPU-test-{i}"),), args) for i in range(n)]


def cuda_count() -> int:
    """CUDA devices torch sees; 0 without a driver (torch is not imported then)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# --- the parent never imports torch ------------------------------------------------------------


def test_running_workers_and_an_active_check_never_imports_torch_in_the_parent():
    code = textwrap.dedent("""
        import sys
        from gpu_monitor.config import parse_config
        from gpu_monitor.check import Context
        from gpu_monitor.profiles import load_profile
        from gpu_monitor.runner import run_check
        from gpu_monitor.sim.node import SimulatedNode
        from gpu_monitor.workers.pool import DeviceRef, Task, WorkerPool
        from gpu_monitor.host import WorkerSettings
        from checks.nvlink_peer import NvlinkPeer

        pool = WorkerPool(WorkerSettings(device_type="cpu"))
        (out,) = pool.run([Task("gpu_monitor.workers.device:probe", (DeviceRef(0, "GPU-x"),))],
                          timeout_s=60, rounds=1)
        assert out.ok, out.message
        prof = load_profile("h100-sxm-8").with_overrides({"gpu": {"count": 2}})
        sim = SimulatedNode(prof)
        ctx = Context(host=sim.host(), profile=prof.for_simulation(), config=parse_config({}))
        outcome = run_check(NvlinkPeer(), ctx)
        sim.close()
        assert outcome.success, outcome.results
        assert [r for r in outcome.results if r.target == "p2p:0:1"][0].status.value == "ok"
        print(",".join(m for m in ("torch", "numpy") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch" not in out.stdout.strip().split(","), out.stdout


# --- what a worker sees --------------------------------------------------------------------------


def test_cpu_worker_runs_one_thread_in_pci_order_and_reports_the_uuid_it_was_given():
    (out,) = cpu_pool().run(probe_tasks(1), timeout_s=60, rounds=1)
    assert out.ok, out.message
    assert out.value["threads"] == 1
    assert out.value["cuda_device_order"] == "PCI_BUS_ID"
    assert out.uuids == ("GPU-test-0",)
    assert out.value["devices"][0]["torch"] == "cpu"
    assert out.value["devices"][0]["seam"] is None  # no simulation state named: no seam


def test_cpu_devices_take_turns_one_at_a_time_in_rounds():
    outs = cpu_pool().run(probe_tasks(2, steps=2, sleep_s=0.02), timeout_s=60)
    assert all(o.ok for o in outs), [o.message for o in outs]
    spans = sorted((t["start"], t["end"], o.task.name) for o in outs for t in o.value["turns"])
    assert len(spans) == 2 * 3  # two devices, three rounds each
    for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
        assert end <= start, "two devices measured at the same time"
    assert [name for *_, name in spans] == ["gpu:0", "gpu:1"] * 3


# --- failures become named causes ------------------------------------------------------------------


@BOTH
def test_each_kind_of_worker_failure_names_the_device_and_the_cause(fork):
    faults = "crash@gpu:0,at=setup;exit@gpu:1,at=setup;error@gpu:2,at=setup;garbage@gpu:3,at=setup"
    outs = cpu_pool(fork, **{TEST_FAULT_ENV: faults}).run(probe_tasks(5), timeout_s=60,
                                                            rounds=1)
    by = {o.task.name: o for o in outs}
    assert by["gpu:0"].cause == "signal"
    assert by["gpu:0"].message.startswith("worker for gpu:0 exited with signal 11 (SIGSEGV)")
    assert by["gpu:1"].cause == "exit"
    assert "worker for gpu:1 exited with status 3 without a result" in by["gpu:1"].message
    assert by["gpu:2"].cause == "error"
    assert "worker for gpu:2 failed: RuntimeError: injected test fault" in by["gpu:2"].message
    assert by["gpu:3"].cause == "bad-result"
    assert "unreadable result" in by["gpu:3"].message
    assert by["gpu:4"].ok  # the healthy device is unaffected
    assert {o.reason for o in outs if not o.ok} == {"WorkerCrashed"}


@BOTH
def test_a_worker_whose_interpreter_fails_to_start_is_a_crash_with_the_reason(fork):
    pool = WorkerPool(WorkerSettings(device_type="cpu"), python=shutil.which("false"),
                      fork_server=fork)
    (out,) = pool.run(probe_tasks(1), timeout_s=30, rounds=1)
    assert not out.ok and out.reason == "WorkerCrashed"
    if fork:
        assert out.message.startswith("worker for gpu:0 was lost: the fork server exited")
    else:
        assert out.message == "worker for gpu:0 exited with status 1 without a result"


@BOTH
def test_a_hung_worker_is_killed_with_its_process_group_at_the_timeout(fork):
    pool = cpu_pool(fork, **{TEST_FAULT_ENV: "hang@gpu:0,at=setup"})
    started = time.monotonic()
    # The start-up limit counts from the request, and the fork server imports torch before it
    # forks: long enough that, on a loaded machine too, the worker exists and hangs in its
    # set-up when the limit strikes (a worker cancelled before it was forked has no exit
    # status to show).
    (out,) = pool.run(probe_tasks(1), timeout_s=30, setup_timeout_s=8, rounds=1)
    assert time.monotonic() - started < 60
    assert out.cause == "timeout" and out.reason == "WorkerTimeout"
    assert out.message == "worker for gpu:0 timed out after 8 s while starting up"
    assert out.returncode == -signal.SIGKILL


def test_a_worker_that_hangs_in_its_turn_is_named_and_the_others_still_finish():
    pool = cpu_pool(**{TEST_FAULT_ENV: "hang@gpu:1,at=2"})
    outs = pool.run(probe_tasks(2, steps=3), timeout_s=5, rounds=1)
    assert outs[0].ok
    assert outs[1].cause == "timeout"
    assert outs[1].message == "worker for gpu:1 timed out after 5 s (at probe step 0)"
    assert outs[1].steps == 1


@BOTH
def test_in_a_gang_the_first_failure_stops_every_other_rank(fork):
    pool = cpu_pool(fork, **{TEST_FAULT_ENV: "crash@gpu:1,at=turn"})
    outs = pool.run(probe_tasks(3, steps=200, sleep_s=0.05), timeout_s=30, gang=True)
    assert outs[1].cause == "signal"
    assert [o.cause for o in (outs[0], outs[2])] == ["aborted", "aborted"]
    assert "because the worker for gpu:1 failed" in outs[0].message


@BOTH
def test_workers_exit_when_their_parent_is_killed(fork):
    import psutil

    script = textwrap.dedent(f"""
        from gpu_monitor.host import WorkerSettings
        from gpu_monitor.workers.pool import DeviceRef, Task, WorkerPool
        pool = WorkerPool(WorkerSettings(device_type="cpu",
                                         env={{"{TEST_FAULT_ENV}": "hang@gpu:0,at=setup"}}),
                          fork_server={fork})
        pool.run([Task("{PROBE}", (DeviceRef(0),))], timeout_s=600, setup_timeout_s=600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        children: list = []
        while time.monotonic() < deadline and len(children) < (2 if fork else 1):
            children = psutil.Process(parent.pid).children(recursive=True)
            time.sleep(0.05)
        assert len(children) == (2 if fork else 1), "the pool never started its worker"
        time.sleep(0.5)  # let the worker reach its hang
        parent.kill()
        parent.wait()
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"workers outlived their parent: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()


def _failed(i, cause, at=None):
    return Outcome(Task(PROBE, (DeviceRef(i),)), None, cause, f"m{i}", failed_at=at)


def test_in_a_gang_a_rank_that_died_is_blamed_and_peers_that_raised_after_it_are_stopped():
    ok = Outcome(Task(PROBE, (DeviceRef(3),)), {"x": 1})
    outs = _blame([_failed(0, "error", 5.0), _failed(1, "signal"), _failed(2, "error", 1.0), ok])
    assert [o.cause for o in outs] == ["aborted", "signal", "aborted", ""]
    assert "because the worker for gpu:1 failed (signal); its own error: m0" in outs[0].message


def test_in_a_gang_where_every_rank_raised_the_first_to_raise_is_blamed():
    outs = _blame([_failed(0, "error", 5.0), _failed(1, "error", 2.0), _failed(2, "error", 9.0)])
    assert [o.cause for o in outs] == ["aborted", "error", "aborted"]


def test_a_worker_reporting_another_device_is_a_mismatch_not_a_result():
    task = Task(PROBE, (DeviceRef(3, "GPU-aaa"),))
    common = dict(returncode=0, duration_s=1.0, steps=0, phase="", log_tail="")
    out = _check_uuids(task, {"x": 1}, ("GPU-bbb",), common)
    assert out.cause == "mismatch" and out.reason == "WorkerDeviceMismatch"
    assert "opened GPU-bbb, but NVML says gpu:3 is GPU-aaa" in out.message
    assert _check_uuids(task, {"x": 1}, ("GPU-aaa",), common).ok


@pytest.mark.parametrize("text, label, expected", [
    ("hang@gpu:1", "gpu:1", [TestFault("hang", "turn")]),
    ("hang@gpu:1", "gpu:2", []),
    ("crash@gpu:0,at=setup; exit@gpu:0,at=7", "gpu:0",
     [TestFault("crash", "setup"), TestFault("exit", "7")]),
    ("", "gpu:0", []),
], ids=["match", "other-device", "two-entries", "empty"])
def test_test_fault_entries_are_parsed_per_worker(text, label, expected):
    assert parse_test_faults(text, label) == expected


@pytest.mark.parametrize("text", ["melt@gpu:0", "hang-gpu:0", "hang@gpu:0,when=1"])
def test_malformed_test_fault_entries_are_rejected(text):
    with pytest.raises(ValueError, match=TEST_FAULT_ENV):
        parse_test_faults(text, "gpu:0")


def test_outcome_details_carry_the_cause_for_reports():
    o = Outcome(Task(PROBE, (DeviceRef(2),)), None, "timeout", "m", -9, 3.21, 5, "x",
                log_tail="tail")
    assert o.details == {"worker": "gpu:2", "cause": "timeout", "returncode": -9,
                         "duration_s": 3.21, "phase": "x", "steps": 5, "log_tail": "tail"}


# --- the simulation seam --------------------------------------------------------------------------


def _state(tmp_path, **gpu1):
    path = tmp_path / "sim-state.json"
    gpus = [{"index": 0, "uuid": "GPU-a", "speed_factor": 1.0, "wrong_results": False},
            {"index": 1, "uuid": "GPU-b", "speed_factor": 1.0, "wrong_results": False, **gpu1}]
    path.write_text(json.dumps({"gpus": gpus}))
    return {"GPU_MONITOR_SIM_STATE": str(path)}


def test_the_device_seam_the_settings_name_reaches_each_device(tmp_path):
    settings = WorkerSettings(device_type="cpu", env=_state(tmp_path, speed_factor=3.0),
                              device_seam="gpu_monitor.sim.worker:seam_for")
    outs = WorkerPool(settings).run([Task(PROBE, (DeviceRef(0, "GPU-a"),)),
                                     Task(PROBE, (DeviceRef(1, "GPU-b"),))],
                                    timeout_s=60, rounds=1)
    assert all(o.ok for o in outs), [o.message for o in outs]
    seams = [o.value["devices"][0]["seam"] for o in outs]
    assert seams == [None, {"speed_factor": 3.0, "wrong_results": False}]


def test_without_a_named_seam_the_simulation_state_reaches_no_device(tmp_path):
    """Worker code never looks for the simulator by itself: the parent names the seam."""
    settings = WorkerSettings(device_type="cpu", env=_state(tmp_path, speed_factor=3.0))
    (out,) = WorkerPool(settings).run([Task(PROBE, (DeviceRef(1, "GPU-b"),))], timeout_s=60,
                                      rounds=1)
    assert out.ok, out.message
    assert out.value["devices"][0]["seam"] is None


def test_no_seam_without_the_simulation_state_variable():
    from gpu_monitor.sim.worker import seam_for

    assert seam_for("GPU-a", 0, environ={}) is None


def test_seam_finds_the_device_by_uuid_before_index(tmp_path):
    from gpu_monitor.sim.worker import seam_for

    env = _state(tmp_path, speed_factor=3.0, wrong_results=True)
    seam = seam_for("GPU-b", 0, environ=env)
    assert (seam.index, seam.speed_factor, seam.wrong_results) == (1, 3.0, True)
    assert not seam_for("GPU-a", 1, environ=env).active


def test_unreadable_simulation_state_is_an_error_not_a_healthy_device(tmp_path):
    from gpu_monitor.sim.worker import seam_for

    with pytest.raises(RuntimeError, match="cannot read the simulation state"):
        seam_for("GPU-a", 0, environ={"GPU_MONITOR_SIM_STATE": str(tmp_path / "nope.json")})


def test_a_slow_device_is_stretched_by_its_factor():
    from gpu_monitor.sim.worker import Seam

    slept: list[float] = []
    assert Seam("GPU-a", 0, speed_factor=3.0).account(0.5, sleep=slept.append) == 1.0
    assert Seam("GPU-a", 0).account(0.5, sleep=slept.append) == 0.0
    assert slept == [1.0]


def test_a_cpu_devices_compute_clock_counts_its_work_and_its_stretch_not_its_waiting():
    """Burn-in times a CPU device by this thread's CPU time: a thread that waits (for the
    host's scheduler, here for a sleep) does not age the clock, a slow device's stretch does."""
    from gpu_monitor.sim.worker import Seam
    from gpu_monitor.workers.device import Device

    dev = Device("cpu", 0, "GPU-a", seam=Seam("GPU-a", 0, speed_factor=3.0))
    wall0, t0 = time.perf_counter(), dev.compute_clock()
    time.sleep(0.2)
    waited_wall, waited_clock = time.perf_counter() - wall0, dev.compute_clock() - t0
    assert waited_clock < waited_wall / 2
    t1 = dev.compute_clock()
    dev.account(0.05)  # the seam sleeps 0.1 s and says so
    assert dev.stretched_s == pytest.approx(0.1)
    assert dev.compute_clock() - t1 >= 0.1
    healthy = Device("cpu", 1, "GPU-b", seam=Seam("GPU-b", 1))
    healthy.account(0.05)
    assert healthy.stretched_s == 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_wrong_results_flip_one_stuck_bit_that_survives_a_sum(dtype):
    import torch

    from gpu_monitor.sim.worker import Seam

    t = torch.full((9,), 3.0, dtype=getattr(torch, dtype))
    before = t.clone()
    Seam("GPU-a", 0, wrong_results=True).corrupt(t)
    changed = (t != before).nonzero().flatten().tolist()
    assert changed == [3]
    assert abs(float(t[3]) - 3.0) >= 0.5  # large enough that an exact sum notices
    again = before.clone()
    Seam("GPU-a", 0, wrong_results=True).corrupt(again)
    assert torch.equal(again, t)  # wrong the same way every time


def test_torch_uuid_text_is_normalised_to_nvml_form():
    from gpu_monitor.workers.device import normalize_uuid

    assert normalize_uuid("5d7a3a9e-0b1c-4d2e-8f90-123456789abc") == \
        "GPU-5d7a3a9e-0b1c-4d2e-8f90-123456789abc"
    assert normalize_uuid("GPU-5d7a") == "GPU-5d7a"


# --- CUDA (``gpu`` marker: skipped where CUDA is absent) -------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() == 0, reason="needs CUDA")
def test_torch_uuid_equals_nvml_uuid_for_every_index():
    from gpu_monitor.hw.nvml_reader import NvmlReader

    with NvmlReader() as nvml:
        nvml_uuids = [g.uuid for g in nvml.gpus()]
    pool = WorkerPool(WorkerSettings(device_type="cuda"))
    (out,) = pool.run([Task(PROBE, (DeviceRef(0, None),))], timeout_s=120)
    assert out.ok, out.message
    assert out.value["cuda_uuids"] == nvml_uuids  # CUDA_DEVICE_ORDER=PCI_BUS_ID: same order


@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() == 0, reason="needs CUDA")
def test_cuda_workers_open_each_device_by_its_nvml_uuid():
    from gpu_monitor.hw.nvml_reader import NvmlReader

    with NvmlReader() as nvml:
        refs = [DeviceRef(g.index, g.uuid) for g in nvml.gpus()]
    pool = WorkerPool(WorkerSettings(device_type="cuda"))
    outs = pool.run([Task(PROBE, (r,)) for r in refs], timeout_s=120)
    for ref, out in zip(refs, outs, strict=True):
        assert out.ok, out.message
        assert out.uuids == (ref.uuid,)
        assert out.value["devices"][0]["torch"].startswith("cuda:")


@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() == 0, reason="needs CUDA")
def test_a_cuda_worker_asked_for_an_unknown_uuid_fails_with_the_reason():
    pool = WorkerPool(WorkerSettings(device_type="cuda"))
    (out,) = pool.run([Task(PROBE, (DeviceRef(0, "GPU-00000000-dead-beef"),))], timeout_s=120)
    assert out.cause == "error"
    assert "is not among the CUDA devices" in out.message


def test_environment_of_workers_pins_device_order_and_import_path():
    env = cpu_pool().environment("checks.burn_in:burn_worker")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["OMP_NUM_THREADS"] == "1"
    roots = env["PYTHONPATH"].split(os.pathsep)
    assert any(os.path.isdir(os.path.join(r, "checks")) for r in roots)
    assert any(os.path.isdir(os.path.join(r, "gpu_monitor")) for r in roots)
