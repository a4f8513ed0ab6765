"""Parse ``dcgmi diag`` output (JSON of DCGM 2.x/3.x/4.x, and the plain-text table) into values.

Why a parser of its own: the dcgm_diag check must judge *every* result of *every* test per GPU
(public suites that look at ``results[0]`` only miss a failure on GPU 5), and the output shape
changed between DCGM releases. Everything here is a pure function over text; running ``dcgmi``
is the check's business (through ``CommandRunner``).

Shapes understood (real samples in tests/fixtures/dcgm_diag/):

- DCGM 3.x: top key ``"DCGM GPU Diagnostic"`` > ``test_categories[]`` > ``tests[]`` >
  ``results[]`` with ``gpu_ids`` ("0,1,2" string, "3" string or a bare int), ``status``
  (upper case ``PASS``/``FAIL``/``WARN``/``SKIP``), optional ``warnings`` (objects with
  ``warning``/``error_id``/``error_category``/``error_severity``) and ``info`` strings;
  ``version`` beside ``test_categories``. Arrays may hold ``null`` entries (DCGM 3.1 does).
- DCGM 2.x compact: the same key, results carry only ``status`` (no GPU): node-wide results.
- DCGM 4.x: top key ``"DCGM Diagnostic"``; results carry ``entity_group``/``entity_id``
  (``status`` ``Pass``/``Fail``/...), each test has a ``test_summary``; ``metadata`` and
  ``entity_groups`` sit at the top level; a failed run says ``runtime_error``.
- Text (``dcgmi diag`` without ``-j``): a ``| name | result |`` table with ``-----  Category``
  separators, results such as ``Pass``, ``Pass - All``, ``Pass - GPUs: 1, 2``,
  ``Fail - GPU: 0``, ``GPU3: Pass`` (4.x continuation rows), and ``Warning``/``Info``/``Error``
  rows whose text wraps at the column width (even mid-word).

Tolerated: text before the JSON (dcgmi and wrappers print banners such as ``WARNING: ...``) and
after it. Refused with ``DcgmParseError`` (the one error anything here raises, whatever the
input): no diagnostic object, truncated or malformed JSON (nesting too deep included), a status
word DCGM does not use, a GPU id outside 0..``MAX_GPU_ID`` or not a number (a GPU result without
one would silently count for every GPU), a table that does not parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.model import TokenEnum

KEY_3X = "DCGM GPU Diagnostic"
KEY_4X = "DCGM Diagnostic"
# dcgm_structs.h: DCGM_MAX_NUM_DEVICES is 32; ids up to 1023 leave room for a larger limit,
# while an id like 10^30 or -3 is not a GPU and refuses the report (it would name no target).
MAX_GPU_ID = 1023
_ID_RE = re.compile(r"^\s*[0-9]{1,6}\s*$")

# dcgm_errors.h (DCGM 3.3+/4.x) dcgmError_t, index = error_id. Names only, for details and docs.
DCGM_ERROR_NAMES: tuple[str, ...] = (
    "OK", "UNKNOWN", "UNRECOGNIZED", "PCI_REPLAY_RATE", "VOLATILE_DBE_DETECTED",
    "VOLATILE_SBE_DETECTED", "PENDING_PAGE_RETIREMENTS", "RETIRED_PAGES_LIMIT",
    "RETIRED_PAGES_DBE_LIMIT", "CORRUPT_INFOROM", "CLOCK_THROTTLE_THERMAL", "POWER_UNREADABLE",
    "CLOCK_THROTTLE_POWER", "NVLINK_ERROR_THRESHOLD", "NVLINK_DOWN", "NVSWITCH_FATAL_ERROR",
    "NVSWITCH_NON_FATAL_ERROR", "NVSWITCH_DOWN", "NO_ACCESS_TO_FILE", "NVML_API",
    "DEVICE_COUNT_MISMATCH", "BAD_PARAMETER", "CANNOT_OPEN_LIB", "DENYLISTED_DRIVER",
    "NVML_LIB_BAD", "GRAPHICS_PROCESSES", "HOSTENGINE_CONN", "FIELD_QUERY", "BAD_CUDA_ENV",
    "PERSISTENCE_MODE", "LOW_BANDWIDTH", "HIGH_LATENCY", "CANNOT_GET_FIELD_TAG",
    "FIELD_VIOLATION", "FIELD_THRESHOLD", "FIELD_VIOLATION_DBL", "FIELD_THRESHOLD_DBL",
    "UNSUPPORTED_FIELD_TYPE", "FIELD_THRESHOLD_TS", "FIELD_THRESHOLD_TS_DBL",
    "THERMAL_VIOLATIONS", "THERMAL_VIOLATIONS_TS", "TEMP_VIOLATION", "THROTTLING_VIOLATION",
    "INTERNAL", "PCIE_GENERATION", "PCIE_WIDTH", "ABORTED", "TEST_DISABLED", "CANNOT_GET_STAT",
    "STRESS_LEVEL", "CUDA_API", "FAULTY_MEMORY", "CANNOT_SET_WATCHES", "CUDA_UNBOUND",
    "ECC_DISABLED", "MEMORY_ALLOC", "CUDA_DBE", "MEMORY_MISMATCH", "CUDA_DEVICE",
    "ECC_UNSUPPORTED", "ECC_PENDING", "MEMORY_BANDWIDTH", "TARGET_POWER", "API_FAIL",
    "API_FAIL_GPU", "CUDA_CONTEXT", "DCGM_API", "CONCURRENT_GPUS", "TOO_MANY_ERRORS",
    "NVLINK_CRC_ERROR_THRESHOLD", "NVLINK_ERROR_CRITICAL", "ENFORCED_POWER_LIMIT",
    "MEMORY_ALLOC_HOST", "GPU_OP_MODE", "NO_MEMORY_CLOCKS", "NO_GRAPHICS_CLOCKS",
    "HAD_TO_RESTORE_STATE", "L1TAG_UNSUPPORTED", "L1TAG_MISCOMPARE", "ROW_REMAP_FAILURE",
    "UNCONTAINED_ERROR", "EMPTY_GPU_LIST", "DBE_PENDING_PAGE_RETIREMENTS",
    "UNCORRECTABLE_ROW_REMAP", "PENDING_ROW_REMAP", "BROKEN_P2P_MEMORY_DEVICE",
    "BROKEN_P2P_WRITER_DEVICE", "NVSWITCH_NVLINK_DOWN", "EUD_BINARY_PERMISSIONS",
    "EUD_NON_ROOT_USER", "EUD_SPAWN_FAILURE", "EUD_TIMEOUT", "EUD_ZOMBIE",
    "EUD_NON_ZERO_EXIT_CODE", "EUD_TEST_FAILED", "FILE_CREATE_PERMISSIONS",
    "PAUSE_RESUME_FAILED", "PCIE_H_REPLAY_VIOLATION", "GPU_EXPECTED_NVLINKS_UP",
    "NVSWITCH_EXPECTED_NVLINKS_UP", "XID_ERROR", "SBE_VIOLATION", "DBE_VIOLATION",
    "PCIE_REPLAY_VIOLATION", "SBE_THRESHOLD_VIOLATION", "DBE_THRESHOLD_VIOLATION",
    "PCIE_REPLAY_THRESHOLD_VIOLATION", "CUDA_FM_NOT_INITIALIZED", "SXID_ERROR",
    "GFLOPS_THRESHOLD_VIOLATION", "NAN_VALUE",
)

# dcgm_errors.h dcgmErrorSeverity_t.
SEVERITY_NAMES: Mapping[int, str] = {
    0: "NONE", 1: "MONITOR", 2: "ISOLATE", 3: "UNKNOWN", 4: "TRIAGE", 5: "CONFIG", 6: "RESET",
}


def error_name(error_id: int | None) -> str | None:
    """``58`` -> ``DCGM_FR_MEMORY_MISMATCH``; None for ids this table does not know."""
    if error_id is None or not 0 <= error_id < len(DCGM_ERROR_NAMES):
        return None
    return "DCGM_FR_" + DCGM_ERROR_NAMES[error_id]


class DcgmParseError(ValueError):
    """The text holds no usable diagnostic (garbage, truncated JSON, another document)."""


class DiagStatus(TokenEnum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    NOT_RUN = "not_run"


_STATUS_WORDS = {
    "pass": DiagStatus.PASS, "fail": DiagStatus.FAIL, "warn": DiagStatus.WARN,
    "warning": DiagStatus.WARN, "skip": DiagStatus.SKIP, "skipped": DiagStatus.SKIP,
    "not run": DiagStatus.NOT_RUN, "not_run": DiagStatus.NOT_RUN, "notrun": DiagStatus.NOT_RUN,
}


def parse_status(word: Any) -> DiagStatus:
    """``PASS`` (3.x), ``Pass`` (4.x, text), ``Not Run`` -> DiagStatus; ValueError otherwise."""
    status = _STATUS_WORDS.get(str(word).strip().lower()) if word is not None else None
    if status is None:
        raise DcgmParseError(f"unknown DCGM result status {word!r}")
    return status


@dataclass(frozen=True)
class DcgmWarning:
    """One entry of a result's ``warnings`` (or a text ``Warning``/``Error`` row)."""

    text: str
    error_id: int | None = None
    error_category: int | None = None
    error_severity: int | None = None

    @property
    def error_name(self) -> str | None:
        return error_name(self.error_id)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"warning": self.text}
        if self.error_id is not None:
            out["error_id"] = self.error_id
            name = self.error_name
            if name:
                out["error_name"] = name
        if self.error_category is not None:
            out["error_category"] = self.error_category
        if self.error_severity is not None:
            out["error_severity"] = self.error_severity
            out["error_severity_name"] = SEVERITY_NAMES.get(self.error_severity, "UNKNOWN")
        return out


@dataclass(frozen=True)
class DiagResult:
    """One test's outcome on one entity. ``gpu`` is None for node-wide results (2.x compact,
    text ``Pass - All``) and for non-GPU entities (``entity_group`` says which)."""

    category: str
    test: str
    status: DiagStatus
    gpu: int | None = None
    entity_group: str = "GPU"
    entity_id: int | None = None
    warnings: tuple[DcgmWarning, ...] = ()
    info: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagTestSummary:
    """DCGM 4.x ``test_summary``: the test's overall status, independent of entity results."""

    category: str
    test: str
    status: DiagStatus
    info: tuple[str, ...] = ()
    warnings: tuple[DcgmWarning, ...] = ()


@dataclass(frozen=True)
class DiagReport:
    """A parsed ``dcgmi diag`` run."""

    shape: str  # "3.x" (also 2.x compact), "4.x" or "text"
    results: tuple[DiagResult, ...]
    summaries: tuple[DiagTestSummary, ...] = ()
    version: str | None = None
    driver_version: str | None = None
    device_ids: tuple[str, ...] = ()
    runtime_error: str | None = None
    complete: bool = True  # text tables: the closing border was seen
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({r.gpu for r in self.results if r.gpu is not None}))

    def for_gpu(self, gpu: int) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.gpu == gpu)

    def node_wide(self) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.gpu is None)

    def with_status(self, status: DiagStatus) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.status is status)

    def tests(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.test for r in self.results))


# --- JSON ------------------------------------------------------------------------------------


def _find_diag_object(text: str) -> tuple[str, Mapping[str, Any]]:
    """The first JSON object in ``text`` holding a diagnostic key, and that key.

    Tries every ``{`` as a start, so banners before the JSON and junk after it are skipped;
    a document that starts but does not end is reported as truncated.
    """
    decoder = json.JSONDecoder()
    first_error: json.JSONDecodeError | None = None
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError as exc:
            first_error = first_error or exc
            continue
        except RecursionError:
            raise DcgmParseError("malformed dcgmi JSON: nested too deep to be a report") from None
        if isinstance(value, dict):
            for key in (KEY_4X, KEY_3X):
                if isinstance(value.get(key), Mapping):
                    return key, value
    if KEY_3X in text or KEY_4X in text:
        opened, closed = text.count("{") + text.count("["), text.count("}") + text.count("]")
        what = "truncated" if opened > closed else "malformed"
        detail = f" ({first_error.msg} at line {first_error.lineno})" if first_error else ""
        raise DcgmParseError(f"{what} dcgmi JSON: the diagnostic object does not parse{detail}")
    raise DcgmParseError("no DCGM diagnostic JSON object in the output")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return [v for v in value if v is not None]
    return [value]


def _opt_int(value: Any) -> int | None:
    """A decorative number (``error_id``, severity): ``None`` when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,9}\s*", value):
        return int(value.strip())
    return None


def gpu_id(value: Any, what: str = "GPU id") -> int:
    """A GPU (entity) id DCGM printed: 0..``MAX_GPU_ID`` as an int or a decimal string."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and _ID_RE.match(value):
        n = int(value)
    else:
        raise DcgmParseError(f"bad {what} {value!r}"[:200])
    if not 0 <= n <= MAX_GPU_ID:
        raise DcgmParseError(f"{what} {value!r} is outside 0..{MAX_GPU_ID}"[:200])
    return n


def _warnings(value: Any) -> tuple[DcgmWarning, ...]:
    out = []
    for w in _as_list(value):
        if isinstance(w, Mapping):
            out.append(DcgmWarning(
                text=str(w.get("warning") or w.get("message") or "").strip(),
                error_id=_opt_int(w.get("error_id")),
                error_category=_opt_int(w.get("error_category")),
                error_severity=_opt_int(w.get("error_severity")),
            ))
        elif str(w).strip():  # DCGM 2.x: bare strings
            out.append(DcgmWarning(text=str(w).strip()))
    return tuple(out)


def _info(value: Any) -> tuple[str, ...]:
    return tuple(str(i).strip() for i in _as_list(value) if str(i).strip())


def _gpu_ids(value: Any) -> list[int]:
    """``"0,1,2"``, ``"3"``, ``3`` or ``[0, 1]`` -> GPU ids; empty when absent."""
    if value is None:
        return []
    if isinstance(value, list):
        return [i for v in value for i in _gpu_ids(v)]
    if not isinstance(value, str):
        return [gpu_id(value, "gpu_ids")]
    return [gpu_id(part, "gpu_ids") for part in value.split(",") if part.strip()]


def _results_of(category: str, test: str, raw: Mapping[str, Any]) -> list[DiagResult]:
    status = parse_status(raw.get("status"))
    warnings, info = _warnings(raw.get("warnings")), _info(raw.get("info"))
    if "entity_id" in raw or "entity_group" in raw:  # DCGM 4.x
        group = str(raw.get("entity_group") or "GPU")
        eid = gpu_id(raw.get("entity_id"), f"{test}: entity_id")
        gpu = eid if group.upper() == "GPU" else None
        return [DiagResult(category, test, status, gpu, group, eid, warnings, info)]
    ids = _gpu_ids(raw.get("gpu_ids", raw.get("gpu_id")))
    if not ids:
        return [DiagResult(category, test, status, None, "GPU", None, warnings, info)]
    return [DiagResult(category, test, status, g, "GPU", g, warnings, info) for g in ids]


def parse_diag_json(text: str) -> DiagReport:
    """Parse ``dcgmi diag -j`` output of any supported DCGM release."""
    key, doc = _find_diag_object(text)
    diag = doc[key]
    results: list[DiagResult] = []
    summaries: list[DiagTestSummary] = []
    categories = diag.get("test_categories")
    if categories is not None and not isinstance(categories, list):
        raise DcgmParseError("test_categories is not a list")
    try:
        for cat in _as_list(categories):
            if not isinstance(cat, Mapping):
                raise DcgmParseError(f"test category is not an object: {cat!r}")
            category = str(cat.get("category") or "")
            for test in _as_list(cat.get("tests")):
                if not isinstance(test, Mapping) or "name" not in test:
                    raise DcgmParseError(f"test entry without a name: {test!r}"[:200])
                name = str(test["name"])
                for raw in _as_list(test.get("results")):
                    if not isinstance(raw, Mapping):
                        raise DcgmParseError(f"{name}: result is not an object: {raw!r}")
                    results.extend(_results_of(category, name, raw))
                summary = test.get("test_summary")
                if isinstance(summary, Mapping) and summary.get("status") is not None:
                    summaries.append(DiagTestSummary(
                        category, name, parse_status(summary.get("status")),
                        _info(summary.get("info")), _warnings(summary.get("warnings"))))
    except AttributeError as exc:  # a field of an unexpected type deep inside
        raise DcgmParseError(f"unexpected dcgmi JSON structure: {exc}") from None
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
    version = meta.get("version") or diag.get("version")
    driver = meta.get("Driver Version Detected") or diag.get("Driver Version Detected")
    runtime_error = diag.get("runtime_error") or doc.get("runtime_error")
    device_ids: list[str] = []
    for group in _as_list(doc.get("entity_groups")):
        if isinstance(group, Mapping) and str(group.get("entity_group", "")).upper() == "GPU":
            device_ids += [str(e.get("device_id")) for e in _as_list(group.get("entities"))
                           if isinstance(e, Mapping) and e.get("device_id") is not None]
    if not results and not summaries and not runtime_error:
        raise DcgmParseError("the DCGM diagnostic object holds no test results")
    return DiagReport(
        shape="4.x" if key == KEY_4X else "3.x",
        results=tuple(results),
        summaries=tuple(summaries),
        version=str(version) if version is not None else None,
        driver_version=str(driver) if driver is not None else None,
        device_ids=tuple(device_ids),
        runtime_error=str(runtime_error) if runtime_error else None,
        metadata=dict(meta),
    )


# --- text table ------------------------------------------------------------------------------

# "|-----  Deployment  --------+---...|" and "+-----  Hardware  ----------+---...+"
_CATEGORY_RE = re.compile(r"^[|+]-{3,}\s+(?P<name>[A-Za-z][A-Za-z ]*?)\s+-+\+")
_BORDER_RE = re.compile(r"^\+[-=]+\+[-=]+\+\s*$")
_ROW_RE = re.compile(r"^\|(?P<name>[^|]*)\|(?P<value>.*?)\|?\s*$")
# "Pass", "Pass - All", "Fail - GPU: 0", "Pass - GPUs: 1, 2, 3", "Skip - GPU 3",
# "FAIL - GPU 3: HBM memory test failed" (text after the GPU list is ignored).
_VALUE_RE = re.compile(
    r"^(?P<status>Pass|Fail|Warn|Skip|Not Run)\b\s*(?:-\s*(?P<who>All|GPUs?:?\s*[0-9,\s]+))?",
    re.IGNORECASE)
# 4.x continuation rows: "GPU0: Pass"
_GPU_VALUE_RE = re.compile(r"^GPU\s*(?P<gpu>[0-9]+):\s*(?P<status>Pass|Fail|Warn|Skip|Not Run)\b",
                           re.IGNORECASE)
_NOTE_ROWS = {"warning": "warning", "error": "error", "info": "info"}
_META_ROWS = {"dcgm version": "version", "driver version detected": "driver_version",
              "gpu device ids detected": "device_ids"}


def _who(text: str | None) -> list[int | None]:
    if not text or text.strip().lower() == "all":
        return [None]
    ids: list[int | None] = [gpu_id(n, "GPU") for n in re.findall(r"[0-9]+", text)]
    return ids or [None]


@dataclass
class _TextTest:
    category: str
    name: str
    rows: list[tuple[DiagStatus, int | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)


def parse_diag_text(text: str) -> DiagReport:
    """Parse the plain-text ``dcgmi diag`` table (the fallback when JSON is not available)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(r"^\|\s*Diagnostic\s*\|", ln)), None)
    if start is None:
        raise DcgmParseError("no dcgmi diag result table in the output")
    category = ""
    tests: list[_TextTest] = []
    meta: dict[str, str] = {}
    note: tuple[str, list[str]] | None = None  # (kind, segments) of the open Warning/Info row
    last_meta: str | None = None
    complete = False

    def close_note() -> None:
        nonlocal note
        if note is not None and tests:
            joined = "".join(note[1]).strip()
            if joined:
                (tests[-1].info if note[0] == "info" else tests[-1].warnings).append(joined)
        note = None

    for line in lines[start + 1:]:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        cat = _CATEGORY_RE.match(line)
        if cat:
            close_note()
            category, complete, last_meta = cat.group("name").strip(), False, None
            continue
        if _BORDER_RE.match(line):
            close_note()
            complete = bool(tests or meta)
            continue
        row = _ROW_RE.match(line)
        if not row:
            break  # the table ended (shell prompt, trailing text)
        complete = False
        name = row.group("name").strip()
        value = row.group("value")
        # Cells are "| text padded |": one space of padding on the left belongs to the frame.
        cell = value[1:] if value.startswith(" ") else value
        cell = cell.rstrip()
        if name:
            close_note()
            last_meta = None
            key = name.lower()
            if category.lower() == "metadata" or key in _META_ROWS:
                last_meta = _META_ROWS.get(key, key)
                meta[last_meta] = cell.strip()
                continue
            if key in _NOTE_ROWS:
                note = (_NOTE_ROWS[key], [cell])
                continue
            test = _TextTest(category, name)
            tests.append(test)
            _add_text_status(test, cell)
            continue
        # A continuation row: more of a wrapped note, another status line, or a wrapped value.
        if note is not None:
            note[1].append(cell)
            continue
        if last_meta is not None:
            meta[last_meta] += cell
            continue
        if tests:
            _add_text_status(tests[-1], cell)
    close_note()
    if not tests and not meta:
        raise DcgmParseError("the dcgmi diag table holds no rows")
    results: list[DiagResult] = []
    for t in tests:
        warnings = tuple(DcgmWarning(w) for w in t.warnings)
        for status, gpu in t.rows:
            results.append(DiagResult(t.category, t.name, status, gpu, "GPU", gpu,
                                      warnings, tuple(t.info)))
    ids = tuple(s.strip() for s in meta.get("device_ids", "").split(",") if s.strip())
    return DiagReport(shape="text", results=tuple(results), version=meta.get("version"),
                    driver_version=meta.get("driver_version"), device_ids=ids,
                    complete=complete, metadata=dict(meta))


def _add_text_status(test: _TextTest, cell: str) -> None:
    text = cell.strip()
    if not text:
        return
    m = _GPU_VALUE_RE.match(text)
    if m:
        gpu = gpu_id(m.group("gpu"), "GPU")
        status = parse_status(m.group("status"))
        # "software | Pass" followed by "GPU0: Pass" rows: the per-GPU rows replace the summary.
        test.rows = [(s, g) for s, g in test.rows if g is not None]
        test.rows.append((status, gpu))
        return
    m = _VALUE_RE.match(text)
    if m:
        status = parse_status(m.group("status"))
        test.rows.extend((status, g) for g in _who(m.group("who")))
        return
    if test.rows:  # wrapped text of the previous value: not a status
        return
    raise DcgmParseError(f"{test.name}: result {text!r} is not a DCGM status")


# --- either ----------------------------------------------------------------------------------


def parse_diag(text: str) -> DiagReport:
    """JSON when the output holds a diagnostic object, else the text table.

    The JSON error wins when the output looks like JSON (``{`` present, no table): a truncated
    document must be reported as truncated, not as "no table".
    """
    try:
        return parse_diag_json(text)
    except DcgmParseError as json_error:
        if re.search(r"^\|\s*Diagnostic\s*\|", text, re.MULTILINE):
            return parse_diag_text(text)
        raise json_error from None


_CONNECTION_PATTERNS = (
    re.compile(r"unable to establish a connection to the specified host", re.IGNORECASE),
    re.compile(r"unable to connect to host engine", re.IGNORECASE),
    re.compile(r"host engine connection invalid", re.IGNORECASE),
    re.compile(r"connection to the host engine (?:was )?(?:lost|refused|failed)", re.IGNORECASE),
)


def connection_error(text: str) -> str | None:
    """The line in which dcgmi says it could not reach nv-hostengine, or None.

    dcgmi prints ``Error: unable to establish a connection to the specified host: localhost``
    and ``Error: Unable to connect to host engine. Host engine connection invalid/disconnected.``
    when no host engine runs (or the ``--host`` one is unreachable).
    """
    for line in text.splitlines():
        if any(p.search(line) for p in _CONNECTION_PATTERNS):
            return line.strip()
    return None


def worst_diag_status(statuses: Iterable[DiagStatus]) -> DiagStatus | None:
    """fail > warn > pass > skip/not run; None for no statuses."""
    order = {DiagStatus.FAIL: 4, DiagStatus.WARN: 3, DiagStatus.PASS: 2, DiagStatus.SKIP: 1,
             DiagStatus.NOT_RUN: 0}
    statuses = list(statuses)
    return max(statuses, key=order.__getitem__) if statuses else None
