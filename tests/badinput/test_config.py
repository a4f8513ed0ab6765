"""Bad config and profile files: every one is exit 2 naming the file and the field.

The table is generated, not hand-listed:

- every setting every check declares (``checks.<check>.<key>`` in a ``--config``) with a
  value of the wrong type, derived from its Spec;
- every key path of the profile schema with a wrong-type value, in a ``--profile`` file;
- every key path of the config schema, and of ``profile_overrides``, likewise;
- every distinct Spec with each value its domain excludes (NaN, infinity, below the minimum,
  above the maximum, beyond 64 bits, a number or bool written as a string, ...);
- a near-miss of a key in every mapping of both schemas (expecting a "did you mean");
- the file-level shapes: not a mapping, empty, a directory, missing, not UTF-8, too large,
  tabs, duplicate keys, alias bombs, recursive aliases, deep nesting, values YAML cannot build.

Commands rotate through ``bootstrap``, ``check``, ``daemon --once`` and ``list-checks`` so each
shape reaches every entry point. The expected message is ``<file label>: <dotted field>: ``,
the error format of both files.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_monitor.config import SWITCH_KEYS, config_schema
from gpu_monitor.profiles import check_settings, declared_settings, profile_schema
from gpu_monitor.profiles.schema import (
    Any_,
    Bool,
    Int,
    List,
    Map,
    Nullable,
    Num,
    Partial,
    Spec,
    Str,
    Version,
)
from gpu_monitor.profiles.yaml_reader import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES
from tests.badinput.harness import Case, config_case, ids, run_case

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "gpu_monitor" / "profiles" / "h100-sxm-8.yaml"
CONFIG = "{tmp}/config.yaml"
PROFILE = "{tmp}/profile.yaml"
CONFIG_LABEL = f"config {CONFIG}"
PROFILE_LABEL = f"profile {PROFILE}"
SIM = ("--simulate", "h100-sxm-8")

# Every entry point that reads a config, and every one that reads a profile file.
CONFIG_COMMANDS = (
    ("bootstrap", *SIM, "--config", CONFIG),
    ("check", "pcie_aer", *SIM, "--config", CONFIG),
    ("daemon", "--once", *SIM, "--config", CONFIG),
    ("list-checks", "--config", CONFIG),
)
PROFILE_COMMANDS = (
    ("bootstrap", *SIM, "--profile", PROFILE),
    ("check", "xid", *SIM, "--profile", PROFILE),
    ("daemon", "--once", "--simulate", PROFILE),
    ("list-checks", "--profile", PROFILE),
)
_turn = itertools.count()


def _command(commands: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    return commands[next(_turn) % len(commands)]


# --- values derived from a Spec ------------------------------------------------------------------


def _leaf(spec: Spec) -> Spec:
    while isinstance(spec, (Nullable, Partial)):
        spec = spec.inner
    return spec


def wrong_type(spec: Spec) -> tuple[str, Any] | None:
    """One value of the wrong type for ``spec`` (None: it accepts anything)."""
    spec = _leaf(spec)
    if isinstance(spec, (Int, Num)):
        return "string", "soon"
    if isinstance(spec, Bool):
        return "bool-as-string", "true"
    if isinstance(spec, Version):
        return "version-as-number", 12.1
    if isinstance(spec, Str):
        return "number", 5
    if isinstance(spec, List):
        return "scalar", "soon"
    if isinstance(spec, Map):
        return "list", ["soon"]
    if isinstance(spec, Any_):
        return None
    return "list", ["soon"]  # the config's own specs (listen address, ...) are scalars


def out_of_domain(spec: Spec) -> list[tuple[str, Any, str]]:
    """(label, value, where below the key the error is) for values of the right shape that
    the spec's domain excludes."""
    spec = _leaf(spec)
    out: list[tuple[str, Any, str]] = []
    if isinstance(spec, Int):
        base = spec.lo if spec.lo is not None else 0
        out += [("float", base + 0.5, ""), ("bool", True, ""),
                ("number-as-string", str(base), ""), ("beyond-64-bits", 2**64, "")]
        if spec.lo is not None:
            out.append(("below-minimum", spec.lo - 1, ""))
        if spec.hi is not None:
            out.append(("above-maximum", spec.hi + 1, ""))
    elif isinstance(spec, Num):
        out += [("nan", math.nan, ""), ("inf", math.inf, ""), ("bool", False, ""),
                ("number-as-string", "30", "")]
        if spec.lo is not None:
            out.append(("below-minimum", spec.lo if spec.lo_open else spec.lo - 1, ""))
        if spec.hi is not None:
            out.append(("above-maximum", spec.hi if spec.hi_open else spec.hi * 2 + 1, ""))
    elif isinstance(spec, Bool):
        out += [("int", 1, ""), ("yes-as-string", "yes", ""), ("false-as-string", "false", "")]
    elif isinstance(spec, Version):
        out += [("not-a-version", "twelve", "")]
    elif isinstance(spec, Str):
        out.append(("empty", "", ""))
        if spec.choices:
            out.append(("not-a-choice", "zzz", ""))
        elif spec.pattern:
            out.append(("not-matching", "not valid!", ""))
    elif isinstance(spec, List):
        item = wrong_type(spec.item)
        if item is not None:
            out.append(("wrong-item", [item[1]], "[0]"))
        if spec.min_len:
            out.append(("empty", [], ""))
    elif isinstance(spec, Map) and spec.fields:
        out.append(("unknown-key", {"zz_not_a_key": 1}, ".zz_not_a_key"))
    return out


def _near_miss(key: str) -> str:
    """A typo of ``key`` close enough for a suggestion (a letter dropped)."""
    return key[:-2] + key[-1] if len(key) > 3 else key + "x"


# --- writing files -------------------------------------------------------------------------------


@functools.cache
def _shipped_text() -> str:
    return SHIPPED.read_text()


def _shipped() -> dict:
    return yaml.load(_shipped_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _set(data: dict, dotted: str, value: Any) -> dict:
    cur = data
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(cur.get(part), dict):
            cur[part] = {}
        cur = cur[part]
    cur[last] = value
    return data


def _nested(dotted: str, value: Any) -> dict:
    return _set({}, dotted, value)


def _writer(name: str, content: str | bytes | Callable[[], str | bytes]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        body = content() if callable(content) else content
        path = tmp / name
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body, encoding="utf-8")
    return setup


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def config(id: str, data: Any, field: str, *also: str, text: str | bytes | None = None) -> Case:
    body = text if text is not None else _dump(data)
    head = f"{CONFIG_LABEL}: {field}: " if field else f"{CONFIG_LABEL}: "
    return config_case(f"config-{id}", _command(CONFIG_COMMANDS), (head, *also),
                       _writer("config.yaml", body))


def profile(id: str, mutate: Callable[[dict], Any] | None, field: str, *also: str,
            text: str | bytes | None = None) -> Case:
    def body() -> str | bytes:
        if text is not None:
            return text
        assert mutate is not None
        return _dump(mutate(_shipped()))
    head = f"{PROFILE_LABEL}: {field}: " if field else f"{PROFILE_LABEL}: "
    return config_case(f"profile-{id}", _command(PROFILE_COMMANDS), (head, *also),
                       _writer("profile.yaml", body))


# --- the generated table -------------------------------------------------------------------------


SECTIONS = ("gpu", "nvlink", "pcie", "rdma", "nccl", "fabric", "dcgm")


def _check_settings() -> Iterator[tuple[str, Spec]]:
    """``checks.<check>.<key>`` in a config: every check's own settings, then each key the
    blocks share (switches, common keys, the sections' keys a block may override) once, on
    the checks that declare it in turn."""
    shared: dict[str, list[tuple[str, Spec]]] = {}
    for check in check_settings():
        for key, spec in check_settings()[check].items():
            yield f"checks.{check}.{key}", spec
        for key, spec in {**SWITCH_KEYS, **(declared_settings(check) or {})}.items():
            if key not in check_settings()[check]:
                shared.setdefault(key, []).append((check, spec))
    for i, (key, users) in enumerate(shared.items()):
        check, spec = users[i % len(users)]
        yield f"checks.{check}.{key}", spec


def _paths(spec: Spec, prefix: str = "") -> Iterator[tuple[str, Spec]]:
    """Every declared key path under ``spec`` with its Spec (parents before children)."""
    spec = _leaf(spec)
    if isinstance(spec, Map):
        for key, sub in spec.fields.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path, sub
            yield from _paths(sub, path)


def _maps(spec: Spec, prefix: str = "") -> Iterator[tuple[str, Map]]:
    spec = _leaf(spec)
    if isinstance(spec, Map) and spec.fields:
        yield prefix, spec
        for key, sub in spec.fields.items():
            yield from _maps(sub, f"{prefix}.{key}" if prefix else key)


def _profile_paths() -> Iterator[tuple[str, Spec]]:
    """Every profile key path but the simulation block's (the same Specs again) and the
    check blocks' settings (the Specs of ``_check_settings``): the blocks themselves, and
    each block's first setting, stay."""
    for path, spec in _paths(profile_schema()):
        parts = path.split(".")
        if parts[0] == "simulation" and len(parts) > 1:
            continue
        if parts[0] == "checks" and len(parts) > 2 and parts[2] != next(
                iter(check_settings().get(parts[1]) or {"": None})):
            continue
        yield path, spec


def _config_paths() -> Iterator[tuple[str, Spec]]:
    for path, spec in _paths(config_schema()):
        if not path.startswith(("checks.", "profile_overrides.")):
            yield path, spec


def _override_paths() -> Iterator[tuple[str, Spec]]:
    """``profile_overrides``: each section, and each section's first key."""
    for section in SECTIONS:
        spec = profile_schema().fields[section]
        yield f"profile_overrides.{section}", spec
        key, sub = next(iter(_leaf(spec).fields.items()))
        yield f"profile_overrides.{section}.{key}", sub


def _wrong_type_cases(items, make: Callable[[str, str, Any], Case]) -> list[Case]:
    cases = []
    for path, spec in items:
        bad = wrong_type(spec)
        if bad is not None:
            cases.append(make(f"{path}-{bad[0]}", path, bad[1]))
    return cases


def _domain_cases(items: list[tuple[str, str, Spec]]) -> list[Case]:
    """Each distinct Spec with each value its domain excludes, spread over the keys (of
    either file) that use it."""
    groups: dict[str, list[tuple[str, str, Spec]]] = {}
    for kind, path, spec in items:
        groups.setdefault(repr(_leaf(spec)), []).append((kind, path, spec))
    cases = []
    for group in groups.values():
        for i, (label, value, below) in enumerate(out_of_domain(group[0][2])):
            kind, path, _ = group[i % len(group)]
            cases.append(_make(kind, f"{path}-{label}", path, value, path + below))
    return cases


def _make(kind: str, id: str, path: str, value: Any, field: str | None = None,
          *also: str) -> Case:
    field = path if field is None else field
    if kind == "profile":
        return profile(id, lambda d, p=path, v=value: _set(d, p, v), field, *also)
    return config(id, _nested(path, value), field, *also)


def _typo_cases() -> list[Case]:
    """A near-miss of a key in every mapping of both schemas, and in every check block."""
    places = [("config", prefix, spec) for prefix, spec in _maps(config_schema())
              if not prefix.startswith(("profile_overrides", "checks"))]
    places += [("profile", prefix, spec) for prefix, spec in _maps(profile_schema())
               if not prefix.startswith(("simulation", "checks"))]
    places += [("config", f"checks.{check}", Map(check_settings()[check]))
               for check in check_settings() if check_settings()[check]]
    cases = []
    for kind, prefix, spec in places:
        key = next(iter(spec.fields))
        field = f"{prefix}.{_near_miss(key)}" if prefix else _near_miss(key)
        cases.append(_make(kind, f"typo-{field}", field, 1, None, f"did you mean {key!r}"))
    return cases


def _table() -> list[Case]:
    def as_config(id, path, v):
        return _make("config", id, path, v)

    def as_profile(id, path, v):
        return _make("profile", id, path, v)

    cases: list[Case] = []
    cases += _wrong_type_cases(_check_settings(), as_config)  # every declared setting
    cases += _wrong_type_cases(_profile_paths(), as_profile)  # every level of a profile
    cases += _wrong_type_cases(_config_paths(), as_config)  # every level of a config
    cases += _wrong_type_cases(_override_paths(), as_config)
    cases += _domain_cases([("config", p, s) for p, s in _check_settings()]
                           + [("config", p, s) for p, s in _config_paths()]
                           + [("profile", p, s) for p, s in _profile_paths()])
    cases += _typo_cases()
    cases += _file_shapes()
    return cases


# --- file-level shapes ---------------------------------------------------------------------------

_BOMB = "".join(
    [f"l0: &l0 [{', '.join(['lol'] * 10)}]\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)])
_DEEP_FLOW = "a: " + "[" * 5000 + "]" * 5000 + "\n"
_DEEP_FLOW_AT = "a" + "[0]" * (MAX_DEPTH - 1)  # the field of the first value too deep
_DEEP_BLOCK = "".join(f"{'  ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5)) + "  " * 40 + "x: 1\n"
_DEEP_BLOCK_AT = ".".join(f"k{i}" for i in range(MAX_DEPTH - 1))
_DEEP_ALIASES = "".join(["a0: &a0 [1]\n"]
                        + [f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_DEPTH + 5)])
_HUGE_INT = "1" * 5000
_BINARY = bytes([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0xFF,
                 0xD8, 0xFF, 0xE0, 0x80, 0x81])
_TOO_LARGE = ("# padding\n" * (MAX_FILE_BYTES // 10 + 1))


def _file_shapes() -> list[Case]:
    cases: list[Case] = []
    cases += [
        config("top-level-list", None, "", "expected a mapping", text="- a\n- b\n"),
        config("top-level-string", None, "", "expected a mapping", text="just words\n"),
        config("top-level-number", None, "", "expected a mapping", text="42\n"),
        config("alias-bomb", None, "l4", "alias bomb", text=_BOMB),
        config("recursive-alias", None, "a", "recursive alias", text="a: &a [1, *a]\n"),
        config("recursive-merge", None, "a", "recursive alias", text="a: &a {<<: *a}\n"),
        config("deep-flow-nesting", None, _DEEP_FLOW_AT, f"nested deeper than {MAX_DEPTH}",
               text=_DEEP_FLOW),
        config("deep-block-nesting", None, _DEEP_BLOCK_AT, f"nested deeper than {MAX_DEPTH}",
               text=_DEEP_BLOCK),
        config("deep-through-aliases", None, "", f"nested deeper than {MAX_DEPTH}",
               "with aliases expanded", text=_DEEP_ALIASES),
        config("tab-indent", None, "", "malformed YAML at line 2",
               text="profile: auto\n\tlog_level: info\n"),
        config("duplicate-top-key", None, "profile", "duplicate key 'profile'",
               text="profile: auto\nlog_level: info\nprofile: h100-sxm-8\n"),
        config("duplicate-nested-key", None, "remediation.dry_run", "duplicate key 'dry_run'",
               text="remediation:\n  dry_run: true\n  dry_run: false\n"),
        config("binary", None, "", "not UTF-8", text=_BINARY),
        config("utf16", None, "", "not UTF-8", text="profile: auto\n".encode("utf-16")),
        config("latin1", None, "", "not UTF-8", "line 2",
               text="profile: auto\nnode_name: n\xe9ud\n".encode("latin-1")),
        config("nul-byte", None, "", "malformed YAML", text="profile: auto\x00\n"),
        config("too-large", None, "", f"larger than {MAX_FILE_BYTES} bytes", text=_TOO_LARGE),
        config("two-documents", None, "", "malformed YAML", text="profile: auto\n---\nx: 1\n"),
        config("python-tag", None, "", "malformed YAML",
               text="profile: !!python/object/apply:os.system ['true']\n"),
        config("unbuildable-int", None, "expected_gpus", "cannot read the value 'x'",
               text="expected_gpus: !!int x\n"),
        config("impossible-date", None, "node_name", "2024-13-45",
               text="node_name: 2024-13-45\n"),
        config("huge-int-literal", None, "expected_gpus", "5000 digits",
               text=f"expected_gpus: {_HUGE_INT}\n"),
        config("unclosed-flow", None, "", "malformed YAML at line 3",
               text="profile: auto\nchecks: {xid: {interval_s: 3}\n"),
        config("non-string-key", None, "1", "keys must be strings", text="1: x\n"),
        config("unknown-check-name", None, "checks.burnin", "did you mean 'burn_in'",
               text="checks: {burnin: {duration_s: 3}}\n"),
        config("unknown-disabled-check", None, "disabled_checks[0]", "did you mean 'xid'",
               text="disabled_checks: [xdi]\n"),
        config("the-issue-boot-grace-soon", None, "checks.pcie_aer.boot_grace_s", "'soon'",
               text="checks: {pcie_aer: {boot_grace_s: soon}}\n"),
        config_case("config-missing-file", _command(CONFIG_COMMANDS)[:-1]
                    + ("{tmp}/nope.yaml",), ("config {tmp}/nope.yaml: file not found",)),
        config_case("config-directory", _command(CONFIG_COMMANDS)[:-1] + ("{tmp}",),
                    ("config {tmp}: is a directory",)),
    ]
    cases += [
        profile("top-level-list", None, "", "expected a mapping", text="- a\n- b\n"),
        profile("top-level-string", None, "", "expected a mapping", text="h100\n"),
        profile("empty", None, "", "empty profile", text=""),
        profile("only-comments", None, "", "empty profile", text="# nothing here\n"),
        profile("alias-bomb", None, "l4", "alias bomb", text=_BOMB),
        profile("recursive-alias", None, "a", "recursive alias", text="a: &a [*a]\n"),
        profile("deep-flow-nesting", None, _DEEP_FLOW_AT, f"nested deeper than {MAX_DEPTH}",
                text=_DEEP_FLOW),
        profile("tab-indent", None, "", "malformed YAML at line 3",
                text="schema: 1\nname: x\n\tmatch: []\n"),
        profile("duplicate-key", None, "nvlink.links_per_gpu", "duplicate key",
                text=SHIPPED.read_text().replace("  links_per_gpu: 18 ",
                                                 "  links_per_gpu: 18\n  links_per_gpu: 12 ")),
        profile("binary", None, "", "not UTF-8", text=_BINARY),
        profile("latin1", None, "", "not UTF-8",
                text="schema: 1\nname: caf\xe9\n".encode("latin-1")),
        profile("too-large", None, "", f"larger than {MAX_FILE_BYTES} bytes", text=_TOO_LARGE),
        profile("unbuildable-value", None, "gpu.count", "cannot read the value",
                text=SHIPPED.read_text().replace("  count: 8\n", "  count: !!int eight\n")),
        profile("huge-int-literal", None, "gpu.count", "5000 digits",
                text=SHIPPED.read_text().replace("  count: 8\n", f"  count: {_HUGE_INT}\n")),
        profile("unsupported-schema", lambda d: _set(d, "schema", 2), "schema",
                "unsupported schema version"),
        profile("missing-required", lambda d: {k: v for k, v in d.items() if k != "gpu"},
                "gpu", "required key is missing"),
        profile("order-broken", lambda d: _set(d, "nccl.sweep_min_bytes", 2**32),
                "nccl.sweep_min_bytes", "above nccl.sweep_max_bytes"),
        profile("plugin-name-typo", lambda d: _set(d, "checks.burnin", {"duration_s": 3}),
                "checks.burnin", "did you mean 'burn_in'"),
        config_case("profile-missing-file", _command(PROFILE_COMMANDS)[:-1]
                    + ("{tmp}/b200.yaml",), ("profile {tmp}/b200.yaml: file not found",)),
        config_case("profile-directory", ("bootstrap", *SIM, "--profile", "{tmp}/"),
                    ("profile {tmp}/: is a directory",)),
        config_case("profile-unknown-name", ("list-checks", "--profile", "h100"),
                    ("unknown profile 'h100'", "did you mean 'h100-sxm-8'")),
    ]
    return cases


CASES = _table()
assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


def test_the_table_is_large_and_reaches_every_entry_point():
    assert len(CASES) >= 60
    used = {c.argv[0] for c in CASES} | {" ".join(c.argv[:2]) for c in CASES}
    assert {"bootstrap", "check", "daemon --once", "list-checks"} <= used
    assert sum("--profile" in c.argv or c.argv[-1] == PROFILE for c in CASES) >= 60
    assert MAX_NODES < 10**9  # the bomb above expands to 10^9 values


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_config_or_profile_is_exit_2_naming_the_file_and_field(case, tmp_path, capsys,
                                                                   caplog):
    run_case(case, tmp_path, capsys, caplog)
