"""The simulated node a one-shot check runs on (the rig itself: tests/checks/rig.py)."""

from __future__ import annotations

import pytest

from gpu_monitor.config import DEFAULT_CONFIG


@pytest.fixture
def node(check_rig, fake_clock):
    """``node(*faults, config=, expect=)`` -> (the simulated H100 node, the one-shot Context a
    check runs with). ``expect`` changes what the profile expects, not the hardware."""

    def build(*faults, config=DEFAULT_CONFIG, expect=None):
        rig = check_rig(None, *faults, expect=expect, config=config, clock=fake_clock,
                        one_shot=True)
        return rig.node, rig.ctx()

    return build
