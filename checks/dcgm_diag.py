"""dcgm_diag: run NVIDIA's DCGM diagnostic (``dcgmi diag -r LEVEL -j``) and judge every result.

DCGM's own stress and integration plugins (memory, pcie, targeted stress/power, ...) test things
no NVML counter shows. This check runs them at the profile's level (``dcgm.level``, default 2,
about two minutes), parses the JSON of any DCGM release (gpu_monitor/hw/dcgm.py) and reports one
result per GPU from *every* result of *every* test: a ``Fail`` anywhere fails the GPU
(``DcgmDiagFail``, the test, DCGM's warning text and ``error_id`` in details), a ``Warn``
degrades it, ``Skip`` is noted. Results DCGM gives without a GPU (2.x compact output, text
``Pass - All``) are reported on ``node``.

DCGM missing or not reachable is never a hardware finding: no ``dcgmi`` or no local host engine
→ ``skipped`` (``RequirementMissing`` / ``DcgmUnavailable``); a configured ``--host`` engine that
cannot be reached, a hang, a non-zero exit without a report, garbage or truncated JSON →
``unknown`` with the reason. The bootstrap requires this check by default: there a missing
``dcgmi`` or host engine makes the verdict ``unknown`` naming it, unless the profile says
``checks.dcgm_diag.required: false`` for its SKU (or the config disables the check). The full
image ships ``dcgmi``; the host engine is the host's or the GPU operator's (docs/coexistence.md).

An ``ok`` is only as good as the report: a text table cut short (``DcgmIncomplete``) or a
non-zero exit that no failure explains (``DcgmError``) makes every GPU that would have passed
``unknown``, and a GPU NVML enumerates that the report does not cover is ``unknown``
(``DcgmGpuNotReported``), never silently absent.

Settings (``ctx.setting("dcgm_diag", ...)``): ``level`` (1–4, profile ``dcgm.level``), ``host``
(``--host`` of a separate nv-hostengine, config only), ``parameters`` (``-p`` test parameters,
config only), ``timeout_s`` (default by level).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from checks._builtin import BuiltinCheck
from checks._tool_output import output_tail
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw import dcgm
from gpu_monitor.hw.dcgm import DcgmParseError, DiagResult, DiagStatus, worst_diag_status
from gpu_monitor.model import NODE, Action, Kind, Result, Status, gpu_target
from gpu_monitor.profiles.schema import Nullable, Str

# Seconds dcgmi may take per level (NVIDIA: L1 seconds, L2 ~2 min, L3 ~15 min, L4 longer).
LEVEL_TIMEOUT_S = {1: 180.0, 2: 900.0, 3: 2700.0, 4: 7200.0}
# dcgm_errors.h severities that say what to do with the GPU.
SEVERITY_ACTIONS = {6: Action.RESET_GPU, 2: Action.REPLACE}


class DcgmDiag(BuiltinCheck):
    kinds = frozenset({Kind.BOOTSTRAP})
    summary = "DCGM diagnostic (dcgmi diag -r LEVEL -j): every test's result per GPU"
    requires = frozenset({"dcgm", "gpu"})
    unavailable_reasons = ("DcgmUnavailable",)  # dcgmi present, no host engine answering
    invasive = True
    timeout = LEVEL_TIMEOUT_S[4] + 120.0
    reasons = (
        "DcgmDiagFail",
        "DcgmDiagWarn",
        "DcgmDiagSkipped",
        "DcgmUnavailable",
        "DcgmHostEngineUnreachable",
        "DcgmTimeout",
        "DcgmError",
        "DcgmBadOutput",
        "DcgmIncomplete",
        "DcgmGpuNotReported",
    )
    sections = ("dcgm",)
    settings = {
        "host": Setting(Nullable(Str(what="a DCGM host engine address such as 'localhost:5555'")),
                        None, "address of a separate DCGM host engine (`dcgmi --host`)"),
        "parameters": Setting(Nullable(Str(what="dcgmi diag -p parameters")), None,
                              "`dcgmi diag -p` test parameters"),
    }
    condition = "GPUDiagnosticsFailed"

    def run(self, ctx: Context) -> Sequence[Result]:
        level = int(ctx.setting(self.name, "level", 2))
        host = ctx.setting(self.name, "host")
        params = ctx.setting(self.name, "parameters")
        timeout = float(ctx.setting(self.name, "timeout_s", LEVEL_TIMEOUT_S.get(level, 900.0)))
        argv = ["dcgmi", "diag", "-r", str(level), "-j"]
        if host:
            argv += ["--host", str(host)]
        if params:
            argv += ["-p", str(params)]
        base = {"level": level, "command": " ".join(argv)}

        out = ctx.host.commands.run(argv, timeout=timeout)
        if out.not_found:
            return [self.result(ctx, Status.SKIPPED, NODE, "DcgmUnavailable",
                                "DCGM not installed (dcgmi not found on PATH)", base)]
        if out.timed_out:
            return [self.result(
                ctx, Status.UNKNOWN, NODE, "DcgmTimeout",
                f"dcgmi diag -r {level} did not finish within {timeout:g} s (killed)",
                {**base, "timeout_s": timeout, "output_tail": output_tail(out.stdout + out.stderr)})]
        if out.returncode is None:
            return [self.result(ctx, Status.UNKNOWN, NODE, "DcgmError",
                                f"dcgmi could not be started: {out.error}", base)]
        text = out.stdout + ("\n" + out.stderr if out.stderr else "")
        details = {**base, "exit_code": out.returncode, "duration_s": round(out.duration_s, 3)}
        try:
            diag = dcgm.parse_diag(out.stdout)
        except DcgmParseError as exc:
            return [self._no_report(ctx, text, exc, host, details)]
        if diag.runtime_error:
            return [self.result(ctx, Status.UNKNOWN, NODE, "DcgmError",
                                f"dcgmi diag reported a runtime error: {diag.runtime_error}",
                                {**details, "runtime_error": diag.runtime_error})]
        return self._judge(ctx, diag, details, out.returncode)

    # --- no usable report ----------------------------------------------------------------

    def _no_report(self, ctx: Context, text: str, exc: DcgmParseError, host: Any,
                   details: dict[str, Any]) -> Result:
        conn = dcgm.connection_error(text)
        details = {**details, "output_tail": output_tail(text)}
        if conn and not host:
            return self.result(
                ctx, Status.SKIPPED, NODE, "DcgmUnavailable",
                f"DCGM host engine not running on this node: {conn}", details)
        if conn:
            return self.result(
                ctx, Status.UNKNOWN, NODE, "DcgmHostEngineUnreachable",
                f"configured DCGM host engine {host} is not reachable: {conn}", details)
        if details["exit_code"] != 0:
            return self.result(
                ctx, Status.UNKNOWN, NODE, "DcgmError",
                f"dcgmi diag exited {details['exit_code']} without a report ({exc})", details)
        return self.result(ctx, Status.UNKNOWN, NODE, "DcgmBadOutput",
                           f"dcgmi diag output is not a diagnostic report: {exc}", details)

    # --- judging a report ------------------------------------------------------------------

    def _judge(self, ctx: Context, diag: dcgm.DiagReport, details: dict[str, Any],
               exit_code: int) -> list[Result]:
        """One result per target, each earned:

        1. every GPU DCGM names is judged from all its results (``_target``);
        2. an ``ok`` is only as good as the report: a table cut short (``DcgmIncomplete``) or a
           non-zero exit that no failure or warning explains (``DcgmError``) turns every ``ok``
           into ``unknown`` (failures seen before the cut still count);
        3. every GPU NVML enumerates that the report does not cover is ``unknown``
           (``DcgmGpuNotReported``): a run that left a GPU out has not tested it. Results that
           name no GPU (2.x compact, text ``Pass - All``) cover every GPU, unless the GPUs
           dcgmi says it detected are fewer than NVML's.
        """
        meta = {**details, "dcgm_version": diag.version, "output_shape": diag.shape}
        expected = _expected_gpus(ctx)
        uuids = expected or {}
        results: dict[str, Result] = {}
        for gpu in diag.gpus:
            results[gpu_target(gpu)] = self._target(
                ctx, gpu_target(gpu), diag.for_gpu(gpu),
                {**meta, "gpu_index": gpu, "uuid": uuids.get(gpu)})
        node_wide = diag.node_wide()
        failed_summaries = [s for s in diag.summaries if s.status is DiagStatus.FAIL
                            and not any(r.test == s.test and r.status is DiagStatus.FAIL
                                        for r in diag.results)]
        if node_wide or failed_summaries:
            res = self._target(ctx, NODE, node_wide, meta)
            if failed_summaries:
                tests = ", ".join(s.test for s in failed_summaries)
                res = self.result(
                    ctx, Status.FAILED, NODE, "DcgmDiagFail",
                    f"DCGM test(s) failed with no GPU named: {tests}",
                    {**meta, "failed_tests": [s.test for s in failed_summaries],
                     "summary_info": [i for s in failed_summaries for i in s.info]})
            results[NODE] = res
        any_bad = any(r.status in (Status.FAILED, Status.DEGRADED) for r in results.values())
        untrusted: tuple[str, str] | None = None
        if not diag.complete:
            untrusted = ("DcgmIncomplete", "the dcgmi diag table ends before its closing border "
                                           "(output cut short): tests after the cut were not seen")
        elif exit_code != 0 and not any_bad:
            untrusted = ("DcgmError", f"dcgmi diag exited {exit_code} although no test failed "
                                      "or warned: the report cannot be trusted")
        if untrusted is not None:
            reason, why = untrusted
            for target, r in list(results.items()):
                if r.status is Status.OK:
                    results[target] = self.result(
                        ctx, Status.UNKNOWN, target, reason, f"{why} ({r.message})",
                        {**dict(r.details), "pending_reason": r.reason})
            if NODE not in results:
                results[NODE] = self.result(ctx, Status.UNKNOWN, NODE, reason, why, meta)
        if expected is not None:
            self._coverage(ctx, diag, expected, results, meta)
        if not results:
            results[NODE] = self.result(ctx, Status.UNKNOWN, NODE, "DcgmBadOutput",
                                        "dcgmi diag reported no result for any GPU", meta)
        return list(results.values())

    def _coverage(self, ctx: Context, diag: dcgm.DiagReport, expected: dict[int, str | None],
                  results: dict[str, Result], meta: dict[str, Any]) -> None:
        detected = len(diag.device_ids)
        all_covered = bool(diag.node_wide()) and (not detected or detected >= len(expected))
        for index in sorted(expected):
            target = gpu_target(index)
            if target in results or all_covered:
                continue
            if diag.node_wide():
                why = (f"dcgmi detected {detected} GPU(s) (GPU Device IDs Detected), NVML "
                       f"enumerates {len(expected)}, and its results name no GPU: {target} is "
                       "not known to be tested")
            else:
                why = f"dcgmi diag reported no result for {target}"
            reported = sorted(diag.gpus)
            results[target] = self.result(
                ctx, Status.UNKNOWN, target, "DcgmGpuNotReported", why,
                {**meta, "gpu_index": index, "uuid": expected[index],
                 "gpus_reported": reported, "gpus_expected": sorted(expected),
                 "device_ids_detected": list(diag.device_ids)})

    def _target(self, ctx: Context, target: str, rows: Sequence[DiagResult],
                meta: dict[str, Any]) -> Result:
        tests: dict[str, str] = {}
        for r in rows:
            prev = tests.get(r.test)
            status = worst_diag_status([DiagStatus(prev), r.status]) if prev else r.status
            tests[r.test] = str(status)
        failures = [_finding(r) for r in rows if r.status is DiagStatus.FAIL]
        warnings = [_finding(r) for r in rows if r.status is DiagStatus.WARN]
        skipped = sorted({r.test for r in rows
                          if r.status in (DiagStatus.SKIP, DiagStatus.NOT_RUN)})
        details = {**meta, "tests": tests, "failures": failures, "warnings": warnings,
                   "skipped_tests": skipped}
        overall = worst_diag_status(r.status for r in rows)
        if overall is DiagStatus.FAIL:
            severities = [w.get("error_severity") for f in failures for w in f["warnings"]]
            action = _action(severities)
            text = "; ".join(f"{f['test']}: {_first_warning(f)}" for f in failures)
            return self.result(ctx, Status.FAILED, target, "DcgmDiagFail",
                               f"DCGM diagnostic failed on {target}: {text}", details, action)
        if overall is DiagStatus.WARN:
            text = "; ".join(f"{w['test']}: {_first_warning(w)}" for w in warnings)
            return self.result(ctx, Status.DEGRADED, target, "DcgmDiagWarn",
                               f"DCGM diagnostic warned on {target}: {text}", details,
                               Action.WATCH)
        if overall is DiagStatus.PASS:
            note = f" ({len(skipped)} skipped: {', '.join(skipped)})" if skipped else ""
            return self.ok(ctx, target, f"{len(tests)} DCGM tests passed{note}", details)
        return self.result(ctx, Status.SKIPPED, target, "DcgmDiagSkipped",
                           f"DCGM skipped every test on {target}", details)


def _finding(r: DiagResult) -> dict[str, Any]:
    return {"test": r.test, "category": r.category, "status": str(r.status),
            "warnings": [w.to_dict() for w in r.warnings], "info": list(r.info)}


def _first_warning(finding: dict[str, Any]) -> str:
    ws = finding["warnings"]
    if not ws:
        return finding["status"]
    w = ws[0]
    code = f" (error_id {w['error_id']})" if "error_id" in w else ""
    return f"{w['warning']}{code}"


def _action(severities: Sequence[Any]) -> Action:
    actions = [SEVERITY_ACTIONS[s] for s in severities if s in SEVERITY_ACTIONS]
    if Action.REPLACE in actions:
        return Action.REPLACE
    if Action.RESET_GPU in actions:
        return Action.RESET_GPU
    return Action.NONE


def _expected_gpus(ctx: Context) -> dict[int, str | None] | None:
    """GPU index -> UUID of every GPU NVML enumerates (lost ones too: DCGM cannot have tested
    them); None when NVML cannot say, and then no GPU is expected beyond those DCGM names."""
    try:
        if not ctx.host.nvml.available():
            return None
        return {g.index: g.uuid for g in ctx.host.nvml.gpus()}
    except Exception:  # noqa: BLE001 - the expectation is best effort, DCGM's verdict stands
        return None
