"""The fail-fast notice as the daemon wires it (``make_failfast``), end to end on the simulated
node: a real process registered as GPU 0's holder (``--inject gpu-process``), NVML
attribution, mlx5_0:1 down past NCCL's tolerance, the daemon's real loop on the real clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from checks.rdma_ports import RdmaPorts
from gpu_monitor.cli import build_env, build_parser
from gpu_monitor.daemon import Daemon, _attribution, make_failfast
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
