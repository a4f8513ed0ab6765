"""``Context.setting`` keeps what it read while config and profile cannot change, and only then.

The follower asks a few settings per kernel-log event; reading them through the config and the
profile each time was a measurable part of an Xid storm (issue 18). The answers must stay what
the lookup gives: a new config or profile assigned to the context is read afresh, and a config
or profile that could change under it (a stub, plain dicts) is never cached.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.profiles import load_profile
from gpu_monitor.profiles.settings import UndeclaredSetting


@pytest.fixture
def profile():
    return load_profile("h100-sxm-8").for_simulation()


def test_a_new_profile_or_config_is_read_afresh(profile) -> None:
    ctx = Context(host=None, profile=profile, config=DEFAULT_CONFIG)
    assert ctx.setting("xid", "app_xid_window_s") == 86400
    ctx.profile = profile.with_overrides({"checks": {"xid": {"app_xid_window_s": 60}}})
    assert ctx.setting("xid", "app_xid_window_s") == 60
    ctx.config = dataclasses.replace(DEFAULT_CONFIG,
                                     checks={"xid": {"app_xid_window_s": 5}})
    assert ctx.setting("xid", "app_xid_window_s") == 5
    assert ctx.setting("xid", "replay_max_age_s", 1) == 7200
    with pytest.raises(UndeclaredSetting):
        ctx.setting("xid", "no_such_key")
    with pytest.raises(UndeclaredSetting):  # still raised when asked again
        ctx.setting("xid", "no_such_key")


def test_a_config_of_plain_dicts_is_read_every_time(profile) -> None:
    """Config(checks=...) built with plain dicts (tests do) could change in place."""
    blocks = {"xid": {"app_xid_window_s": 5}}
    ctx = Context(host=None, profile=profile,
                  config=dataclasses.replace(DEFAULT_CONFIG, checks=blocks))
    assert ctx.setting("xid", "app_xid_window_s") == 5
    blocks["xid"]["app_xid_window_s"] = 7
    assert ctx.setting("xid", "app_xid_window_s") == 7


def test_a_default_applies_to_an_unset_value_each_time(profile) -> None:
    ctx = Context(host=None, profile=profile, config=DEFAULT_CONFIG)
    assert ctx.setting("xid", "required", "first") == "first"
    assert ctx.setting("xid", "required", "second") == "second"
