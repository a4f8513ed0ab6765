"""The simulated node a one-shot check runs on (the rig itself: tests/checks/rig.py)."""

from __future__ import annotations

import pytest

from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.model import Status


@pytest.fixture
def node(check_rig, fake_clock):
    """``node(*faults, config=, expect=)`` -> (the simulated H100 node, the one-shot Context a
    check runs with). ``expect`` changes what the profile expects, not the hardware."""

    def build(*faults, config=DEFAULT_CONFIG, expect=None):
        rig = check_rig(None, *faults, expect=expect, config=config, clock=fake_clock,
                        one_shot=True)
        return rig.node, rig.ctx()

    return build


@pytest.fixture
def without_tools(node, tmp_path):
    """``without_tools(run)``: the one-shot ``node`` with an empty PATH, where ``run(ctx)``
    says one skipped RequirementMissing, not a failure, for a check whose tool is missing."""

    def judge(run):
        _, ctx = node()
        ctx.host.commands = CommandRunner(search_path=[str(tmp_path)])
        (r,) = run(ctx).values()
        assert (r.status, r.reason) == (Status.SKIPPED, "RequirementMissing")

    return judge
