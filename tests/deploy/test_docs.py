"""The operator docs stay true to the code and to each other.

The runbook has a section for every check and says something about every reason a check
declares (numbered Xid/SXid codes are covered by the catalog in docs/xid.md), and for every
quarantine state; every relative link in the deployment docs reaches an existing file and
heading; README links each of them.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.deploy_helpers import DOCS, REPO, heading_anchors

OPERATOR_DOCS = ("architecture.md", "install.md", "runbook.md", "coexistence.md",
                 "manual-checks.md", "deploy-images.md")
#: Checks the runbook covers even where the code is not in this tree yet.
RUNBOOK_CHECKS = ("inventory", "xid", "nvswitch", "throttle", "temperature", "nvlink_state",
                  "rdma_ports", "pcie_aer", "ecc_memory", "pcie", "dcgm_diag", "rdma_loopback",
                  "burn_in", "nccl_allreduce", "nvlink_peer", "sdc_probe")
RUNBOOK_SECTIONS = ("sdc-alarms", "most-loss-spikes-are-not-sdc", "breaker-tripped",
                    "quarantine-states", "bootstrap-failed", "drain-failed", "dry-run")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _runbook() -> str:
    return (DOCS / "runbook.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", OPERATOR_DOCS)
def test_relative_links_reach_existing_files_and_headings(name):
    path = DOCS / name
    text = path.read_text(encoding="utf-8")
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        assert dest.exists(), f"{name}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in heading_anchors(dest.read_text(encoding="utf-8")), (
                f"{name}: link to {target}: no such heading in {dest.name}")


def test_the_runbook_has_a_section_per_check_and_per_alarm():
    from gpu_monitor.registry import all_check_classes

    anchors = heading_anchors(_runbook())
    names = set(RUNBOOK_CHECKS) | {c.name for c in all_check_classes(plugins=False)}
    for name in sorted(names):
        assert name in anchors, f"docs/runbook.md has no section for the check {name}"
    for section in RUNBOOK_SECTIONS:
        assert section in anchors, f"docs/runbook.md has no section #{section}"


def test_the_runbook_explains_every_declared_reason():
    from gpu_monitor.check import FRAMEWORK_REASONS
    from gpu_monitor.registry import all_check_classes

    text = _runbook()
    missing = {}
    for cls in all_check_classes(plugins=False):
        for reason in (*FRAMEWORK_REASONS, *cls.reasons):
            if re.fullmatch(r"S?Xid\d+", reason):
                continue  # one row per catalog class in the xid table; docs/xid.md has them all
            if f"`{reason}`" not in text:
                missing.setdefault(cls.name, []).append(reason)
    assert not missing, f"reasons the runbook does not mention: {missing}"


def test_the_runbook_covers_every_quarantine_state():
    from gpu_monitor.state.node import NODE_STATES

    text = _runbook()
    section = text[text.index("## Quarantine states"):]
    for state in NODE_STATES:
        assert f"| `{state}` |" in section, f"quarantine state {state} is not in the runbook"


def test_the_install_guide_has_the_command_the_bootstrap_taint_and_the_versions():
    text = (DOCS / "install.md").read_text(encoding="utf-8")
    assert "kubectl apply -k daemonset/" in text
    assert "--register-with-taints=gpu-monitor.io/bootstrap=:NoSchedule" in text
    assert "dry_run" in text and "privileged" in text
    for version in ("1.28", "1.30", "1.32"):
        assert version in text


def test_readme_links_every_operator_doc():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for name in OPERATOR_DOCS:
        assert f"](docs/{name})" in readme, f"README does not link docs/{name}"
