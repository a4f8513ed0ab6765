"""docs/checks.md, docs/metrics.md and the marked regions of docs/configuration.md are generated
from the code's declarations; they must not drift."""

import pytest

from gpu_monitor import docs_gen
from tests.conftest import REPO

DOCS = REPO / "docs"


@pytest.mark.parametrize("name", sorted(docs_gen.TARGETS))
def test_generated_doc_is_current(name):
    want = docs_gen.TARGETS[name]()
    have = (DOCS / name).read_text()
    assert have == want, f"docs/{name} is stale: run `python -m gpu_monitor.docs_gen`"


def test_every_exported_metric_is_documented():
    from gpu_monitor.failfast.metrics import FAILFAST_METRICS
    from gpu_monitor.metrics import documented_metrics
    from gpu_monitor.remediate.metrics import REMEDIATION_METRICS

    golden = (REPO / "tests" / "golden" / "h100_faulty.prom").read_text()
    exported = {line.split()[2] for line in golden.splitlines() if line.startswith("# TYPE")}
    documented = {m.name for m in (*documented_metrics(), *REMEDIATION_METRICS,
                                   *FAILFAST_METRICS)}
    assert exported <= documented, f"undocumented: {exported - documented}"


def test_the_packaged_runbook_is_current():
    from gpu_monitor.nodeview import runbook

    want = runbook.render_json((DOCS / "runbook.md").read_text(encoding="utf-8"))
    have = runbook.PACKAGED.read_text(encoding="utf-8")
    assert have == want, ("gpu_monitor/nodeview/runbook.json is stale (docs/runbook.md "
                          "changed): run `python -m gpu_monitor.docs_gen`")
