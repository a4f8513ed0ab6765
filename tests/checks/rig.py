"""The check rig: one check on a simulated node, driven the way the daemon or a one-shot
command drives it, on a fake clock.

The tests of tests/checks run the real check through the real readers over gpu_monitor.sim's
node (a sysfs/procfs tree on disk, the fake pynvml, fake tools on PATH). What they share lives
here once: building the node from a profile and ``--inject`` faults, the Context the check
sees, polling as the daemon polls (each poll logged with its time), moving time on, one-shot
runs through the runner, and reading results by target. The ``check_rig`` fixture
(tests/conftest.py) builds rigs and closes them after the test.

A profile changes in one of two ways. ``overrides`` change the node's profile, so the simulated
hardware is built to it (two GPUs instead of eight, no NVLink); ``expect`` changes only what
the check is told to expect while the hardware stays as built (the profile lists a port the
node lacks, another NUMA placement). The check always judges the profile with its
``simulation`` block merged in, as ``--simulate`` does.

Time is ``elapsed`` seconds since the node started; every way of moving it defaults to the
check's own poll interval, the period the daemon polls it at.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpu_monitor.check import Check, Context
from gpu_monitor.clock import Clock, FakeClock
from gpu_monitor.config import DEFAULT_CONFIG, Config, parse_config
from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.model import Result, Status
from gpu_monitor.profiles import Profile, load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.sim.fake_nvml import FakeNvml
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.state import Store

Results = dict[str, Result]


class NodeClock(FakeClock):
    """A fake clock that moves the simulated hardware on while a check sleeps on it (a
    one-shot rdma_ports watches a down port for a while before it judges)."""

    def __init__(self) -> None:
        super().__init__()
        self.node: SimulatedNode | None = None
        self.t0 = self.monotonic()

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.node is not None:
            self.node.advance(self.monotonic() - self.t0)


class CheckRig:
    """A simulated node, a clock, a store and one check instance.

    ``check``: the check, or its class for a fresh instance per rig; None for tests that call
    the check's entry points themselves. ``store``:
    True for a fresh in-memory store on the rig's clock, False for none, or the Store to use.
    ``clock``: a clock or a clock class (``NodeClock``), a FakeClock by default. Replacing
    ``check`` (same store) is how a test restarts the daemon; replacing ``store`` is how it
    loses the history.
    """

    def __init__(self, check: Check | type[Check] | None = None, *faults: Any,
                 profile: str | Profile = "h100-sxm-8", overrides: Mapping | None = None,
                 expect: Mapping | None = None, config: Config = DEFAULT_CONFIG,
                 store: Store | bool = True, one_shot: bool = False,
                 clock: Clock | type[Clock] | None = None,
                 watch: str | None = None) -> None:
        base = load_profile(profile) if isinstance(profile, str) else profile
        built = base.with_overrides(overrides) if overrides else base
        self.node = SimulatedNode(built, [parse(f) if isinstance(f, str) else f for f in faults])
        self.profile = (built.with_overrides(expect) if expect else built).for_simulation()
        self.host = self.node.host()
        clock = FakeClock if clock is None else clock
        self.clock = clock() if isinstance(clock, type) else clock
        if isinstance(self.clock, NodeClock):
            self.clock.node = self.node
        if store is True:
            store = Store.open(":memory:", self.clock)
        self.store: Store | None = None if store is False else store
        self.check = check() if isinstance(check, type) else check
        self.config = config
        self.one_shot = one_shot
        self.watch = watch
        self.elapsed = 0.0
        self.log: list[tuple[float, Results]] = []

    @property
    def gpus(self):
        return self.node.spec.gpus

    @property
    def interval(self) -> float:
        """The check's poll period: the default step of time."""
        return float(self.check.interval) if self.check is not None else 1.0

    def ctx(self, one_shot: bool | None = None) -> Context:
        """The Context the check sees now (the rig's current store, clock and profile)."""
        return Context(host=self.host, profile=self.profile, config=self.config,
                       clock=self.clock, store=self.store,
                       one_shot=self.one_shot if one_shot is None else one_shot)

    def close(self) -> None:
        self.host.close()
        self.node.close()

    # --- the node and time -----------------------------------------------------------------

    def advance(self, seconds: float | None = None) -> None:
        """Time passes (the clock and ``elapsed``); the node is not re-rendered, nothing polled."""
        seconds = self.interval if seconds is None else seconds
        self.clock.advance(seconds)
        self.elapsed += seconds

    def sync(self) -> None:
        """Render the node at ``elapsed``: the faults due by then and what the test changed in
        its spec."""
        self.node.advance(self.elapsed)

    def set_uptime(self, seconds: float) -> None:
        self.node.spec.uptime_s = seconds
        self.sync()  # re-renders /proc/uptime

    # --- the daemon's polls ----------------------------------------------------------------

    def poll(self) -> Results:
        """One poll of the node as it is now, logged with its time; results by target."""
        results = {r.target: r for r in self.check.poll(self.ctx())}
        self.log.append((self.elapsed, results))
        return results

    def poll_says(self, target: str, status: Status, reason: str) -> Result:
        """``poll``, where ``target`` says ``status`` for ``reason``; its result."""
        res = self.poll()[target]
        assert (res.status, res.reason) == (status, reason), res.message
        return res

    def step(self, seconds: float | None = None) -> Results:
        """The next poll, ``seconds`` later, with the node brought to that time first."""
        self.advance(seconds)
        self.sync()
        return self.poll()

    def run_until(self, t: float, step: float | None = None) -> Results:
        """Poll every ``step`` seconds after now up to ``t`` (the last step cut short to land
        on it), never at now; the last poll's results."""
        step = self.interval if step is None else step
        out: Results = {}
        while self.elapsed < t:
            self.clock.advance(min(step, t - self.elapsed))
            self.elapsed = min(self.elapsed + step, t)
            self.sync()
            out = self.poll()
        return out

    def run_to(self, t_end: float, every: float | None = None) -> Results:
        """Poll at now (unless already polled now) and every ``every`` seconds up to and
        including ``t_end``; the last poll's results.

        The node is rendered once first (what the test changed in its spec), then only when a
        scheduled fault is due, so files a test wrote by hand stay until something changes."""
        every = self.interval if every is None else every
        self.sync()
        last: Results = {}
        if self.log and self.log[-1][0] == self.elapsed:
            self.advance(every)
        while self.elapsed <= t_end + 1e-9:
            self.node.advance(self.elapsed, always_render=False)
            last = self.poll()
            if self.elapsed + every > t_end + 1e-9:
                break
            self.advance(every)
        return last

    def history(self, target: str | None = None) -> list[tuple[float, Status, str]]:
        """(time, status, reason) of one target (default: ``watch``) at every change."""
        target = self.watch if target is None else target
        out: list[tuple[float, Status, str]] = []
        for t, results in self.log:
            r = results[target]
            if not out or out[-1][1:] != (r.status, r.reason):
                out.append((t, r.status, r.reason))
        return out

    # --- one-shot runs ---------------------------------------------------------------------

    def one_shot_run(self) -> Results:
        """A fresh instance of the check run one-shot (a bootstrap) on the node as it is now."""
        self.sync()
        return {r.target: r for r in type(self.check)().run(self.ctx(one_shot=True))}


def rig_fixture(check: type[Check], **kw: Any):
    """A test module's ``rig`` fixture: ``rig(*faults, **more)`` builds a ``CheckRig`` of
    ``check`` with ``kw`` (through ``check_rig``, so it is closed after the test). A module
    says ``rig = rig_fixture(Check, ...)``."""

    @pytest.fixture
    def rig(check_rig):
        return partial(check_rig, check, **kw)

    return rig


def judged_fixture(check: type[Check], **run_kw: Any):
    """A test module's ``judged`` fixture: ``judged(*faults, config=, expect=)`` builds the
    one-shot ``node`` with those faults and returns a fresh ``check`` run once on it through
    the runner (``run_once`` with ``run_kw``), results by target. A module says
    ``judged = judged_fixture(Check)``; a test that edits the node before the run uses
    ``node`` itself."""

    @pytest.fixture
    def judged(node):
        def judge(*faults: Any, **kw: Any) -> Results:
            _, ctx = node(*faults, **kw)
            return run_once(check(), ctx, **run_kw)

        return judge

    return judged


def healthy_poll(rig: CheckRig, count: int = 8) -> Results:
    """The first poll of a healthy node: one result per GPU (``count`` of them), each OK and
    naming its GPU's uuid; the results by target."""
    results = rig.poll()
    assert sorted(results) == [f"gpu:{i}" for i in range(count)]
    for i, gpu in enumerate(rig.gpus):
        res = results[f"gpu:{i}"]
        assert res.status is Status.OK, (res.target, res.reason)
        assert res.details["uuid"] == gpu.uuid
    return results


def enumeration_fails(rig: CheckRig, error: str = "Unknown") -> None:
    """A poll with ``nvmlDeviceGetCount`` failing with ``error``: the check says one unknown
    NvmlReadError for the node (no GPU is known to judge), not one per GPU."""
    rig.host.nvml = NvmlReader(FakeNvml(rig.node.spec, {"nvmlDeviceGetCount": error}))
    (res,) = rig.check.poll(rig.ctx())
    assert (res.target, res.status, res.reason) == ("node", Status.UNKNOWN, "NvmlReadError")


def mig_still_judged(rig: CheckRig, target: str, reason: str,
                     until: float | None = None) -> Results:
    """Every GPU of the node in MIG mode (as NVML then reports it), and the check still judges:
    ``target`` says ``reason`` at the next poll (or polling ``until`` that time) while gpu:1
    stays OK. The results by target."""
    for gpu in rig.gpus:
        gpu.mig_enabled = True
    assert rig.host.nvml.mig_enabled(0)
    results = rig.poll() if until is None else rig.run_until(until)
    assert results[target].reason == reason
    assert results["gpu:1"].status is Status.OK
    return results


# The NVML errors that leave a per-GPU read undecided (unknown NvmlReadError) in every check
# that reads the GPU: (error name, status, reason), rows of a test's parameter table.
NVML_READ_ERRORS = [(error, Status.UNKNOWN, "NvmlReadError") for error in (
    "Unknown", "NoPermission", "Timeout", "InvalidArgument", "Uninitialized", "DriverNotLoaded",
    "InsufficientResources")]


# --- reading results ---------------------------------------------------------------------------


def by_target(results: Iterable[Result]) -> Results:
    return {r.target: r for r in results}


def one_per_target(results: Iterable[Result]) -> Results:
    """Results by target, holding the check to one result per target."""
    results = list(results)
    out = by_target(results)
    assert len(out) == len(results), "one result per target"
    return out


def not_ok(res: Results) -> dict[str, tuple[Status, str]]:
    return {t: (r.status, r.reason) for t, r in res.items() if r.status is not Status.OK}


def all_ok(res: Results, targets: Iterable[str]) -> None:
    """A healthy node's results: exactly ``targets``, none of them anything but OK."""
    assert sorted(res) == sorted(targets)
    assert not_ok(res) == {}


def run_once(check: Check, ctx: Context, succeed: bool = True) -> Results:
    """``check`` through the runner (requirement gate, timeout, crash capture), as
    ``gpu-monitor check`` runs it: one result per target."""
    outcome = run_check(check, ctx)
    if succeed:
        assert outcome.success, outcome.error
    return one_per_target(outcome.results)


def simulated_rig(check: Check, count: int = 8, faults: Iterable[str] = (),
                  settings: Mapping | None = None, env: Mapping[str, str] | None = None,
                  nvml_wrapper: Callable | None = None,
                  spec_edit: Callable | None = None) -> CheckRig:
    """A one-shot rig for an active check: a simulated H100 node with ``count`` devices (CPU
    workers), ``settings`` as the check's config section, real time (the workers' deadlines
    are real) and no store. The caller closes it.

    ``env`` goes to the workers (the test-fault seams), ``nvml_wrapper`` wraps the host's NVML
    reader, ``spec_edit`` changes the simulated hardware before the run."""
    rig = CheckRig(check, *faults, overrides={"gpu": {"count": count}},
                   config=parse_config({"checks": {check.name: dict(settings or {})}}),
                   clock=Clock(), store=False, one_shot=True)
    try:
        if spec_edit is not None:
            spec_edit(rig.node.spec)
        rig.host.worker.env.update(env or {})
        if nvml_wrapper is not None:
            rig.host.nvml = nvml_wrapper(rig.host.nvml)
    except BaseException:
        rig.close()
        raise
    return rig


def run_simulated(check: Check, count: int = 8, faults: Iterable[str] = (), **kw: Any) -> Results:
    """``check`` run once through the runner on a ``simulated_rig``; results by target."""
    rig = simulated_rig(check, count, faults, **kw)
    try:
        outcome = run_check(check, rig.ctx())
    finally:
        rig.close()
    assert outcome.success, outcome.results
    return by_target(outcome.results)


# --- misbehaving tools -------------------------------------------------------------------------


def fake_tool(tmp_path: Path, name: str, source: str,
              files: Mapping[str, str] | None = None) -> CommandRunner:
    """A command runner whose PATH holds one program ``name``: the Python ``source``, which
    finds ``files`` (name -> text, written beside it) in the directory ``here``."""
    bin_dir = tmp_path / "bad-bin"
    bin_dir.mkdir(exist_ok=True)
    for file, text in (files or {}).items():
        (bin_dir / file).write_text(text)
    script = bin_dir / name
    script.write_text(f"#!{sys.executable}\nimport os\n"
                      "here = os.path.dirname(os.path.abspath(__file__))\n"
                      + textwrap.dedent(source))
    script.chmod(0o755)
    return CommandRunner(search_path=[str(bin_dir)])
