"""Reading a YAML file within bounds (profiles/yaml_reader.py): size, encoding, nesting and alias
expansion, each refusal naming its field and line; nothing but SchemaError leaves it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.profiles import (
    ProfileError,
    SchemaError,
    load_profile,
)
from gpu_monitor.profiles.yaml_reader import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    read_text,
    read_yaml,
)


def _read_error(tmp_path: Path, body: str | bytes) -> ProfileError:
    path = tmp_path / "p.yaml"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"profile {path}: ")
    return err.value


def test_read_text_refuses_what_is_not_a_small_utf8_file(tmp_path):
    with pytest.raises(SchemaError, match="file not found"):
        read_text(tmp_path / "nope.yaml", "f")
    with pytest.raises(SchemaError, match="is a directory, not a file"):
        read_text(tmp_path, "f")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(SchemaError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        read_text(big, "f")
    ok = tmp_path / "ok.yaml"
    ok.write_bytes(b"#" * MAX_FILE_BYTES)  # exactly at the bound: read
    assert len(read_text(ok, "f")) == MAX_FILE_BYTES


def test_a_profile_that_is_not_utf8_names_the_byte_and_line(tmp_path):
    """The issue's case: this was a UnicodeDecodeError traceback."""
    err = _read_error(tmp_path, "schema: 1\nname: caf\xe9\n".encode("latin-1"))
    assert "not UTF-8 text: invalid continuation byte at byte 19 (line 2)" in str(err)
    assert err.line == 2


def _nest(levels: int) -> str:
    return "a: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"


def test_nesting_up_to_the_bound_parses_and_beyond_it_is_refused():
    """The issue's case: deep nesting was a RecursionError. ``a: [[...]]`` with n - 1
    brackets is n levels (the top mapping is one)."""
    assert read_yaml(_nest(MAX_DEPTH), "f") is not None
    with pytest.raises(SchemaError, match=f"nested deeper than {MAX_DEPTH} levels") as err:
        read_yaml(_nest(MAX_DEPTH + 1), "f")
    assert err.value.field == "a" + "[0]" * (MAX_DEPTH - 1)
    with pytest.raises(SchemaError, match="nested deeper"):
        read_yaml(_nest(20_000), "f")


def _bomb(levels: int, width: int = 10) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_aliases_are_fine_until_they_expand_past_the_bound():
    data = read_yaml(_bomb(4), "f")  # l3 expands to 10^4 values: fine
    assert len(data["l3"]) == 10 and len(data["l3"][0][0]) == 10
    with pytest.raises(SchemaError, match="alias bomb") as err:
        read_yaml(_bomb(9), "f")  # "billion laughs": 10^9 values from 9 lines
    assert err.value.field == "l4"  # the first anchor past MAX_NODES
    assert MAX_NODES < 10**5 * 1.2


def test_an_alias_deeper_than_the_bound_through_a_chain_is_refused():
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n"
                                     for i in range(1, MAX_DEPTH + 2))
    with pytest.raises(SchemaError, match="with aliases expanded"):
        read_yaml(text, "f")


@pytest.mark.parametrize("text", ["a: &a [1, *a]\n", "a: &a {b: *a}\n", "a: &a {<<: *a}\n"],
                         ids=["sequence", "mapping", "merge-key"])
def test_a_recursive_alias_is_refused(text):
    with pytest.raises(SchemaError, match="recursive alias") as err:
        read_yaml(text, "f")
    assert err.value.field == "a"


@pytest.mark.parametrize(("text", "field", "words"), [
    ("gpu:\n  count: !!int eight\n", "gpu.count", "cannot read the value 'eight'"),
    ("when: 2024-13-45\n", "when", "month must be in 1..12"),
    (f"n: {'9' * 5000}\n", "n", "an integer of 5000 digits is out of range"),
    ("rdma:\n  ports: [a, !!float x]\n", "rdma.ports[1]", "cannot read the value 'x'"),
    ("a: 1\nb:\n  c: 1\n  c: 2\n", "b.c", "duplicate key 'c' (first at line 3)"),
], ids=["bad-int-tag", "impossible-date", "huge-int", "in-a-list", "duplicate-key"])
def test_values_yaml_cannot_build_name_their_field_and_line(text, field, words):
    with pytest.raises(SchemaError) as err:
        read_yaml(text, "f")
    assert err.value.field == field
    assert words in str(err.value)
    assert err.value.line is not None


def test_only_a_document_refused_for_its_size_says_refused():
    with pytest.raises(SchemaError, match="YAML refused at line"):
        read_yaml(_bomb(9), "f")
    with pytest.raises(SchemaError, match="malformed YAML at line 2"):
        read_yaml("a: 1\n\tb: 2\n", "f")


_FRAGMENTS = ["a", "b", ": ", ":", " ", "  ", "\n", "- ", "[", "]", "{", "}", ", ", "? ",
              "&x ", "*x", "&y ", "*y", "<<: ", "!!int ", "!!float ", "!!bool ", "!!binary ",
              "!!timestamp ", "!!set ", "!!python/name:os.system ", "!local ", "2019-19-19",
              "2024-02-30", "12:30:61", "0x", "0o9", "1_0", "9" * 5000, ".nan", ".inf", "1e999",
              "yes", "~", "'", '"', "\t", "#", "|", ">", "%YAML 1.1\n", "%TAG ! x\n", "---\n",
              "...\n", "@", "`", "\x00", "\x85", "\ufeff", "\\"]


_YAMLISH = st.lists(st.sampled_from(_FRAGMENTS), max_size=30).map("".join)


@settings(deadline=None, derandomize=True, max_examples=300)
@given(_YAMLISH)
def test_read_yaml_raises_only_schema_errors(text):
    try:
        read_yaml(text, "f")
    except SchemaError:
        pass
