import pytest

from gpu_monitor import registry
from gpu_monitor.check import Check
from gpu_monitor.model import Kind


class PluginCheck(Check):
    name = "plugin_check"
    kinds = frozenset({Kind.PASSIVE})
    summary = "a third-party check"


class _EP:
    def __init__(self, name, obj=None, error=None):
        self.name = name
        self._obj = obj
        self._error = error

    def load(self):
        if self._error:
            raise self._error
        return self._obj


def test_builtin_names_equal_module_names_and_are_unique():
    import importlib

    classes = registry.all_check_classes(plugins=False)
    names = [c.name for c in classes]
    assert len(names) == len(set(names))
    for cls in classes:
        assert cls.__module__ == f"checks.{cls.name}"
        importlib.import_module(cls.__module__)
        assert cls.kinds and cls.summary
        for reason in cls.reasons:
            assert reason[0].isupper() and reason.isalnum()


def test_entry_point_plugins_are_added_and_broken_ones_skipped(monkeypatch, caplog):
    eps = [_EP("good", PluginCheck), _EP("broken", error=ImportError("no module")),
           _EP("notacheck", object()), _EP("dup", type("Dup", (Check,), {"name": "inventory"}))]
    monkeypatch.setattr(registry, "entry_points", lambda group: eps)
    names = [c.name for c in registry.all_check_classes()]
    assert names.count("inventory") == 1
    assert names[-1] == "plugin_check"
    assert "broken" in caplog.text and "failed to load" in caplog.text


def test_select_by_kind_and_names():
    classes = registry.all_check_classes(plugins=False) + [PluginCheck]
    passive = registry.select(classes, kinds={Kind.PASSIVE})
    assert PluginCheck in passive
    only = registry.select(classes, only=["plugin_check"])
    assert only == [PluginCheck]
    with pytest.raises(registry.RegistryError, match="unknown check 'nope'"):
        registry.select(classes, skip=["nope"])
