"""Per-SKU expectations: what a healthy node of a given GPU model looks like, as data.

A profile is a YAML file (shipped ones live beside this module) holding hardware facts (GPU
count and model, NVLink links, PCIe generation, RDMA ports), per-SKU floors from public
sources (Azure HPC health checks, DCGM diag-skus, NVIDIA specifications) and per-check
thresholds. Checks never hard-code a threshold: they ask ``Context.setting(check, key)``,
which consults the config first and then ``Profile.check_setting``.

Three guarantees, in order of importance:

1. A profile that loads is valid: every key is declared in ``PROFILE_SCHEMA`` below (type,
   range, required), unknown keys are rejected with a "did you mean", and the error names the
   field path (``profile h100-sxm-8: nvlink.links_per_gpu: expected a positive integer, got
   'x'``). Overrides and the ``simulation`` block are validated the same way.
2. A ``Profile`` is an immutable value: ``.data`` is a read-only nested mapping; overrides
   return a new profile.
3. Checks never branch on "am I simulated": the ``simulation`` block carries the
   CPU-calibrated numbers and ``for_simulation()`` merges it over the profile.
4. Every setting a check reads is declared here with its type and domain (one ``Spec`` per
   key, ``declared_settings``), so a value that loads is a value the check can use; reading
   an undeclared key raises ``UndeclaredSetting`` (a programming error, not a default).
5. Reading a file never escapes as anything but ``SchemaError``: missing, a directory, not
   UTF-8, too large (``MAX_FILE_BYTES``), malformed, nested deeper than ``MAX_DEPTH`` or, with
   aliases expanded, larger than ``MAX_NODES`` ("billion laughs"); each names the file.

The schema primitives here are shared with ``gpu_monitor.config`` (one validator, one error
format for both files).
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

__all__ = [
    "CHECK_SECTIONS",
    "CHECK_SETTINGS",
    "KNOWN_CHECKS",
    "PROFILE_SCHEMA",
    "Profile",
    "ProfileError",
    "SECONDS",
    "SECONDS0",
    "SchemaError",
    "UndeclaredSetting",
    "declared_settings",
    "list_profiles",
    "load_profile",
    "match_profile",
    "profile_keys",
    "read_text",
    "read_yaml",
    "setting_spec",
]

SCHEMA_VERSION = 1
DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64")

# Bounds on what a config or profile file may be. The shipped profiles are ~5 KiB, ~400 YAML
# nodes and 5 levels deep; the bounds are far above that and far below what hurts.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32  # nesting levels, aliases expanded
MAX_NODES = 100_000  # YAML nodes, aliases expanded
# Every integer setting fits a signed 64-bit value (SQLite, C APIs, struct packing).
INT_LIMIT = 2**63 - 1
# Every duration (a key ending in ``_s``) is at most this: far longer ones overflow
# ``threading`` timeouts and are a unit mistake (milliseconds given as seconds) anyway.
MAX_SECONDS = 366 * 86400


# --- errors -------------------------------------------------------------------------------------


class SchemaError(ValueError):
    """A file (profile or config) that does not follow its schema.

    ``problems`` holds every (field path, message) found, so one run reports all mistakes;
    ``field`` is the first path, ``source`` names the file or profile.
    """

    def __init__(self, source: str, problems: Sequence[tuple[str, str]], line: int | None = None):
        self.source = source
        self.problems = tuple(problems)
        self.field = self.problems[0][0] if self.problems else ""
        self.line = line
        text = "\n".join(f"{source}: {p}: {m}" if p else f"{source}: {m}" for p, m in self.problems)
        super().__init__(text or source)


class ProfileError(SchemaError):
    """A profile that cannot be found, parsed or validated."""


class UndeclaredSetting(LookupError):
    """A check asked for a setting its declaration does not list: a programming error.

    Not a ``ValueError``: no file caused it, so it must not read as a configuration error."""

    def __init__(self, check: str, key: str, declared: Iterable[str]):
        self.check, self.key = check, key
        hint = suggest(key, declared)
        super().__init__(f"check {check!r} reads setting {key!r}, which is not declared "
                         f"(declare it in gpu_monitor/profiles CHECK_SETTINGS)"
                         + (f"; did you mean {hint!r}?" if hint else ""))


# --- schema primitives --------------------------------------------------------------------------

Problems = list[tuple[str, str]]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def suggest(word: str, options: Iterable[str], cutoff: float = 0.6) -> str | None:
    found = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return found[0] if found else None


class Spec:
    """One node of a schema: validates a value, returns it normalised, records problems."""

    desc = "a value"
    nullable = False

    def check(self, value: Any, path: str, problems: Problems, partial: bool = False) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        return self.desc

    def bad(self, value: Any, path: str, problems: Problems) -> Any:
        problems.append((path, f"expected {self.describe()}, got {_show(value)}"))
        return value


class Any_(Spec):
    """Free-form data (plugin check settings): anything YAML can express."""

    desc = "any value"

    def check(self, value, path, problems, partial=False):
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and not (
        isinstance(value, float) and not math.isfinite(value))


@dataclass(frozen=True)
class Int(Spec):
    """An integer (not a bool) in [lo, hi], and always within 64 bits (``INT_LIMIT``)."""

    lo: int | None = None
    hi: int | None = None

    def describe(self) -> str:
        if self.lo == 1 and self.hi is None:
            return "a positive integer"
        if self.lo == 0 and self.hi is None:
            return "a non-negative integer"
        if self.lo is not None and self.hi is not None:
            return f"an integer from {self.lo} to {self.hi}"
        if self.lo is not None:
            return f"an integer >= {self.lo}"
        return "an integer"

    def check(self, value, path, problems, partial=False):
        if not _is_int(value):
            return self.bad(value, path, problems)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            return self.bad(value, path, problems)
        if abs(value) > INT_LIMIT:
            problems.append((path, f"expected {self.describe()} within 64 bits, "
                                   f"got {_show(value)}"))
        return value


@dataclass(frozen=True)
class Num(Spec):
    """A finite number (int or float, not a bool, NaN or infinity) in the given interval."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # value must be > lo rather than >= lo
    hi_open: bool = False
    what: str = ""  # the description, when the interval alone says too little

    def describe(self) -> str:
        if self.what:
            return self.what
        if self.lo is not None and self.hi is not None:
            left = "(" if self.lo_open else "["
            right = ")" if self.hi_open else "]"
            return f"a number in {left}{self.lo:g}, {self.hi:g}{right}"
        if self.lo == 0 and self.lo_open:
            return "a positive number"
        if self.lo is not None:
            return f"a number {'>' if self.lo_open else '>='} {self.lo:g}"
        return "a number"

    def check(self, value, path, problems, partial=False):
        if not _is_num(value) or (_is_int(value) and abs(value) > INT_LIMIT):
            return self.bad(value, path, problems)
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return self.bad(value, path, problems)
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
            return self.bad(value, path, problems)
        return value


@dataclass(frozen=True)
class Bool(Spec):
    desc = "true or false"

    def check(self, value, path, problems, partial=False):
        if not isinstance(value, bool):
            return self.bad(value, path, problems)
        return value


@dataclass(frozen=True)
class Str(Spec):
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    what: str = "a non-empty string"
    lower: bool = False  # case-insensitive choices, normalised to lower case

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        return self.what

    def check(self, value, path, problems, partial=False):
        if not isinstance(value, str) or not value.strip():
            return self.bad(value, path, problems)
        if self.lower:
            value = value.lower()
        if self.choices and value not in self.choices:
            hint = suggest(value, self.choices)
            msg = f"expected {self.describe()}, got {_show(value)}"
            problems.append((path, msg + (f" (did you mean {hint!r}?)" if hint else "")))
            return value
        if self.pattern and not re.fullmatch(self.pattern, value):
            return self.bad(value, path, problems)
        return value


@dataclass(frozen=True)
class Version(Spec):
    """A dotted version kept as text: YAML would turn an unquoted 12.10 into 12.1."""

    desc = 'a quoted version string such as "535.104.05"'

    def check(self, value, path, problems, partial=False):
        if _is_num(value):
            problems.append((path, f"expected {self.desc}, got the number {value!r} "
                                   f"(quote it: \"{value}\")"))
            return str(value)
        if not isinstance(value, str) or not re.fullmatch(r"\d+(\.\d+)*", value.strip()):
            return self.bad(value, path, problems)
        return value.strip()


@dataclass(frozen=True)
class Nullable(Spec):
    inner: Spec = field(default_factory=Any_)
    nullable = True

    def describe(self) -> str:
        return f"{self.inner.describe()} or null"

    def check(self, value, path, problems, partial=False):
        if value is None:
            return None
        return self.inner.check(value, path, problems, partial)


@dataclass(frozen=True)
class Partial(Spec):
    """Validates ``inner`` without its required keys (overrides, the simulation block)."""

    inner: Spec = field(default_factory=Any_)

    def describe(self) -> str:
        return self.inner.describe()

    def check(self, value, path, problems, partial=False):
        return self.inner.check(value, path, problems, partial=True)


@dataclass(frozen=True)
class List(Spec):
    item: Spec = field(default_factory=Any_)
    min_len: int = 0

    def describe(self) -> str:
        extra = f" with at least {self.min_len} item(s)" if self.min_len else ""
        return f"a list of {self.item.describe()}{extra}"

    def check(self, value, path, problems, partial=False):
        if not isinstance(value, (list, tuple)) or len(value) < self.min_len:
            return self.bad(value, path, problems)
        return [self.item.check(v, f"{path}[{i}]", problems, partial) for i, v in enumerate(value)]


@dataclass(frozen=True)
class Map(Spec):
    """A mapping with declared keys. Unknown keys are errors (with a suggestion), except when
    ``extra`` is given: then unknown keys are validated by it, unless they look like a typo of
    a declared key (similarity >= ``typo_cutoff``; None: never treated as a typo)."""

    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    extra: Spec | None = None
    typo_cutoff: float | None = 0.8
    doc: str = "a mapping"

    def describe(self) -> str:
        return self.doc

    def check(self, value, path, problems, partial=False):
        if not isinstance(value, Mapping):
            return self.bad(value, path, problems)
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if not isinstance(key, str):
                problems.append((_join(path, str(key)), f"keys must be strings, got {_show(key)}"))
                continue
            where = _join(path, key)
            spec = self.fields.get(key)
            if spec is None:
                if self.extra is None:
                    hint = suggest(key, self.fields)
                elif self.typo_cutoff is None:
                    hint = None
                else:
                    hint = suggest(key, self.fields, self.typo_cutoff)
                if self.extra is not None and hint is None:
                    out[key] = self.extra.check(sub, where, problems, partial)
                    continue
                if hint:
                    msg = f"unknown key {key!r} (did you mean {hint!r}?)"
                else:
                    msg = f"unknown key {key!r}; expected one of: {', '.join(sorted(self.fields))}"
                problems.append((where, msg))
                continue
            if sub is None and not spec.nullable and not isinstance(spec, Any_):
                problems.append((where, f"expected {spec.describe()}, got null"))
                continue
            out[key] = spec.check(sub, where, problems, partial)
        if not partial:
            for key in sorted(self.required - set(value)):
                problems.append((_join(path, key), "required key is missing"))
        return out


def validate(spec: Spec, value: Any, partial: bool = False, path: str = "") -> tuple[Any, Problems]:
    """Validate ``value`` against ``spec``; ``partial`` skips required keys (overrides)."""
    problems: Problems = []
    out = spec.check(value, path, problems, partial)
    return out, problems


def schema_paths(spec: Spec, prefix: str = "") -> list[str]:
    """Every declared dotted key path of a schema (docs are tested against this list)."""
    out: list[str] = []
    if isinstance(spec, (Nullable, Partial)):
        return schema_paths(spec.inner, prefix)
    if isinstance(spec, Map):
        for key, sub in spec.fields.items():
            path = _join(prefix, key)
            out.append(path)
            out.extend(schema_paths(sub, path))
    return out


# --- YAML ---------------------------------------------------------------------------------------


class _YamlRefused(yaml.MarkedYAMLError):
    """A document refused at one value: over a bound, a duplicate key, an unbuildable value.
    ``path`` is that value's field path (``checks.xid.window_s``, ``rdma.ports[2]``)."""

    def __init__(self, problem: str, mark: yaml.Mark | None, path: str,
                 what: str = "malformed YAML"):
        super().__init__(problem=problem, problem_mark=mark)
        self.path, self.what = path, what


_LIMIT = "YAML refused"  # a well-formed document over a bound


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one), documents
    over the bounds, and values its constructors cannot build, naming the field of each.

    1. The composer recurses once per nesting level: ``compose_node`` counts the levels and
       stops at ``MAX_DEPTH`` before Python's recursion limit is near.
    2. Aliases share nodes, so a few lines can stand for 10^9 of them (each ``*a`` repeats
       ``&a``), and an alias inside its own anchor makes a cycle. ``compose_document`` measures
       the node graph with aliases expanded (each node once, memoised) before anything is
       constructed or validated.
    3. A scalar constructor that raises (``!!int x``, a 5000-digit integer, the date
       2024-13-45) becomes an error at that value's line and field.
    4. While composing, every node's field path is recorded (the first, for a shared node), so
       the errors above name the field as the schema's errors do.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._trail: list[str] = []
        self._paths: dict[int, str] = {}

    def path_of(self, node: yaml.Node) -> str:
        return self._paths.get(id(node), "")

    def compose_node(self, parent, index):
        here = self._trail[-1] if self._trail else ""
        if isinstance(parent, yaml.SequenceNode):
            here = f"{here}[{index}]"
        elif isinstance(parent, yaml.MappingNode) and isinstance(index, yaml.ScalarNode):
            here = _join(here, str(index.value))
        if len(self._trail) >= MAX_DEPTH:
            raise _YamlRefused(f"nested deeper than {MAX_DEPTH} levels",
                               self.peek_event().start_mark, here, _LIMIT)
        alias = self.check_event(yaml.AliasEvent)
        self._trail.append(here)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._trail.pop()
        if not alias:  # an alias's node is named where its anchor is
            self._paths[id(node)] = here
        return node

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            _measure(node, self.path_of)
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # noqa: BLE001 - a constructor's own failure on bad text
            tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            raise _YamlRefused(f"cannot read the value {_show(node.value)} as {tag}: {why}",
                               node.start_mark, self.path_of(node)) from None

    def construct_yaml_int(self, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > 64:
            raise _YamlRefused(f"an integer of {digits} digits is out of range",
                               node.start_mark, self.path_of(node))
        return super().construct_yaml_int(node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _measure(root: yaml.Node, path_of: Callable[[yaml.Node], str]) -> None:
    """Refuse ``root`` if, aliases expanded, it is cyclic, deeper than ``MAX_DEPTH`` or has
    more than ``MAX_NODES`` nodes. Iterative, each distinct node visited once."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()  # the nodes on the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_.discard(key)
            if size[key] > MAX_NODES:
                raise _YamlRefused(f"more than {MAX_NODES} values with aliases expanded "
                                   f"(an alias bomb?)", node.start_mark, path_of(node), _LIMIT)
            if depth[key] > MAX_DEPTH:
                raise _YamlRefused(f"nested deeper than {MAX_DEPTH} levels with aliases "
                                   f"expanded", node.start_mark, path_of(node), _LIMIT)
            continue
        if key in size:
            continue
        if key in open_:
            raise _YamlRefused("an alias refers to a value that contains it (recursive "
                               "alias)", node.start_mark, path_of(node), _LIMIT)
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # PyYAML's own error follows
        if key in seen:
            raise _YamlRefused(f"duplicate key {key!r} (first at line {seen[key] + 1})",
                               key_node.start_mark, _join(loader.path_of(node), str(key)))
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor(
    "tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


def read_text(path: str | os.PathLike[str], source: str,
              error: type[SchemaError] = SchemaError) -> str:
    """The UTF-8 text of a config or profile file; anything else is ``error`` naming ``source``
    and what was wrong (not found, a directory, unreadable, too large, not UTF-8)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise error(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise error(source, [("", "is a directory, not a file")]) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        why = getattr(exc, "strerror", None) or str(exc)
        raise error(source, [("", f"cannot read: {why}")]) from None
    if len(data) > MAX_FILE_BYTES:
        raise error(source, [("", f"larger than {MAX_FILE_BYTES} bytes (a config or profile "
                                  f"is a few KiB): not read")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(source, [("", f"not UTF-8 text: {exc.reason} at byte {exc.start} "
                                  f"(line {line})")], line=line) from None


def read_yaml(text: str, source: str, error: type[SchemaError] = SchemaError) -> Any:
    """Parse YAML; a syntax error, a duplicate key, an unbuildable value or a document over the
    bounds becomes ``error`` naming the line and column."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        path = getattr(exc, "path", "")
        what = getattr(exc, "what", "malformed YAML")
        if mark is not None:
            where = f"line {mark.line + 1}, column {mark.column + 1}"
            raise error(source, [(path, f"{what} at {where}: {problem}")],
                        line=mark.line + 1) from None
        raise error(source, [(path, f"{what}: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise error(source, [("", f"malformed YAML: {exc}")]) from None


# --- the profile schema -------------------------------------------------------------------------

_POS_INT = Int(1)
_NAT = Int(0)
_POS = Num(0, lo_open=True)
_NONNEG = Num(0)
# Durations: every key ending in ``_s`` is one of these (a test holds that).
SECONDS = Num(0, MAX_SECONDS, lo_open=True,
              what=f"a positive number of seconds (at most {MAX_SECONDS}, 366 days)")
SECONDS0 = Num(0, MAX_SECONDS,
               what=f"a number of seconds >= 0 (at most {MAX_SECONDS}, 366 days)")
_FRACTION = Num(0, 1)
_BYTES = Int(1)
_PORT = Str(pattern=r"[A-Za-z0-9_.\-]+:\d+", what="an RDMA port 'device:port' such as 'mlx5_0:1'")
_DTYPE = Str(choices=DTYPES)

# Keys every check block may hold.
COMMON_CHECK_KEYS: dict[str, Spec] = {
    "interval_s": SECONDS,
    "timeout_s": SECONDS,
    "warning_band": _FRACTION,
    # Whether a bootstrap must run the check (over its declaration, Check.required): a SKU
    # without DCGM support says ``checks.dcgm_diag.required: false``.
    "required": Bool(),
}

# Per-check settings (profile ``checks.<name>.<key>``), one ``Spec`` per key: the type and
# domain a check may rely on. docs/configuration.md lists each one; a test scans every
# ``ctx.setting(...)`` call in the code and holds this table complete.
CHECK_SETTINGS: dict[str, dict[str, Spec]] = {
    "inventory": {
        "boot_grace_s": SECONDS0,
    },
    "burn_in": {
        "duration_s": SECONDS,
        "min_fraction_of_peak": Num(0, 1, lo_open=True),
        "median_tolerance": Num(0, 1, hi_open=True),
        "dtypes": List(_DTYPE, min_len=1),
        "matrix_size": Int(16),
        "max_temp_celsius": _POS,
        "reference_block": Int(1),
        "reference_interval_s": SECONDS,
        "reference_tolerance": Map({d: _POS for d in DTYPES}, doc="a mapping dtype -> tolerance"),
    },
    "nvlink_peer": {
        "copy_bytes": _BYTES,
        "repeats": _POS_INT,
        "error_increase_degraded": _POS_INT,
        "error_increase_failed": _POS_INT,
    },
    "nccl_allreduce": {
        "iterations": _POS_INT,
        "warmup_iterations": _NAT,
    },
    "ecc_memory": {
        "remap_low_banks_degraded": _POS_INT,
        "remap_low_banks_failed": _POS_INT,
        "remap_none_banks_degraded": _POS_INT,
        "remap_none_banks_failed": _POS_INT,
        "corrected_total_degraded": _POS_INT,
        "corrected_total_failed": _POS_INT,
        "retired_pages_limit": _NAT,
    },
    "pcie": {
        "copy_bytes": _BYTES,
        "repeats": _POS_INT,
        "replay_increase_degraded": _POS_INT,
        "copy_timeout_s": SECONDS,
    },
    "rdma_loopback": {
        "use_cuda": Bool(),
        "iterations": _POS_INT,
        "tcp_port_base": Int(1024, 65535),
        "gid_index": Nullable(_NAT),
        "run_timeout_s": SECONDS,
        "server_start_s": SECONDS,
        "connect_retries": _NAT,
        "server_exit_s": SECONDS,
    },
    "dcgm_diag": {
        "host": Nullable(Str(what="a DCGM host engine address such as 'localhost:5555'")),
        "parameters": Nullable(Str(what="dcgmi diag -p parameters")),
    },
    "sdc_probe": {
        "seed": _NAT,
        "batch_size": _POS_INT,
        "hidden_size": _POS_INT,
        "layers": _POS_INT,
        "reference_path": Nullable(Str(what="a file path")),
    },
    "xid": {
        "app_xid_repeat_count": _POS_INT,
        "app_xid_window_s": SECONDS,
        "app_xid_dedup_s": SECONDS0,
        "replace_after_resets": _POS_INT,
        "replay_max_age_s": SECONDS,
    },
    "nvswitch": {
        "nonfatal_window_s": SECONDS,
    },
    "throttle": {
        "window_s": SECONDS,
        "degraded_fraction": Num(0, 1, lo_open=True),
        "failed_fraction": Num(0, 1, lo_open=True),
    },
    "nvlink_state": {
        "window_s": SECONDS,
        "error_rate_per_min_degraded": _POS,
    },
    "rdma_ports": {
        "window_s": SECONDS,
        "downtime_budget_s": SECONDS,
        "downtime_warning_fraction": Num(0, 1, lo_open=True),
        "nccl_ib_timeout": Int(1, 31),
        "nccl_ib_retry_cnt": Int(0, 7),
        "boot_grace_s": SECONDS0,
    },
    "pcie_aer": {
        "window_s": SECONDS,
        "correctable_per_min_degraded": _POS,
        "boot_grace_s": SECONDS0,
    },
    "temperature": {
        "gradient_limit_celsius": _POS,
        "peer_deviation_celsius": _POS,
    },
    "fabric_probe": {
        "iterations": _POS_INT,
        "warmup_iterations": _NAT,
    },
}
KNOWN_CHECKS = frozenset(CHECK_SETTINGS)

# Where ``check_setting`` looks after ``checks.<check>``: the hardware sections the check is
# judged against, so ``ctx.setting("nccl_allreduce", "allreduce_busbw_floor_gb_per_s")`` works
# and a config ``checks.nccl_allreduce`` entry can override a section value for one check.
CHECK_SECTIONS: dict[str, tuple[str, ...]] = {
    "inventory": ("gpu",),
    "burn_in": ("gpu",),
    "temperature": ("gpu",),
    "nvlink_peer": ("nvlink",),
    "nvlink_state": ("nvlink",),
    "nvswitch": ("nvlink",),
    "pcie": ("pcie",),
    "pcie_aer": ("pcie",),
    "rdma_loopback": ("rdma",),
    "rdma_ports": ("rdma",),
    "nccl_allreduce": ("nccl",),
    "fabric_probe": ("fabric", "nccl"),
    "dcgm_diag": ("dcgm",),
}


def check_block_spec(check: str, extra: Spec | None = None) -> Map:
    """The schema of one ``checks.<check>`` block (``extra`` admits unknown keys)."""
    return Map({**COMMON_CHECK_KEYS, **CHECK_SETTINGS.get(check, {})}, extra=extra,
               doc=f"a mapping of {check} settings")


_SECTIONS: dict[str, Map] = {
    "gpu": Map({
        "count": _NAT,
        "product_name": Nullable(Str()),
        "pci_device_id": Nullable(Int(0, 0xFFFF)),
        "memory_gib": Nullable(_POS),
        "min_driver_version": Nullable(Version()),
        "min_cuda_version": Nullable(Version()),
        "peak_tflops": Map({d: _POS for d in DTYPES}, doc="a mapping dtype -> TFLOP/s"),
        "slowdown_temp_celsius": Nullable(_POS),
    }, required=frozenset({"count", "product_name", "pci_device_id", "memory_gib",
                           "min_driver_version", "min_cuda_version", "peak_tflops"})),
    "nvlink": Map({
        "links_per_gpu": _NAT,
        "nvswitch": Bool(),
        "nvswitch_count": _NAT,
        "p2p_floor_gb_per_s": Nullable(_NONNEG),
        "boot_grace_s": SECONDS0,
    }, required=frozenset({"links_per_gpu", "nvswitch", "nvswitch_count", "p2p_floor_gb_per_s",
                           "boot_grace_s"})),
    "pcie": Map({
        "gen": Nullable(Int(1, 7)),
        "width": Nullable(Int(1, 32)),
        "h2d_floor_gb_per_s": Nullable(_NONNEG),
        "d2h_floor_gb_per_s": Nullable(_NONNEG),
        "gpu_numa": Nullable(List(_NAT)),
        "gpu_nic": Nullable(List(Str(what="an RDMA device name such as 'mlx5_0'"))),
    }, required=frozenset({"gen", "width", "h2d_floor_gb_per_s", "d2h_floor_gb_per_s"})),
    "rdma": Map({
        "ports": List(_PORT),
        "rate_gbit_per_s": Nullable(_POS),
        "loopback_floor_gbit_per_s": Nullable(_NONNEG),
        "message_bytes": _BYTES,
    }, required=frozenset({"ports", "rate_gbit_per_s", "loopback_floor_gbit_per_s",
                           "message_bytes"})),
    "nccl": Map({
        "allreduce_busbw_floor_gb_per_s": Nullable(_NONNEG),
        "large_message_min_bytes": _BYTES,
        "small_message_max_bytes": _BYTES,
        "small_p95_latency_limit_s": Nullable(SECONDS),
        "sweep_min_bytes": _BYTES,
        "sweep_max_bytes": _BYTES,
        "sweep_factor": Int(2),
    }, required=frozenset({"allreduce_busbw_floor_gb_per_s", "large_message_min_bytes",
                           "small_message_max_bytes", "small_p95_latency_limit_s",
                           "sweep_min_bytes", "sweep_max_bytes", "sweep_factor"})),
    "fabric": Map({
        "busbw_floor_gb_per_s": Nullable(_NONNEG),
        "small_p95_latency_limit_s": Nullable(SECONDS),
    }),
    "dcgm": Map({
        "level": Int(1, 4),
        "targeted_power_w": Nullable(_POS),
    }, required=frozenset({"level"})),
}



def declared_settings(check: str) -> Mapping[str, Spec] | None:
    """Every setting ``check`` may read, with its Spec: the common keys, its own
    ``CHECK_SETTINGS`` and the keys of its ``CHECK_SECTIONS`` (its own win). None for a check
    the schema does not know (a plugin: its settings are free-form)."""
    if check not in CHECK_SETTINGS:
        return None
    out: dict[str, Spec] = {}
    for section in reversed(CHECK_SECTIONS.get(check, ())):
        out.update(_SECTIONS[section].fields)
    out.update(COMMON_CHECK_KEYS)
    out.update(CHECK_SETTINGS[check])
    return out


def setting_spec(check: str, key: str) -> Spec:
    """The Spec of ``checks.<check>.<key>``; ``UndeclaredSetting`` when a known check's
    declaration lacks ``key``. A plugin's keys are free-form (``Any_``) but for the common
    ones."""
    declared = declared_settings(check)
    if declared is None:
        return COMMON_CHECK_KEYS.get(key) or Any_()
    spec = declared.get(key)
    if spec is None:
        raise UndeclaredSetting(check, key, declared)
    return spec


# Unknown check names are plugin settings (free-form), unless they look like a typo of a known
# check, which is an error ("burnin" -> "burn_in").
_CHECKS_MAP = Map(
    {name: check_block_spec(name) for name in CHECK_SETTINGS},
    extra=Map({}, extra=Any_(), doc="a mapping of plugin check settings"),
    typo_cutoff=0.8,
    doc="a mapping of check name -> settings",
)

_PROFILE_BODY: dict[str, Spec] = {
    "description": Str(what="a string"),
    **_SECTIONS,
    "warning_band": _FRACTION,
    "checks": _CHECKS_MAP,
}

PROFILE_SCHEMA = Map({
    "schema": Int(SCHEMA_VERSION, SCHEMA_VERSION),
    "name": Str(pattern=r"[a-z0-9][a-z0-9._\-]*",
                what="a lower-case name of letters, digits, '.', '_' and '-'"),
    "match": List(Str()),
    "match_exclude": List(Str()),
    **_PROFILE_BODY,
    # What changes when the host is the simulated node: the same sections, all optional.
    "simulation": Partial(Map(dict(_PROFILE_BODY), doc="a mapping of profile sections")),
}, required=frozenset({"schema", "name", "match", "gpu", "nvlink", "pcie", "rdma", "nccl",
                       "dcgm", "warning_band", "checks"}), doc="a mapping")

# Pairs (a, b) that must satisfy a <= b when both are set.
_ORDERED: tuple[tuple[str, str], ...] = (
    ("nccl.sweep_min_bytes", "nccl.sweep_max_bytes"),
    ("nccl.small_message_max_bytes", "nccl.large_message_min_bytes"),
    ("checks.throttle.degraded_fraction", "checks.throttle.failed_fraction"),
    ("checks.ecc_memory.remap_low_banks_degraded", "checks.ecc_memory.remap_low_banks_failed"),
    ("checks.ecc_memory.remap_none_banks_degraded", "checks.ecc_memory.remap_none_banks_failed"),
    ("checks.ecc_memory.corrected_total_degraded", "checks.ecc_memory.corrected_total_failed"),
    ("checks.nvlink_peer.error_increase_degraded", "checks.nvlink_peer.error_increase_failed"),
)


def profile_keys() -> list[str]:
    """Every declared profile key path (``checks.<check>.<key>`` included)."""
    return schema_paths(PROFILE_SCHEMA)


def _dig(data: Any, dotted: str) -> Any:
    cur = data
    for part in dotted.split("."):
        if isinstance(cur, Mapping):
            if part not in cur:
                return None
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def _cross_checks(data: Mapping[str, Any]) -> Problems:
    problems: Problems = []
    for a, b in _ORDERED:
        va, vb = _dig(data, a), _dig(data, b)
        if _is_num(va) and _is_num(vb) and va > vb:
            problems.append((a, f"{va} is above {b} ({vb})"))
    return problems


def _validate_profile(data: Any, source: str) -> dict[str, Any]:
    if data is None:
        raise ProfileError(source, [("", "empty profile")])
    if isinstance(data, Mapping) and "schema" in data and data["schema"] != SCHEMA_VERSION:
        raise ProfileError(source, [("schema", f"unsupported schema version {data['schema']!r} "
                                               f"(this gpu-monitor reads {SCHEMA_VERSION})")])
    out, problems = validate(PROFILE_SCHEMA, data)
    if not problems:
        problems += _cross_checks(out)
        sim = out.get("simulation")
        if sim:
            merged = deep_merge(out, sim)
            problems += [(p, m + " (after merging the simulation block)")
                         for p, m in _cross_checks(merged)]
    if problems:
        raise ProfileError(source, problems)
    return out


# --- immutable data helpers ---------------------------------------------------------------------


def freeze(value: Any) -> Any:
    """Nested dicts/lists -> read-only mappings/tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Read-only mappings/tuples -> plain dicts/lists (fresh copies)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: mappings merge key by key; lists, scalars and
    null replace."""
    out = thaw(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = thaw(value)
    return out


# --- Profile ------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Profile:
    """An immutable profile. ``load_profile`` validates; constructing one directly from a
    dict (tests) freezes the data but does not validate it."""

    data: Mapping[str, Any]
    source: str = ""
    simulated: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.data, MappingProxyType):
            object.__setattr__(self, "data", freeze(self.data))

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def description(self) -> str:
        return str(self.data.get("description") or "")

    @property
    def expected_gpus(self) -> int:
        return int(self.data["gpu"]["count"])

    def get(self, dotted: str, default: Any = None) -> Any:
        """``profile.get("pcie.gen")``; a missing key or an explicit null gives ``default``."""
        value = _dig(self.data, dotted)
        return default if value is None else value

    def check_setting(self, check: str, key: str) -> Any:
        """``checks.<check>.<key>``, else the key in the check's hardware section(s)
        (``CHECK_SECTIONS``), else the profile-wide ``warning_band``; None when unset.
        ``UndeclaredSetting`` when ``key`` is not declared for ``check``."""
        setting_spec(check, key)
        block = _dig(self.data, f"checks.{check}")
        if isinstance(block, Mapping) and block.get(key) is not None:
            return block[key]
        for section in CHECK_SECTIONS.get(check, ()):
            value = _dig(self.data, f"{section}.{key}")
            if value is not None:
                return value
        if key == "warning_band":
            return self.data.get("warning_band")
        return None

    def with_overrides(self, overrides: Mapping[str, Any], source: str | None = None) -> Profile:
        """A new profile with ``overrides`` deep-merged in and the result re-validated."""
        if not overrides:
            return self
        label = source or f"profile {self.name} (with overrides)"
        if not isinstance(overrides, Mapping):
            raise ProfileError(label, [("", f"overrides must be a mapping, got {_show(overrides)}")])
        merged = deep_merge(self.data, overrides)
        return Profile(_validate_profile(merged, label), self.source, self.simulated)

    def for_simulation(self) -> Profile:
        """The profile with its ``simulation`` block merged in (idempotent)."""
        if self.simulated:
            return self
        sim = self.data.get("simulation") or {}
        merged = deep_merge(self.data, sim)
        return Profile(_validate_profile(merged, f"profile {self.name} (simulation)"),
                       self.source, simulated=True)

    def to_dict(self) -> dict[str, Any]:
        return thaw(self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        return self.simulated == other.simulated and thaw(self.data) == thaw(other.data)

    def __hash__(self) -> int:
        return hash((self.name, self.simulated))

    def __repr__(self) -> str:
        sim = ", simulated" if self.simulated else ""
        return f"Profile({self.name!r}, {self.expected_gpus} GPUs{sim})"


# --- loading ------------------------------------------------------------------------------------


def _shipped_dir():
    return resources.files(__name__)


def list_profiles() -> list[str]:
    """Names of the profiles shipped with gpu-monitor."""
    return sorted(p.name[: -len(".yaml")] for p in _shipped_dir().iterdir()
                  if p.name.endswith(".yaml"))


def _looks_like_path(ref: str) -> bool:
    return os.sep in ref or "/" in ref or ref.endswith((".yaml", ".yml"))


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """A shipped profile by name (``h100-sxm-8``) or a user file (a baseline measured on
    known-good nodes, e.g. for B200, where no public floors exist)."""
    ref = os.fspath(name_or_path)
    if _looks_like_path(ref):
        source = f"profile {ref}"
        text = read_text(ref, source, ProfileError)
        return Profile(_validate_profile(read_yaml(text, source, ProfileError), source), ref)
    return _load_shipped(ref)


@functools.cache
def _load_shipped(name: str) -> Profile:
    source = f"profile {name}"
    names = list_profiles()
    if name not in names:
        hint = suggest(name, names, cutoff=0.5)
        msg = f"unknown profile {name!r}; shipped profiles: {', '.join(names)}"
        raise ProfileError(source, [("", msg + (f" (did you mean {hint!r}?)" if hint else ""))])
    text = _shipped_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    data = _validate_profile(read_yaml(text, source, ProfileError), source)
    if data["name"] != name:
        raise ProfileError(source, [("name", f"{data['name']!r} differs from the file name "
                                             f"{name + '.yaml'!r}")])
    return Profile(data, f"gpu_monitor/profiles/{name}.yaml")


def _match_score(profile: Profile, gpu_names: Sequence[str]) -> int | None:
    """How specifically ``profile`` matches every name (longest pattern hit), or None."""
    patterns = [str(p).lower() for p in profile.get("match", ())]
    excludes = [str(p).lower() for p in profile.get("match_exclude", ())]
    if not gpu_names:
        return 0 if profile.expected_gpus == 0 and not patterns else None
    score: int | None = None
    for raw in gpu_names:
        name = raw.lower()
        if any(x in name for x in excludes):
            return None
        hits = [len(p) for p in patterns if p in name]
        if not hits:
            return None
        score = max(hits) if score is None else min(score, max(hits))
    return score


def match_profile(gpu_names: Sequence[str],
                  candidates: Iterable[Profile] | None = None) -> Profile | None:
    """``--profile auto``: the profile whose ``match`` substrings hit every GPU's NVML product
    name (case-insensitive) and whose ``match_exclude`` hits none. No GPUs -> the profile
    expecting 0 GPUs (cpu-only). Several matches -> the most specific (longest pattern);
    equal -> the first candidate (shipped profiles are in name order). None when nothing
    matches, e.g. a mixed node or an unknown SKU."""
    pool = list(candidates) if candidates is not None else [
        _load_shipped(n) for n in list_profiles()]
    best: tuple[int, Profile] | None = None
    for profile in pool:
        score = _match_score(profile, list(gpu_names))
        if score is not None and (best is None or score > best[0]):
            best = (score, profile)
    return best[1] if best else None
