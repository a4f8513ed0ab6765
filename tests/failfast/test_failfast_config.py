"""``failfast.*`` in the config: defaults, and every bad value refused at load naming its field."""

from __future__ import annotations

import pytest

from gpu_monitor.config import DEFAULT_CONFIG, ConfigError, parse_config


def test_defaults_are_an_event_and_a_notice_file_following_remediation_dry_run():
    f = DEFAULT_CONFIG.failfast
    assert (f.enabled, f.actions, f.dry_run, f.notice_dir, f.signal, f.on_xid) == (
        True, ("event", "file"), None, "/run/gpu-monitor/notices", "SIGTERM", False)


def test_a_full_block_is_read():
    f = parse_config({"failfast": {"actions": ["file", "Signal", "delete"], "dry_run": False,
                                   "notice_dir": "/var/run/notices", "signal": "SIGUSR1",
                                   "on_xid": True, "max_age_s": 0, "delete_grace_s": 5}}
                     ).failfast
    assert f.actions == ("file", "signal", "delete")
    assert (f.dry_run, f.notice_dir, f.signal, f.on_xid, f.max_age_s, f.delete_grace_s) == (
        False, "/var/run/notices", "SIGUSR1", True, 0, 5)


@pytest.mark.parametrize("block, field", [
    ({"actions": ["event", "page"]}, "failfast.actions[1]"),
    ({"actions": ["file", "file"]}, "failfast.actions[1]"),
    ({"actions": "file"}, "failfast.actions"),
    ({"signal": "SIGHUP"}, "failfast.signal"),
    ({"notice_dir": "notices"}, "failfast.notice_dir"),
    ({"max_age_s": -1}, "failfast.max_age_s"),
    ({"delete_grace_s": -1}, "failfast.delete_grace_s"),
    ({"on_xid": "yes please"}, "failfast.on_xid"),
    ({"actoins": ["file"]}, "failfast.actoins"),
])
def test_a_bad_value_is_refused_at_load_naming_the_field(block, field):
    with pytest.raises(ConfigError) as err:
        parse_config({"failfast": block})
    assert field in str(err.value)
