"""Which NodeCondition each check's findings set, composed from the checks' declarations.

Each built-in check declares its problem class on its class (``Check.condition``); the
remediator publishes one NodeCondition per class. The policy (policy.py) is a pure function of
its inputs and imports nothing but the vocabulary, so it is handed this table through
``PolicySettings.problem_classes``; this module is where the remediation layer reads it from
the registry, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpu_monitor.registry import problem_classes
from gpu_monitor.remediate.policy import DEFAULT_CONDITION, REPORT_CHECK

__all__ = ["PROBLEM_CLASSES", "condition_type"]

#: check -> NodeCondition type, for every built-in check that declares one, and the
#: GPUHealthReports (a report is a finding of its own class). Plugins share DEFAULT_CONDITION.
PROBLEM_CLASSES: Mapping[str, str] = MappingProxyType({
    **problem_classes(),
    REPORT_CHECK: "GPUHealthReported",
})


def condition_type(check: str) -> str:
    return PROBLEM_CLASSES.get(check, DEFAULT_CONDITION)
