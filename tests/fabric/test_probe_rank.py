"""fabric/probe_rank.py: what one rank sends (no process group needed)."""

from __future__ import annotations

from gpu_monitor.fabric.probe_rank import ProbeRank


def test_all_gather_sizes_are_the_gathered_total():
    assert ProbeRank.counts("all_gather", 8, 4) == (1, 16)
    assert ProbeRank.counts("all_gather", 1 << 20, 4) == (1 << 16, 1 << 20)
    assert ProbeRank.counts("all_reduce", 8, 4) == (2, 8)

