"""Every setting the code reads is declared with its type, so a file can set it and a check
never sees a value of the wrong type.

Two halves: a static scan of every ``.setting(check, key)`` / ``.check_setting(check, key)``
call and every ``profile.get("dotted.path")`` in ``checks/`` and ``gpu_monitor/`` (keys are
resolved through literals, f-strings over literal tuples, module-level tables and the small
``get(key, default)`` wrappers the checks use; a call the scan cannot resolve fails the test,
so a new one must be written so it can), and the runtime guard behind it (``Context.setting``
refuses an undeclared key).
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG, load_config
from gpu_monitor.profiles import (
    COMMON_CHECK_KEYS,
    UndeclaredSetting,
    check_settings,
    declared_settings,
    load_profile,
    profile_keys,
    profile_schema,
    setting_spec,
)
from gpu_monitor.profiles.schema import MAX_SECONDS, Map, Nullable, Num, Partial, Spec
from tests.conftest import REPO

# The lookup itself (its parameters are the caller's check and key, not settings).
IMPLEMENTATION = {"gpu_monitor/check.py", "gpu_monitor/config.py",
                  "gpu_monitor/profiles/profile.py"}
ANY_CHECK = "*"


def _sources() -> list[Path]:
    files = sorted((REPO / "checks").glob("*.py")) + sorted((REPO / "gpu_monitor").rglob("*.py"))
    return [f for f in files if str(f.relative_to(REPO)) not in IMPLEMENTATION]


@dataclass(frozen=True)
class Read:
    where: str  # file:line
    kind: str  # "setting" or "profile"
    check: str  # for "setting": the check name, or ANY_CHECK
    key: str  # the setting key, or the profile's dotted path


class _Module:
    """One parsed file with parent links, enough to resolve a call's key argument."""

    def __init__(self, path: Path):
        self.rel = str(path.relative_to(REPO))
        self.tree = ast.parse(path.read_text(), self.rel)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.top: dict[str, ast.expr] = {}
        for stmt in self.tree.body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                else None)
            if isinstance(target, ast.Name) and stmt.value is not None:
                self.top[target.id] = stmt.value

    def ancestors(self, node: ast.AST):
        while node in self.parent:
            node = self.parent[node]
            yield node

    # --- resolving an expression to the strings it can be --------------------------------

    def values(self, expr: ast.expr, depth: int = 0) -> set[str] | None:
        if depth > 8:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.JoinedStr):
            parts: list[set[str]] = []
            for part in expr.values:
                got = (self.values(part.value, depth + 1) if isinstance(part, ast.FormattedValue)
                       else self.values(part, depth + 1))
                if got is None:
                    return None
                parts.append(got)
            return {"".join(p) for p in itertools.product(*parts)}
        if isinstance(expr, ast.Attribute) and expr.attr == "name" and isinstance(
                expr.value, ast.Name) and expr.value.id in ("self", "cls"):
            return self._class_name(expr)
        if isinstance(expr, ast.Name):
            return self._name(expr, depth)
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            return self._union(expr.elts, depth)
        return None

    def _union(self, exprs, depth: int) -> set[str] | None:
        out: set[str] = set()
        for e in exprs:
            got = self.values(e, depth + 1)
            if got is None:
                return None
            out |= got
        return out

    def _class_name(self, expr: ast.AST) -> set[str] | None:
        for anc in self.ancestors(expr):
            if isinstance(anc, ast.ClassDef):
                for stmt in anc.body:
                    if (isinstance(stmt, (ast.Assign, ast.AnnAssign))
                            and any(isinstance(t, ast.Name) and t.id == "name"
                                    for t in (stmt.targets if isinstance(stmt, ast.Assign)
                                              else [stmt.target]))):
                        return self.values(stmt.value)
        return None

    def _elements(self, iterable: ast.expr, depth: int) -> set[str] | None:
        """What a ``for`` over ``iterable`` binds: literal items, or a module-level table's."""
        if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute)
                and iterable.func.attr in ("items", "keys") and not iterable.args):
            iterable = iterable.func.value
        if isinstance(iterable, ast.Name) and iterable.id in self.top:
            iterable = self.top[iterable.id]
        if isinstance(iterable, ast.Dict):
            return self._union(iterable.keys, depth)
        if isinstance(iterable, (ast.Tuple, ast.List, ast.Set)):
            return self._union(iterable.elts, depth)
        return None

    def _name(self, name: ast.Name, depth: int) -> set[str] | None:
        for anc in self.ancestors(name):
            # a comprehension or for-loop variable
            gens = anc.generators if isinstance(anc, (ast.ListComp, ast.SetComp, ast.DictComp,
                                                      ast.GeneratorExp)) else []
            loops = [(g.target, g.iter) for g in gens]
            if isinstance(anc, ast.For):
                loops.append((anc.target, anc.iter))
            for target, iterable in loops:
                first = target.elts[0] if isinstance(target, ast.Tuple) else target
                if isinstance(first, ast.Name) and first.id == name.id:
                    return self._elements(iterable, depth)
            if isinstance(anc, (ast.FunctionDef, ast.Lambda)):
                params = [a.arg for a in (*anc.args.posonlyargs, *anc.args.args)]
                if name.id in params:
                    return self._from_callers(anc, params.index(name.id), name.id, depth)
                for stmt in ast.walk(anc):
                    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                            and isinstance(stmt.targets[0], ast.Name)
                            and stmt.targets[0].id == name.id):
                        return self.values(stmt.value, depth + 1)
        if name.id in self.top:
            return self.values(self.top[name.id], depth + 1)
        return None

    def _from_callers(self, fn: ast.AST, index: int, param: str, depth: int) -> set[str] | None:
        if not isinstance(fn, ast.FunctionDef):
            return None
        method = isinstance(self.parent.get(fn), ast.ClassDef)
        out: set[str] = set()
        found = False
        for call in ast.walk(self.tree):
            if not isinstance(call, ast.Call):
                continue
            f = call.func
            if isinstance(f, ast.Name) and f.id == fn.name:
                pos = index
            elif method and isinstance(f, ast.Attribute) and f.attr == fn.name:
                pos = index - 1  # self / cls
            else:
                continue
            arg = next((k.value for k in call.keywords if k.arg == param), None)
            if arg is None and 0 <= pos < len(call.args):
                arg = call.args[pos]
            if arg is None:
                continue  # the parameter's default: not a key the caller chose
            got = self.values(arg, depth + 1)
            if got is None:
                return None
            out |= got
            found = True
        return out if found else None


READERS = ("setting", "check_setting")


def _setting_calls(mod: _Module) -> tuple[list[ast.Call], list[str]]:
    """Every call of a ``.setting`` / ``.check_setting``, direct or through a local alias
    (``setting = ctx.setting``); any other use of the attribute cannot be followed."""
    calls: list[ast.Call] = []
    lost: list[str] = []
    for node in ast.walk(mod.tree):
        if not (isinstance(node, ast.Attribute) and node.attr in READERS):
            continue
        up = mod.parent[node]
        if isinstance(up, ast.Call) and up.func is node:
            calls.append(up)
            continue
        if (isinstance(up, ast.Assign) and len(up.targets) == 1
                and isinstance(up.targets[0], ast.Name)):
            alias = up.targets[0].id
            scope = next((a for a in mod.ancestors(up) if isinstance(a, ast.FunctionDef)),
                         mod.tree)
            calls += [c for c in ast.walk(scope) if isinstance(c, ast.Call)
                      and isinstance(c.func, ast.Name) and c.func.id == alias]
            continue
        lost.append(f"{mod.rel}:{node.lineno}: {ast.unparse(up)}")
    return calls, lost


def _scan() -> tuple[list[Read], list[str]]:
    reads: list[Read] = []
    unresolved: list[str] = []
    for path in _sources():
        mod = _Module(path)
        # A check's own module reads its own settings; a shared checks/_*.py helper reads for
        # whichever check calls it, so only the keys every check has.
        own = (path.stem if mod.rel.startswith("checks/") and not path.stem.startswith("_")
               else ANY_CHECK)
        calls, lost = _setting_calls(mod)
        unresolved += lost
        for call in calls:
            where = f"{mod.rel}:{call.lineno}"
            if len(call.args) < 2:
                unresolved.append(f"{where}: {ast.unparse(call)}")
                continue
            checks = mod.values(call.args[0]) or {own}
            keys = mod.values(call.args[1])
            if keys is None:
                unresolved.append(f"{where}: {ast.unparse(call)}")
                continue
            reads += [Read(where, "setting", c, k) for c in checks for k in keys]
        for call in ast.walk(mod.tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            where = f"{mod.rel}:{call.lineno}"
            attr = call.func.attr
            if (attr == "get" and call.args and ast.unparse(call.func.value).split(".")[-1]
                    == "profile"):
                paths = mod.values(call.args[0])
                if paths is None:
                    unresolved.append(f"{where}: {ast.unparse(call)}")
                    continue
                reads += [Read(where, "profile", "", p) for p in paths]
    return reads, unresolved


READS, UNRESOLVED = _scan()


def test_the_scan_sees_the_reads_it_must():
    """The scan itself can fail: it finds the reads we know are there."""
    got = {(r.check, r.key) for r in READS if r.kind == "setting"}
    assert ("pcie_aer", "boot_grace_s") in got  # the example
    assert ("burn_in", "median_tolerance") in got  # through burn_in's get() wrapper
    assert ("ecc_memory", "retired_pages_limit") in got  # through a loop over SETTINGS
    assert ("pcie", "d2h_floor_gb_per_s") in got  # an f-string over ("h2d", "d2h")
    assert ("fabric_probe", "busbw_floor_gb_per_s") in got  # opt_float() -> get()
    assert ("xid", "replace_after_resets") in got  # through `setting = ctx.setting`
    assert (ANY_CHECK, "interval_s") in got  # the daemon's scheduler
    assert any(r.kind == "profile" and r.key == "rdma.ports" for r in READS)
    assert len(got) > 80


def test_every_setting_read_is_resolvable():
    assert not UNRESOLVED, ("the scan cannot tell which setting these read; use a literal key "
                            "(or a wrapper called with literals):\n" + "\n".join(UNRESOLVED))


def test_every_setting_read_is_declared_for_its_check():
    missing = []
    for r in READS:
        if r.kind != "setting":
            continue
        if r.check == ANY_CHECK:
            ok = r.key in COMMON_CHECK_KEYS
        else:
            declared = declared_settings(r.check)
            ok = declared is not None and r.key in declared
        if not ok:
            missing.append(f"{r.where}: checks.{r.check}.{r.key}")
    assert not missing, "read but not declared (add a Setting to the check's settings):\n" + "\n".join(
        sorted(set(missing)))


def test_every_profile_path_read_is_declared():
    keys = set(profile_keys())
    missing = [f"{r.where}: {r.key}" for r in READS if r.kind == "profile" and r.key not in keys]
    assert not missing, "profile paths read but not in the profile schema:\n" + "\n".join(missing)


def test_every_declared_check_setting_is_read():
    """A declared key nothing reads would be a setting that silently does nothing."""
    got = {(r.check, r.key) for r in READS if r.kind == "setting"}
    unread = [f"checks.{c}.{k}" for c, keys in check_settings().items() for k in keys
              if (c, k) not in got]
    assert not unread, f"declared but never read: {unread}"


def test_every_built_in_check_reads_only_from_the_table():
    """No check is missing from the declarations (its reads would all be undeclared)."""
    from checks import ALL_CHECKS

    assert {c.name for c in ALL_CHECKS} <= set(check_settings())


# --- the declarations themselves -----------------------------------------------------------------


def _own_settings():
    from gpu_monitor.profiles.settings import declarations

    return [(name, key, s) for name, d in declarations().items() for key, s in d.settings.items()]


@pytest.mark.parametrize(("check", "key", "setting"), _own_settings(),
                         ids=[f"{c}.{k}" for c, k, _ in _own_settings()])
def test_every_declared_default_fits_its_own_spec(check, key, setting):
    """A default is a value a file could have set: the check never sees one of another type."""
    from gpu_monitor.profiles.schema import validate

    if setting.default is not None:
        _, problems = validate(setting.spec, setting.default, path=f"checks.{check}.{key}")
        assert not problems, problems
    assert setting.meaning, f"checks.{check}.{key} says nothing about what it means"


def test_a_checks_own_settings_never_shadow_a_section_key():
    """Own keys and section keys are different things: a default merged into ``checks.<c>``
    would hide the section's value from that check."""
    from gpu_monitor.profiles.sections import SECTIONS
    from gpu_monitor.profiles.settings import check_sections

    clashes = [f"checks.{c}.{k} vs {sec}.{k}" for c, k, _ in _own_settings()
               for sec in check_sections(c) if k in SECTIONS[sec].fields]
    assert not clashes


def test_at_most_names_another_setting_of_the_same_check():
    from gpu_monitor.profiles.settings import check_settings

    for check, key, setting in _own_settings():
        if setting.at_most:
            assert setting.at_most in check_settings()[check], (check, key)
            assert setting.at_most != key


def test_a_shipped_profile_lists_only_what_differs_from_the_defaults():
    """The YAMLs stay short: a value equal to its declared default is noise there."""
    import yaml

    from gpu_monitor.profiles.settings import setting_defaults

    repeated = []
    for path in sorted((REPO / "gpu_monitor" / "profiles").glob("*.yaml")):
        for check, block in (yaml.safe_load(path.read_text()).get("checks") or {}).items():
            for key, value in (block or {}).items():
                default = setting_defaults(check).get(key)
                if default is not None and (list(default) if isinstance(default, tuple)
                                            else default) == value:
                    repeated.append(f"{path.name}: checks.{check}.{key}")
    assert not repeated


# --- the declarations' domains -------------------------------------------------------------------


def _leaf(spec: Spec) -> Spec:
    while isinstance(spec, (Nullable, Partial)):
        spec = spec.inner
    return spec


def _all_declared() -> list[tuple[str, Spec]]:
    from gpu_monitor.config import config_schema

    out = [(f"checks.{c}.{k}", s) for c in check_settings()
           for k, s in (declared_settings(c) or {}).items()]

    def walk(prefix: str, spec: Spec) -> None:
        spec = _leaf(spec)
        if isinstance(spec, Map):
            for k, sub in spec.fields.items():
                out.append((f"{prefix}{k}", sub))
                walk(f"{prefix}{k}.", sub)

    walk("", profile_schema())
    walk("config:", config_schema())
    return out


def _is_duration(path: str) -> bool:
    return path.endswith("_s") and not path.endswith("_per_s")  # units are in the key names


@pytest.mark.parametrize(("path", "spec"), [(p, s) for p, s in _all_declared()
                                            if _is_duration(p)],
                         ids=[p for p, _ in _all_declared() if _is_duration(p)])
def test_every_duration_is_a_bounded_number_of_seconds(path, spec):
    """A key in seconds is finite, not negative and at most MAX_SECONDS (threading timeouts
    overflow past ~2.9e11 s, and such a value is a unit mistake anyway)."""
    leaf = _leaf(spec)
    assert isinstance(leaf, Num), path
    assert leaf.lo is not None and leaf.lo >= 0, path
    assert leaf.hi is not None and leaf.hi <= MAX_SECONDS, path


# --- the runtime guard ---------------------------------------------------------------------------


def _ctx(config=DEFAULT_CONFIG) -> Context:
    return Context(host=None, profile=load_profile("h100-sxm-8"), config=config)  # type: ignore[arg-type]


def test_context_refuses_an_undeclared_setting_of_a_known_check():
    with pytest.raises(UndeclaredSetting, match=r"'pcie_aer' reads setting 'boot_grace'.*"
                                                r"did you mean 'boot_grace_s'"):
        _ctx().setting("pcie_aer", "boot_grace", 300)


def test_undeclared_is_a_programming_error_not_a_config_error():
    """The CLI turns ValueError into exit 2 ("your file is wrong"); this is not that."""
    assert not issubclass(UndeclaredSetting, ValueError)


@pytest.mark.parametrize("key", ["window_s", "boot_grace_s", "interval_s", "warning_band"])
def test_context_reads_a_declared_setting(key):
    assert _ctx().setting("pcie_aer", key, "dflt") is not None


def test_a_plugin_checks_settings_are_its_own(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("checks: {vendor_fan: {min_rpm: 3000}}\n")
    ctx = _ctx(load_config(str(path), env={}))
    assert ctx.setting("vendor_fan", "min_rpm") == 3000
    assert ctx.setting("vendor_fan", "anything", 7) == 7
    assert setting_spec("vendor_fan", "interval_s") is COMMON_CHECK_KEYS["interval_s"]
