"""The shipped XID/SXid catalogs: reproducible from the in-repo vendor tables, versioned, consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_monitor.model import Action
from gpu_monitor.rules import (
    CATEGORIES,
    CatalogError,
    SxidCatalog,
    XidCatalog,
    sxid_catalog,
    xid_catalog,
)
from gpu_monitor.rules import generate_catalog as gen

RULES_DIR = Path(gen.__file__).resolve().parent
REPO = RULES_DIR.parent.parent


# The vendor tables the catalog is generated from, as recorded in the repository's own copy of
# the fixtures (tests/fixtures/xid_catalog, provenance in tests/fixtures/PROVENANCE.md).
SOURCES = REPO / "tests"


def test_regenerating_gives_the_shipped_files_byte_for_byte(tmp_path):
    assert gen.main(["--shared", str(SOURCES), "--out", str(tmp_path)]) == 0
    for name in (gen.XID_OUT, gen.SXID_OUT):
        fresh = (tmp_path / name).read_bytes()
        shipped = (RULES_DIR / name).read_bytes()
        assert fresh == shipped, (
            f"{name} is stale: run `{gen.REGENERATE}` and review the diff")


def test_a_changed_source_changes_the_version(tmp_path):
    copy = tmp_path / "shared"
    for rel in gen.XID_SOURCES:
        dst = copy / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((SOURCES / rel).read_bytes())
    before = gen.build_xid_catalog(copy)["about"]["catalog_version"]
    src = copy / gen.XID_SOURCES[0]
    src.write_text(src.read_text() + "\n")
    after = gen.build_xid_catalog(copy)["about"]["catalog_version"]
    assert before != after and before.split(".")[0] == after.split(".")[0]


def test_missing_sources_fail_with_a_message(tmp_path, capsys):
    assert gen.main(["--shared", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_header_names_sources_provenance_version_and_how_to_regenerate():
    about = json.loads((RULES_DIR / gen.XID_OUT).read_text())["about"]
    assert about["regenerate"] == "python -m gpu_monitor.rules.generate_catalog --shared tests"
    assert about["catalog_version"] == xid_catalog().version
    assert about["catalog_version"].startswith(f"{gen.RULES_VERSION}.")
    paths = [s["path"] for s in about["sources"]]
    assert paths == list(gen.XID_SOURCES)
    for s in about["sources"]:
        assert s["provenance"] and "Xid-Catalog.xlsx" in s["provenance"][0]
        assert len(s["sha256"]) == 64
    sx = json.loads((RULES_DIR / gen.SXID_OUT).read_text())["about"]
    assert "Fabric Manager" in sx["sources"][0]["provenance"][0]


def test_every_entry_has_a_valid_action_and_category():
    cat = xid_catalog()
    codes = cat.codes()
    assert codes == list(range(1, 173))
    for code in codes:
        info = cat.get(code)
        assert info.category in CATEGORIES
        assert isinstance(info.action, Action)
        assert info.rule.startswith("R2")
    for code in sxid_catalog().codes():
        info = sxid_catalog().get(code)
        assert info.fatal_class in ("non_fatal", "potential_fatal", "always_fatal")
        assert info.action in (Action.WATCH, Action.REBOOT)


# NVIDIA bucket -> our action (rule R2), for codes the spec does not pin.
BUCKET_EXAMPLES = [
    (46, "RESET_GPU", Action.RESET_GPU, "hardware"),
    (79, "RESTART_BM", Action.REBOOT, "hardware"),
    (8, "RESTART_APP", Action.NONE, "application"),
    (38, "IGNORE", Action.NONE, "driver"),
    (137, "IGNORE", Action.NONE, "application"),  # R2b: investigatory XID_137_FLOW
    (54, "CHECK_MECHANICALS", Action.REPLACE, "hardware"),
    (78, "UPDATE_SWFW", Action.WATCH, "driver"),
    (1, "CONTACT_SUPPORT", Action.WATCH, "unknown"),  # "Unused"
    (48, "WORKFLOW_XID_48", Action.RESET_GPU, "hardware"),
    (74, "WORKFLOW_NVLINK_ERR", Action.RESET_GPU, "hardware"),
    (149, "WORKFLOW_NVLINK5_ERR", Action.RESET_GPU, "hardware"),
    (154, "XID_154", Action.WATCH, "hardware"),
]


@pytest.mark.parametrize("code, bucket, action, category", BUCKET_EXAMPLES)
def test_bucket_rules(code, bucket, action, category):
    info = xid_catalog().get(code)
    assert (info.nvidia_immediate, info.action, info.category) == (bucket, action, category)


# SPEC-CHECKS pins these whatever NVIDIA's bucket says (rules R1/R3).
SPEC_PINS = [
    (13, "application"), (31, "application"), (43, "application"), (45, "application"),
    (48, "hardware"), (63, "hardware"), (64, "hardware"), (74, "hardware"), (79, "hardware"),
    (92, "hardware"), (94, "hardware"), (95, "hardware"), (119, "hardware"), (120, "hardware"),
    (140, "hardware"), (162, "hardware"), (172, "hardware"),
]


@pytest.mark.parametrize("code, category", SPEC_PINS)
def test_spec_pinned_categories(code, category):
    assert xid_catalog().get(code).category == category


def test_codes_without_a_vendor_bucket_have_an_explicit_action():
    cat = xid_catalog()
    for code in range(162, 173):
        info = cat.get(code)
        assert info.nvidia_immediate == ""
        assert "R3" in info.rule


def test_unknown_codes():
    info = xid_catalog().get(4242)
    assert (info.known, info.category, info.action, info.reason) == (
        False, "unknown", Action.WATCH, "Xid4242")
    sx = sxid_catalog().get(26006)
    assert (sx.known, sx.reason) == (False, "SXid26006")


def test_nvlink5_decode_table_is_shipped():
    data = json.loads((RULES_DIR / gen.XID_OUT).read_text())
    rows = data["nvlink5_decode"]
    assert {r["xid"] for r in rows} == set(range(144, 151))
    assert all(len(r["intrinfo_v1"]) == 32 and len(r["intrinfo_v2"]) == 32 for r in rows)


def _shipped(name: str) -> dict:
    return json.loads((RULES_DIR / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(("catalog", "name", "kind", "damage"), [
    (XidCatalog, gen.XID_OUT, "XID", lambda d: d.pop("xids")),
    (XidCatalog, gen.XID_OUT, "XID", lambda d: d.pop("nvlink5_decode")),
    (XidCatalog, gen.XID_OUT, "XID", lambda d: d["xids"]["79"].update(action="explode")),
    (XidCatalog, gen.XID_OUT, "XID", lambda d: d["about"].clear()),
    (SxidCatalog, gen.SXID_OUT, "SXid", lambda d: d.pop("sxids")),
    (SxidCatalog, gen.SXID_OUT, "SXid", lambda d: d["sxids"].update(x={"name": "n"})),
], ids=["no-rows", "no-decode-sheet", "bad-action", "no-version", "no-sxid-rows", "bad-code"])
def test_a_damaged_catalog_is_refused_naming_its_file_and_kind(catalog, name, kind, damage):
    data = _shipped(name)
    damage(data)
    with pytest.raises(CatalogError, match=rf"^{name}: not a gpu-monitor {kind} catalog"):
        catalog(data)
    with pytest.raises(CatalogError, match=r"^elsewhere\.json: "):
        catalog(data, source="elsewhere.json")


def test_an_undamaged_copy_reads_like_the_shipped_catalog():
    assert XidCatalog(_shipped(gen.XID_OUT)).get(79) == xid_catalog().get(79)
    assert SxidCatalog(_shipped(gen.SXID_OUT)).codes() == sxid_catalog().codes()
