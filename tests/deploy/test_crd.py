"""The GPUHealthReport CRD matches what the code reads and writes.

Group, version, kind and plural come from ``gpu_monitor.remediate.reports``; the bodies that
``report_object()`` builds for detectors must pass the CRD's schema, and the schema must refuse
what the daemon could not use (a report without a node).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpu_monitor.remediate import reports
from tests.deploy.deploy_helpers import base_objects, find


def _crd():
    return find(base_objects(), "CustomResourceDefinition",
                f"{reports.PLURAL}.{reports.GROUP}")


def _version():
    (v,) = _crd()["spec"]["versions"]
    return v


def _spec_schema():
    return _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_names_group_and_version_are_the_codes():
    spec = _crd()["spec"]
    assert spec["group"] == reports.GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == reports.KIND
    assert spec["names"]["plural"] == reports.PLURAL
    v = _version()
    assert v["name"] == reports.VERSION and v["served"] and v["storage"]


def test_spec_fields_are_node_reason_source_evidence_and_observed_time():
    schema = _spec_schema()
    props = schema["properties"]
    assert set(props) == {"node", "reason", "source", "evidence", "observedTime"}
    assert schema["required"] == ["node"]
    assert props["evidence"]["type"] == "object"
    assert props["evidence"]["x-kubernetes-preserve-unknown-fields"] is True
    assert props["observedTime"] == {**props["observedTime"], "type": "string",
                                     "format": "date-time"}
    for name in ("node", "reason", "source"):
        assert props[name]["type"] == "string"


def test_printer_columns_show_node_reason_source_and_times():
    cols = {c["name"]: c for c in _version()["additionalPrinterColumns"]}
    assert cols["Node"]["jsonPath"] == ".spec.node"
    assert cols["Reason"]["jsonPath"] == ".spec.reason"
    assert cols["Source"]["jsonPath"] == ".spec.source"
    assert cols["Observed"] == {**cols["Observed"], "type": "date",
                                "jsonPath": ".spec.observedTime"}
    assert cols["Age"]["jsonPath"] == ".metadata.creationTimestamp"


def _validator():
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema (a dependency of kubernetes-validate) is not installed")
    schema = _version()["schema"]["openAPIV3Schema"]

    def strip(s):  # OpenAPI extensions are not JSON Schema keywords
        if isinstance(s, dict):
            return {k: strip(v) for k, v in s.items() if not k.startswith("x-kubernetes-")}
        return s

    return jsonschema.Draft202012Validator(strip(schema),
                                           format_checker=jsonschema.FormatChecker())


def test_the_bodies_detectors_build_pass_the_schema():
    body = reports.report_object(
        "gpu-node-17", "SdcAlarm", "sdc-library",
        {"job": "train-7", "step": 1200, "ranks": [{"rank": 3, "gpu_uuid": "GPU-5f0c"}]},
        datetime(2026, 5, 1, 12, 0, 0, 31200, tzinfo=timezone.utc), "gpu-monitor")
    errors = [e.message for e in _validator().iter_errors(body)]
    assert not errors
    assert body["metadata"]["labels"][reports.NODE_LABEL] == "gpu-node-17"


def test_a_report_without_a_node_is_refused():
    body = {"apiVersion": f"{reports.GROUP}/{reports.VERSION}", "kind": reports.KIND,
            "metadata": {"name": "x"}, "spec": {"reason": "SdcAlarm"}}
    assert list(_validator().iter_errors(body)), "spec.node must be required"


def test_the_spec_is_immutable():
    rules = _spec_schema()["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf"}.items() <= rules[0].items()
