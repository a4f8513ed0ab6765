"""The schema library: typed value domains that validate a parsed file and name each mistake.

One validator and one error format for both files a node reads, the profiles
(``gpu_monitor.profiles``) and the config (``gpu_monitor.config``), and for the settings every
check declares (``Check.settings``). A ``Spec`` checks one value and returns it normalised; a
``Map`` of specs is a schema. ``validate`` collects every problem as a (field path, message)
pair, so one run reports all the mistakes of a file, each naming where it is
(``nvlink.links_per_gpu: expected a non-negative integer, got 'x'``).

Guarantees:

1. Numbers are finite and never a bool; integers fit 64 bits (``INT_LIMIT``); every duration
   (``SECONDS``, ``SECONDS0``) is at most ``MAX_SECONDS`` (far longer ones overflow ``threading``
   timeouts and are a unit mistake anyway).
2. An unknown key is an error with a "did you mean" when one is close, unless the ``Map``
   admits extra keys (plugin settings), and then only when it does not look like a typo.
3. ``partial`` validation (overrides, the ``simulation`` block) skips required keys only.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


# --- schema primitives --------------------------------------------------------------------------

Problems = list[tuple[str, str]]


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def short_repr(value: Any) -> str:
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
        problems.append((path, f"expected {self.describe()}, got {short_repr(value)}"))
        return value


class Any_(Spec):
    """Free-form data (plugin check settings): anything YAML can express."""

    desc = "any value"

    def check(self, value, path, problems, partial=False):
        return value


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_integer(value) or isinstance(value, float)) and not (
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
        if not is_integer(value):
            return self.bad(value, path, problems)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            return self.bad(value, path, problems)
        if abs(value) > INT_LIMIT:
            problems.append((path, f"expected {self.describe()} within 64 bits, "
                                   f"got {short_repr(value)}"))
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
        if not is_number(value) or (is_integer(value) and abs(value) > INT_LIMIT):
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
            msg = f"expected {self.describe()}, got {short_repr(value)}"
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
        if is_number(value):
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
                problems.append((join_path(path, str(key)), f"keys must be strings, got {short_repr(key)}"))
                continue
            where = join_path(path, key)
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
                problems.append((join_path(path, key), "required key is missing"))
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
            path = join_path(prefix, key)
            out.append(path)
            out.extend(schema_paths(sub, path))
    return out


# --- the common domains -------------------------------------------------------------------------

POSITIVE_INT = Int(1)
COUNT = Int(0)  # a non-negative integer
POSITIVE = Num(0, lo_open=True)
NON_NEGATIVE = Num(0)
FRACTION = Num(0, 1)
BYTES = Int(1)
# Durations: every key ending in ``_s`` is one of these (a test holds that).
SECONDS = Num(0, MAX_SECONDS, lo_open=True,
              what=f"a positive number of seconds (at most {MAX_SECONDS}, 366 days)")
SECONDS0 = Num(0, MAX_SECONDS,
               what=f"a number of seconds >= 0 (at most {MAX_SECONDS}, 366 days)")
