"""Reading a config or profile file: bytes to UTF-8 text to YAML, refusing what would hurt.

Both files a node reads go through here, so every way a file can be bad ends as one
``SchemaError`` (or the caller's subclass) naming the file, the field and the line, never as a
traceback: missing, a directory, unreadable, larger than ``MAX_FILE_BYTES``, not UTF-8,
malformed YAML, a duplicate key, a value YAML cannot build, nested deeper than ``MAX_DEPTH`` or,
with aliases expanded, larger than ``MAX_NODES`` ("billion laughs").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import yaml

from gpu_monitor.profiles.schema import SchemaError, join_path, short_repr

# Bounds on what a config or profile file may be. The shipped profiles are ~5 KiB, ~400 YAML
# nodes and 5 levels deep; the bounds are far above that and far below what hurts.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32  # nesting levels, aliases expanded
MAX_NODES = 100_000  # YAML nodes, aliases expanded


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
            here = join_path(here, str(index.value))
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
            raise _YamlRefused(f"cannot read the value {short_repr(node.value)} as {tag}: {why}",
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
                               key_node.start_mark, join_path(loader.path_of(node), str(key)))
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

