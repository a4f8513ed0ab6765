"""The three PATCH flavours of the Kubernetes API server, as pure functions over JSON dicts.

Why a separate module: the patch semantics are where a fake most easily lies (a JSON merge patch
that "works" but would wipe kubelet's `Ready` condition on a real cluster; a taint patch that
merges where the real server replaces). Keeping them pure makes them table-testable without HTTP.

- RFC 6902 JSON patch (`application/json-patch+json`), with the apiserver's error texts
  (evanphx/json-patch v4) so a failed `test` reads as on a real cluster.
- RFC 7386 merge patch (`application/merge-patch+json`): maps merge, `null` deletes, lists replace.
- Strategic merge patch (`application/strategic-merge-patch+json`) for the built-in types, driven
  by a table of the `patchStrategy`/`patchMergeKey` struct tags the daemon touches. Lists not in the
  table are atomic (replaced whole), as on the real server: that is what makes `spec.taints` atomic.
"""

from __future__ import annotations

import copy
import json
from typing import Any

#: A list with this strategy merges as a set of scalars (`patchStrategy:"merge"` on a []string).
SCALAR_SET = "<set>"

#: `patchMergeKey` per list field, keyed by the field path with list indices dropped. Taken from
#: the struct tags in k8s.io/api (core/v1, apps/v1, policy/v1, batch/v1); anything absent is atomic.
_POD_SPEC_KEYS: dict[tuple[str, ...], str] = {
    ("containers",): "name",
    ("initContainers",): "name",
    ("ephemeralContainers",): "name",
    ("volumes",): "name",
    ("imagePullSecrets",): "name",
    ("containers", "env"): "name",
    ("containers", "ports"): "containerPort",
    ("containers", "volumeMounts"): "mountPath",
    ("containers", "volumeDevices"): "devicePath",
    ("initContainers", "env"): "name",
    ("initContainers", "ports"): "containerPort",
    ("initContainers", "volumeMounts"): "mountPath",
}

MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): SCALAR_SET,
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",  # Node
    ("spec", "podCIDRs"): SCALAR_SET,  # Node
    **{("spec", *k): v for k, v in _POD_SPEC_KEYS.items()},  # Pod
    **{("spec", "template", "spec", *k): v for k, v in _POD_SPEC_KEYS.items()},  # workloads
    **{
        ("spec", "jobTemplate", "spec", "template", "spec", *k): v
        for k, v in _POD_SPEC_KEYS.items()
    },
}


class PatchError(Exception):
    """A patch that cannot be applied; `bad_request` separates 400 (undecodable) from 422."""

    def __init__(self, message: str, *, bad_request: bool = False) -> None:
        super().__init__(message)
        self.bad_request = bad_request


# --------------------------------------------------------------------------- JSON patch (RFC 6902)


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise PatchError("path must be a string", bad_request=True)
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'JSON pointer must be empty or start with a "/": {path}')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ==, `true` is not `1` and `1.0` is `1` only as numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


_MISSING = object()


def _get(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, dict):
            if p not in cur:
                return _MISSING
            cur = cur[p]
        elif isinstance(cur, list):
            if not p.isdigit() or int(p) >= len(cur):
                return _MISSING
            cur = cur[int(p)]
        else:
            return _MISSING
    return cur


def _container(doc: Any, parts: list[str], op: str, path: str) -> tuple[Any, str]:
    parent = _get(doc, parts[:-1])
    if parent is _MISSING or not isinstance(parent, (dict, list)):
        raise PatchError(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    return parent, parts[-1]


def _index(lst: list, key: str, path: str, *, allow_end: bool) -> int:
    if key == "-" and allow_end:
        return len(lst)
    if not key.isdigit() or (key != "0" and key.startswith("0")):
        raise PatchError(f"invalid array index: {key} in {path}")
    i = int(key)
    if i > len(lst) or (i == len(lst) and not allow_end):
        raise PatchError(f"Unable to access invalid index: {i}: invalid index referenced")
    return i


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, key = _container(doc, parts, "add", path)
    if isinstance(parent, dict):
        parent[key] = value
    else:
        parent.insert(_index(parent, key, path, allow_end=True), value)
    return doc


def _remove(doc: Any, path: str, op: str = "remove") -> tuple[Any, Any]:
    parts = _pointer(path)
    if not parts:
        raise PatchError(f"{op} operation does not apply: cannot remove the whole document")
    parent, key = _container(doc, parts, op, path)
    if isinstance(parent, dict):
        if key not in parent:
            raise PatchError(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
        return doc, parent.pop(key)
    return doc, parent.pop(_index(parent, key, path, allow_end=False))


def apply_json_patch(doc: dict, ops: Any) -> dict:
    """Apply an RFC 6902 patch to a copy of `doc`; PatchError carries the apiserver's text."""
    if not isinstance(ops, list):
        raise PatchError(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch", bad_request=True
        )
    out = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError("Unexpected kind: <nil>", bad_request=True)
        kind, path = op["op"], op.get("path")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"{kind} operation does not apply: missing value", bad_request=False)
        if kind == "add":
            out = _add(out, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            out, _ = _remove(out, path)
        elif kind == "replace":
            parts = _pointer(path)
            if parts and _get(out, parts) is _MISSING:
                raise PatchError(
                    f"replace operation does not apply: doc is missing key: {path}: missing value"
                )
            if not parts:
                out = copy.deepcopy(op["value"])
                continue
            parent, key = _container(out, parts, "replace", path)
            if isinstance(parent, dict):
                parent[key] = copy.deepcopy(op["value"])
            else:
                parent[_index(parent, key, path, allow_end=False)] = copy.deepcopy(op["value"])
        elif kind == "move":
            out, value = _remove(out, op.get("from"), "move")
            out = _add(out, path, value)
        elif kind == "copy":
            value = _get(out, _pointer(op.get("from")))
            if value is _MISSING:
                raise PatchError(
                    f"copy operation does not apply: doc is missing from path: {op.get('from')}"
                )
            out = _add(out, path, copy.deepcopy(value))
        elif kind == "test":
            got = _get(out, _pointer(path))
            if got is _MISSING:
                if op["value"] is None:
                    continue
                raise PatchError(f"testing value {path} failed: test failed")
            if not json_equal(got, op["value"]):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}", bad_request=True)
    return out


# -------------------------------------------------------------------------- merge patch (RFC 7386)


def apply_merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


# ------------------------------------------------------------------------ strategic merge patch


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if not k.startswith("$") and v is not None
        }
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_keyed_list(orig: list, patch: list, key: str, path: tuple[str, ...]) -> list:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = [copy.deepcopy(o) for o in orig]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"map: {item} does not contain declared merge key: {key}")
        idx = next(
            (i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(_strip_directives(item))
        else:
            out[idx] = _merge_map(out[idx], item, path)
    return out


def _merge_list(orig: Any, patch: list, path: tuple[str, ...]) -> list:
    strategy = MERGE_KEYS.get(path)
    orig = orig if isinstance(orig, list) else []
    if strategy is None:  # atomic: the patch's list replaces the stored one
        return [_strip_directives(p) for p in patch]
    if strategy == SCALAR_SET:
        out = list(orig)
        out.extend(p for p in patch if p not in out)
        return out
    return _merge_keyed_list(orig, patch, strategy, path)


def _reorder(items: list, order: list, key: str | None) -> list:
    def ident(x: Any) -> Any:
        return x.get(key) if key and isinstance(x, dict) else x

    wanted = [ident(o) for o in order]
    ranked = sorted(
        range(len(items)),
        key=lambda i: (
            wanted.index(ident(items[i])) if ident(items[i]) in wanted else len(wanted),
            i,
        ),
    )
    return [items[i] for i in ranked]


def _merge_map(orig: Any, patch: dict, path: tuple[str, ...]) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive == "delete":
        return None
    out = copy.deepcopy(orig) if isinstance(orig, dict) else {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list] = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(out.get(field), list):
                out[field] = [x for x in out[field] if x not in v]
            continue
        sub = (*path, k)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            merged = _merge_map(out.get(k), v, sub)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        elif isinstance(v, list):
            out[k] = _merge_list(out.get(k), v, sub)
        else:
            out[k] = v
    for field, order in orders.items():
        if isinstance(out.get(field), list):
            strategy = MERGE_KEYS.get((*path, field))
            out[field] = _reorder(out[field], order, None if strategy == SCALAR_SET else strategy)
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def apply_strategic_merge_patch(doc: dict, patch: Any) -> dict:
    """Strategic merge as the apiserver applies it to the built-in types listed in MERGE_KEYS."""
    if not isinstance(patch, dict):
        raise PatchError(
            "json: cannot unmarshal array into Go value of type map[string]interface {}",
            bad_request=True,
        )
    out = _merge_map(doc, patch, ())
    return out if out is not None else {}


def decode_json(raw: bytes) -> Any:
    """Parse a request body; PatchError(bad_request) on anything that is not JSON."""
    try:
        return json.loads(raw.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError) as exc:
        raise PatchError(f"error decoding patch: {exc}", bad_request=True) from exc
