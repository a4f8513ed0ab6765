"""Build the shipped XID/SXid catalogs from the vendor tables in the shared fixtures.

Why a generator: NVIDIA publishes its XID catalog as a spreadsheet (resolution buckets per code,
plus a decode table for the NVLink5 XIDs 144-150) and the SXid tables in the Fabric Manager
guide. We ship those facts as data (``xid_catalog.json``, ``sxid_catalog.json``) together with
*our* action and category for each code, derived by the documented rules below, so that a new
vendor table is a regeneration plus a review of the diff, never a code change.

Regenerate (from the repository root; ``--shared`` names the folder holding ``fixtures/``, here
the repository's own copy of the vendor tables under ``tests/fixtures/xid_catalog``)::

    python -m gpu_monitor.rules.generate_catalog --shared tests

The output is deterministic (no timestamps, stable key order): ``tests/rules/test_catalog.py``
regenerates into a temporary directory and compares byte for byte. Bump ``RULES_VERSION`` when
a derivation rule changes; the catalog version is ``<RULES_VERSION>.<first 8 hex of the sources'
sha256>`` so it also changes whenever a source table does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RULES_VERSION = 1
REGENERATE = "python -m gpu_monitor.rules.generate_catalog --shared tests"

XID_SOURCES = (
    "fixtures/xid_catalog/nvidia_xid_catalog_xlsx__Xids.tsv",
    "fixtures/xid_catalog/nvidia_xid_catalog_xlsx__Resolution_Buckets.tsv",
    "fixtures/xid_catalog/nvidia_xid_catalog_xlsx__Xid_144_150_Decode.tsv",
)
SXID_SOURCES = ("fixtures/xid_catalog/sxid_nvswitch_catalog_fm_guide_via_gpud.tsv",)

OUT_DIR = Path(__file__).resolve().parent
XID_OUT = "xid_catalog.json"
SXID_OUT = "sxid_catalog.json"

# --- derivation rules (documented in docs/xid.md; order matters) ----------------------------------

# R1. SPEC-CHECKS pins the category of these codes whatever the vendor bucket says.
APPLICATION_CODES = (13, 31, 43, 45)
HARDWARE_CODES = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)
HARDWARE_FROM = 140  # "140+ are hardware signals"

# R2. Our action and category for NVIDIA's immediate-action bucket.
BUCKET_RULES: dict[str, tuple[str, str]] = {
    "RESTART_APP": ("none", "application"),   # the application must restart; the GPU is fine
    "IGNORE": ("none", "driver"),             # informational driver/firmware event
    "RESET_GPU": ("reset_gpu", "hardware"),
    "RESTART_BM": ("reboot", "hardware"),
    "RESTART_VM": ("reboot", "driver"),
    "WORKFLOW_XID_48": ("reset_gpu", "hardware"),     # solo: RESET_GPU; with 63/64: drain+reset
    "WORKFLOW_XID_45": ("none", "application"),       # not solo: IGNORE (follow the other Xid)
    "WORKFLOW_NVLINK_ERR": ("reset_gpu", "hardware"), # NVLink fatal error: links need a reset
    "WORKFLOW_NVLINK5_ERR": ("reset_gpu", "hardware"),  # refined per line by the decode table
    "XID_154": ("watch", "hardware"),                 # refined per line by the recovery action
    "CHECK_MECHANICALS": ("replace", "hardware"),     # needs hands on the machine
    "UPDATE_SWFW": ("watch", "driver"),
    "CHECK_UVM": ("watch", "driver"),
    "CONTACT_SUPPORT": ("watch", "unknown"),
}
# R2b. An IGNORE bucket whose investigatory action points at user code is an application error.
APPLICATION_INVESTIGATIONS = ("CHECK_APP/CUDA", "XID_137_FLOW", "WORKFLOW_XID_13", "WORKFLOW_XID_31")

# R3. Codes whose action SPEC-CHECKS defines differently from the bucket, and codes NVIDIA gives
# no bucket for (162-172). Each entry says why.
ACTION_OVERRIDES: dict[int, tuple[str, str]] = {
    63: ("reset_gpu", "row remap pending: the spare row is used only after a GPU reset"),
    64: ("replace", "row remapping failed: the bank has no spare rows left"),
    92: ("watch", "high single-bit ECC rate: a trend to watch, not yet a failure"),
    94: ("watch", "contained ECC error: the application was stopped, the GPU keeps working"),
    162: ("none", "power smoothing re-engaged (cancels 163)"),
    163: ("watch", "power smoothing disengaged"),
    164: ("watch", "power smoothing circuitry low lifetime"),
    165: ("watch", "power smoothing circuitry lifetime exhausted"),
    166: ("reset_gpu", "NVLink confidential-computing traffic before link encryption"),
    167: ("reboot", "PCIe fatal timeout"),
    168: ("reboot", "errors in the write-protected region reduced GPU memory"),
    169: ("reset_gpu", "SEC2 micro-controller halt (like Xid 62)"),
    170: ("watch", "NVLink interrupt in confidential-computing mode"),
    171: ("reset_gpu", "uncorrectable DRAM error (detail to Xid 48)"),
    172: ("reset_gpu", "uncorrectable SRAM error (detail to Xid 48)"),
}

# R4. NVLink5 decode rows: resolution bucket -> our action.
DECODE_ACTIONS = {
    "RESET_GPU": "reset_gpu",
    "IGNORE": "none",
    "XID_154_EVAL": "watch",  # follow the Xid 154 that accompanies it, else restart the app
}

# R5. SXid: FM guide class -> our action when the error is fatal / not fatal.
SXID_FATAL_ACTION = "reboot"      # NVSwitch fatal errors need the switch and its GPUs reset
SXID_NONFATAL_ACTION = "watch"

RULE_TEXT = (
    "R1 SPEC-CHECKS pins the category: 13/31/43/45 application; 48, 63/64, 74, 79, 92, 94/95, "
    "119/120 and every code >= 140 hardware.",
    "R2 Otherwise the immediate-action bucket gives action and category (bucket_rules); an "
    "'Unused' code with bucket CONTACT_SUPPORT is category unknown, action watch.",
    "R2b An IGNORE bucket whose investigatory action is CHECK_APP/CUDA, XID_137_FLOW or "
    "WORKFLOW_XID_13/31 is an application error.",
    "R3 action_overrides replace the bucket's action (SPEC-CHECKS row-remap, ECC and the codes "
    "162-172 that have no bucket).",
    "R4 XIDs 144-150: each line is decoded through nvlink5_decode (IntrInfo bit pattern + error "
    "status); the row's bucket gives the action (RESET_GPU reset_gpu, IGNORE none, XID_154_EVAL "
    "watch); a promotable row's 'Action 2' pattern overrides it.",
    "R5 Xid 154 takes its action from the recovery action in the line.",
    "R6 Unknown codes: category unknown, action watch, reason still Xid<code>.",
)


class SourceError(RuntimeError):
    """A source table is missing or not in the shape this generator knows."""


# --- reading -------------------------------------------------------------------------------------


def _read_tsv(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """(provenance '#' lines, header, rows) of a fixture TSV."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc}") from exc
    lines = text.splitlines()
    provenance = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if ln and not ln.startswith("#")]
    if not body:
        raise SourceError(f"{path}: no header line")
    header = body[0].split("\t")
    rows = [ln.split("\t") for ln in body[1:]]
    return provenance, header, rows


def _cell(row: Sequence[str], i: int) -> str:
    """A flattened spreadsheet cell: ' | ' marked a newline inside the cell."""
    raw = row[i] if i < len(row) else ""
    parts = [p.strip() for p in raw.split(" | ")]
    return " ".join(p for p in parts if p).strip()


def _yes(value: str) -> bool:
    return value.strip().upper() == "YES"


def _digest(shared: Path, sources: Iterable[str]) -> str:
    h = hashlib.sha256()
    for rel in sources:
        h.update(rel.encode())
        h.update(b"\0")
        h.update((shared / rel).read_bytes())
    return h.hexdigest()


def _source_meta(shared: Path, rel: str, provenance: list[str]) -> dict[str, Any]:
    return {
        "path": rel,
        "sha256": hashlib.sha256((shared / rel).read_bytes()).hexdigest(),
        "provenance": [p.lstrip("#").strip() for p in provenance],
    }


# --- XID -----------------------------------------------------------------------------------------


def derive(code: int, description: str, immediate: str, investigatory: str
           ) -> tuple[str, str, str]:
    """(action, category, rule) for one catalog row, by the rules above."""
    if code in APPLICATION_CODES:
        pinned: str | None = "application"
    elif code in HARDWARE_CODES or code >= HARDWARE_FROM:
        pinned = "hardware"
    else:
        pinned = None
    if description == "Unused" and immediate == "CONTACT_SUPPORT":
        action, category, rule = "watch", "unknown", "R2 unused"
    elif immediate in BUCKET_RULES:
        action, category = BUCKET_RULES[immediate]
        rule = f"R2 {immediate}"
        if immediate == "IGNORE" and investigatory in APPLICATION_INVESTIGATIONS:
            category, rule = "application", f"R2b {investigatory}"
    else:
        action, category, rule = "watch", "unknown", "R2 no bucket"
    if code in ACTION_OVERRIDES:
        action = ACTION_OVERRIDES[code][0]
        rule += "; R3 " + ACTION_OVERRIDES[code][1]
    if pinned is not None and pinned != category:
        category = pinned
        rule += "; R1 SPEC-CHECKS category"
    if code == 154:
        rule += "; R5 recovery action in the line"
    if immediate == "WORKFLOW_NVLINK5_ERR":
        rule += "; R4 decoded per line"
    return action, category, rule


def _xids(rows: list[list[str]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not row or row[0].strip() != "XID":
            continue
        code = int(row[1])
        description = _cell(row, 3)
        immediate, investigatory = _cell(row, 8), _cell(row, 9)
        action, category, rule = derive(code, description, immediate, investigatory)
        out[str(code)] = {
            "mnemonic": _cell(row, 2),
            "description": description,
            "applies_to": [p for p, v in zip(("A100", "H100", "B100", "GB200"), row[4:8],
                                                 strict=False) if _yes(v)],
            "nvidia_immediate": immediate,
            "nvidia_investigatory": investigatory,
            "xid154_linkage": _cell(row, 10),
            "action": action,
            "category": category,
            "rule": rule,
        }
    if "79" not in out or "154" not in out:
        raise SourceError("the Xids sheet lacks codes 79/154: not the NVIDIA catalog?")
    return out


def _decode_rows(rows: list[list[str]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if not row or not row[0].strip().isdigit():
            continue
        action2 = _cell(row, 8)
        out.append({
            "xid": int(row[0]),
            "unit": _cell(row, 1),
            "intrinfo_v1": _cell(row, 2),
            "intrinfo_v2": _cell(row, 3),
            "error_status": [s.strip().lower() for s in _cell(row, 4).split("/") if s.strip()],
            "resolution": _cell(row, 5),
            "action": DECODE_ACTIONS.get(_cell(row, 5), "watch"),
            "action2_v1": _cell(row, 6),
            "action2_v2": _cell(row, 7),
            "action2": DECODE_ACTIONS.get(action2, "watch") if action2 else "",
            "investigatory": _cell(row, 9),
            "severity": _cell(row, 10),
            "hw_sw": _cell(row, 11),
        })
    return out


def build_xid_catalog(shared: Path) -> dict[str, Any]:
    tables = {rel: _read_tsv(shared / rel) for rel in XID_SOURCES}
    _, _, xid_rows = tables[XID_SOURCES[0]]
    _, _, bucket_rows = tables[XID_SOURCES[1]]
    _, _, decode_rows = tables[XID_SOURCES[2]]
    digest = _digest(shared, XID_SOURCES)
    buckets = {_cell(r, 0): _cell(r, 1) for r in bucket_rows if r and _cell(r, 0)}
    return {
        "about": {
            "what": "gpu-monitor XID catalog: NVIDIA's XID facts plus our action and category",
            "catalog_version": f"{RULES_VERSION}.{digest[:8]}",
            "rules_version": RULES_VERSION,
            "sources_sha256": digest,
            "regenerate": REGENERATE,
            "sources": [_source_meta(shared, rel, tables[rel][0]) for rel in XID_SOURCES],
            "rules": list(RULE_TEXT),
        },
        "bucket_rules": {k: {"action": a, "category": c} for k, (a, c) in BUCKET_RULES.items()},
        "action_overrides": {str(k): {"action": a, "why": w}
                             for k, (a, w) in ACTION_OVERRIDES.items()},
        "resolution_buckets": buckets,
        "xids": _xids(xid_rows),
        "nvlink5_decode": _decode_rows(decode_rows),
    }


# --- SXid ----------------------------------------------------------------------------------------


def build_sxid_catalog(shared: Path) -> dict[str, Any]:
    rel = SXID_SOURCES[0]
    provenance, header, rows = _read_tsv(shared / rel)
    if header[:3] != ["sxid", "name", "category"]:
        raise SourceError(f"{rel}: unexpected header {header[:3]}")
    digest = _digest(shared, SXID_SOURCES)
    sxids: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not row or not row[0].strip().isdigit():
            continue
        fatal_class = _cell(row, 2)
        sxids[str(int(row[0]))] = {
            "name": _cell(row, 1),
            "fatal_class": fatal_class,  # non_fatal | potential_fatal | always_fatal
            "action": SXID_NONFATAL_ACTION if fatal_class == "non_fatal" else SXID_FATAL_ACTION,
            "description": _cell(row, 7),
            "recovery": _cell(row, 8),
            "fm_guide": _cell(row, 9),
        }
    return {
        "about": {
            "what": "gpu-monitor SXid catalog: NVSwitch errors from the Fabric Manager guide",
            "catalog_version": f"{RULES_VERSION}.{digest[:8]}",
            "rules_version": RULES_VERSION,
            "sources_sha256": digest,
            "regenerate": REGENERATE,
            "sources": [_source_meta(shared, rel, provenance)],
            "rules": [
                "A line's own 'Fatal'/'Non-fatal' (or 'Severity 1'/'Severity 0') decides "
                "fatality; without one, fatal_class always_fatal is fatal.",
                f"Fatal -> {SXID_FATAL_ACTION}; not fatal -> {SXID_NONFATAL_ACTION}; the "
                "catalog's action is the one for the class when the line does not say.",
                "Unknown codes: fatality from the line, else not fatal; reason still SXid<code>.",
            ],
        },
        "sxids": sxids,
    }


# --- output --------------------------------------------------------------------------------------


def render(catalog: dict[str, Any]) -> str:
    return json.dumps(catalog, indent=1, ensure_ascii=False) + "\n"


def write_catalogs(shared: Path, out_dir: Path) -> list[Path]:
    written = []
    for name, build in ((XID_OUT, build_xid_catalog), (SXID_OUT, build_sxid_catalog)):
        text = render(build(shared))
        path = out_dir / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default="tests",
                        help="the folder holding fixtures/xid_catalog/ (default: the repository's tests/)")
    parser.add_argument("--out", default=str(OUT_DIR), help="where to write the catalogs")
    args = parser.parse_args(argv)
    try:
        for path in write_catalogs(Path(args.shared), Path(args.out)):
            print(f"wrote {path}")
    except (SourceError, OSError) as exc:
        print(f"generate_catalog: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
