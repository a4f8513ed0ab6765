"""The fail-fast notice as the daemon wires it (``make_failfast``), end to end on the simulated
node: a real process registered as GPU 0's holder (``--inject gpu-process``), NVML
attribution, mlx5_0:1 down past NCCL's tolerance, the daemon's real loop on the real clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import datetime, timezone

from checks.rdma_ports import RdmaPorts
from gpu_monitor.cli import build_env, build_parser
from gpu_monitor.daemon import Daemon, _attribution, make_failfast
from gpu_monitor.daemon_kmsg import KV_FILE_POS
from gpu_monitor.state import Store
from tests.waiting import eventually


def test_the_daemon_signals_the_holder_of_the_ports_gpu_and_leaves_its_notice(tmp_path):
    notices = tmp_path / "notices"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "nccl: {ib_timeout: 14}\n"  # a 0.47 s tolerance: the test waits seconds, not 7.5 s
        "workloads: {source: nvml, refresh_s: 0.2, timeout_s: 0.1}\n"
        f"failfast: {{actions: [signal, file], dry_run: false, notice_dir: '{notices}'}}\n")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    env = build_env(build_parser().parse_args([
        "daemon", "--simulate", "h100-sxm-8", "--config", str(cfg),
        "--state", str(tmp_path / "state.db"),
        "--inject", f"gpu-process@gpu:0,pid={holder.pid}",
        "--inject", f"gpu-process@gpu:5,pid={bystander.pid}",  # on mlx5_5: not told
        "--inject", "port-down@ib:mlx5_0:1,after=2,for=600"]))
    attribution = _attribution(env)
    attribution.start()
    env.host.start(env.clock)
    failfast = make_failfast(env, attribution)
    assert failfast is not None and failfast.actions == ("file", "signal")
    daemon = Daemon([RdmaPorts()], env.context(force=False, one_shot=False),
                    failfast=failfast)
    loop = threading.Thread(target=daemon.run, daemon=True)
    loop.start()
    try:
        eventually(lambda: holder.poll() is not None, timeout=120, what="the holder signalled")
        assert holder.returncode == -signal.SIGTERM
        assert os.path.exists(notices / f"pid-{holder.pid}.json")
        record = eventually(lambda: next(iter(failfast.book.notices().values()), {})
                            .get("result") == "notified" and failfast.book.notices(),
                            timeout=60)
        (rec,) = record.values()
        assert rec["gpus"] == [0] and rec["workloads"] == [f"pid {holder.pid}"]
        assert bystander.poll() is None
    finally:
        daemon.stop()
        loop.join(timeout=30)
        attribution.stop()
        for p in (holder, bystander):
            p.kill()
            p.wait()
        env.close()



def test_a_fatal_xid_in_the_kernel_log_notifies_its_gpus_holder_once_across_a_restart(tmp_path):
    """failfast.on_xid on the real path: an Xid 79 line for GPU 0 in the followed kernel log,
    the daemon's follower hands it to the real xid check, and its failed result (not one built
    by hand) triggers the notice; a restarted daemon replays the same line and notifies
    nobody again."""
    from checks.xid import Xid

    notices = tmp_path / "notices"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "workloads: {source: nvml, refresh_s: 0.2, timeout_s: 0.1}\n"
        f"failfast: {{actions: [file], dry_run: false, on_xid: true, notice_dir: '{notices}'}}\n")
    kern = tmp_path / "kern.log"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
    kern.write_text("mlx5_core 0000:3b:00.0: an ordinary line\n"
                    f"{now} NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, "
                    "GPU has fallen off the bus.\n")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    argv = ["daemon", "--simulate", "h100-sxm-8", "--config", str(cfg), "--kmsg", str(kern),
            "--state", str(tmp_path / "state.db"),
            "--inject", f"gpu-process@gpu:0,pid={holder.pid}",
            "--inject", f"gpu-process@gpu:1,pid={bystander.pid}"]

    def daemon_until(done):
        env = build_env(build_parser().parse_args(argv))
        attribution = _attribution(env)
        attribution.start()
        env.host.start(env.clock)
        failfast = make_failfast(env, attribution)
        daemon = Daemon([Xid()], env.context(force=False, one_shot=False), failfast=failfast)
        loop = threading.Thread(target=daemon.run, daemon=True)
        loop.start()
        try:
            eventually(lambda: done(daemon, failfast), timeout=120, what="the daemon's answer")
        finally:
            daemon.stop()
            loop.join(timeout=30)
            attribution.stop()
        try:  # what the store holds once the daemon stopped
            return failfast.book.notices(), failfast.book.counts()
        finally:
            env.close()

    try:
        notices_held, _ = daemon_until(lambda _d, ff: ff.book.notices())
        ((key, rec),) = notices_held.items()
        assert key.startswith("gpu:0@") and rec["result"] == "notified" and rec["gpus"] == [0]
        assert rec["workloads"] == [f"pid {holder.pid}"]
        assert (notices / f"pid-{holder.pid}.json").exists()
        assert not (notices / f"pid-{bystander.pid}.json").exists()
        # The restart reads the log from its start (its saved position lost, as after a
        # rotation it cannot follow): the xid check knows the line, and nobody is told again.
        (notices / f"pid-{holder.pid}.json").unlink()
        store = Store.open(str(tmp_path / "state.db"))
        assert store.delete_kv(KV_FILE_POS, str(kern))
        store.close()
        notices_held, counts = daemon_until(
            lambda d, _ff: d.replayed.is_set() and d.stats.kmsg_read >= 2)
        assert counts[("notice", "notified")] == 1 and len(notices_held) == 1
        assert not (notices / f"pid-{holder.pid}.json").exists()
    finally:
        for p in (holder, bystander):
            p.kill()
            p.wait()
