"""The node SDC probe's stored reference: the unanimous results of a passing run, per platform.

Why: a device that is wrong in the same way on every run, or a node whose devices are all wrong
the same way, agrees with itself; only a result recorded earlier (keyed by GPU model, driver,
torch/CUDA version and the probe's settings) can tell. One JSON file per node, written
atomically; an unreadable file is an error the check reports, never silently replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from gpu_monitor.sdc.probe_judge import Row

#: Bump when the probe model, its inputs or the result row change: stored references of an
#: older version are then not compared (their key differs), and a new one is recorded.
PROBE_VERSION = 1
REFERENCE_SCHEMA = 1
REFERENCE_KIND = "SdcProbeReference"


class ReferenceUnreadable(Exception):
    pass


def reference_key(gpu_name: str, driver: str, torch_version: str, cuda: str | None,
                  dtype: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a stored reference is valid for: GPU model, driver, software and probe settings."""
    return {"gpu_name": gpu_name, "driver_version": driver, "torch": torch_version,
            "cuda": cuda, "dtype": dtype, "probe_version": PROBE_VERSION,
            "seed": int(settings["seed"]), "batch_size": int(settings["batch_size"]),
            "hidden_size": int(settings["hidden_size"]), "layers": int(settings["layers"])}


def read_reference(path: str) -> dict[str, Any]:
    """The reference document at ``path``; an empty one when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return {"schema": REFERENCE_SCHEMA, "kind": REFERENCE_KIND, "entries": []}
    except (OSError, ValueError) as exc:
        raise ReferenceUnreadable(f"{path}: {exc}") from exc
    if (not isinstance(doc, dict) or doc.get("kind") != REFERENCE_KIND
            or not isinstance(doc.get("entries"), list)):
        raise ReferenceUnreadable(f"{path}: not an {REFERENCE_KIND} document")
    if doc.get("schema") != REFERENCE_SCHEMA:
        raise ReferenceUnreadable(f"{path}: schema {doc.get('schema')!r}, this version reads "
                                  f"{REFERENCE_SCHEMA}")
    return doc


def find_reference(doc: Mapping[str, Any], key: Mapping[str, Any]) -> dict[int, Row] | None:
    for entry in doc.get("entries", []):
        if isinstance(entry, dict) and entry.get("key") == dict(key):
            try:
                return {int(b): tuple(int(v) for v in row) for b, row in entry["rows"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):
                return None
    return None


def write_reference(path: str, doc: Mapping[str, Any], key: Mapping[str, Any],
                    rows: Mapping[int, Row], recorded_at: str, node: str) -> None:
    """Add an entry for ``key`` to ``doc`` and write the file atomically (temp + rename)."""
    entries = [e for e in doc.get("entries", []) if not (isinstance(e, dict)
                                                          and e.get("key") == dict(key))]
    entries.append({"key": dict(key), "rows": {str(b): list(r) for b, r in sorted(rows.items())},
                    "recorded_at": recorded_at, "node": node, "devices": len(rows)})
    out = {"schema": REFERENCE_SCHEMA, "kind": REFERENCE_KIND, "entries": entries}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sdc-reference-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


