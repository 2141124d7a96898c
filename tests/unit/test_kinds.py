"""Reason kinds are one enum (overlap_hlo.ir.unsupported.Kind): every kind a pass, the
driver, coverage or the report produces is a member, never a free string, and its value
is the text remarks, statistics and summaries print."""
import ast
from pathlib import Path

import pytest

import overlap_hlo
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.rewrite.site import Site, statistics

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*(ROOT / "overlap_hlo").rglob("*.py"), *(ROOT / "passes").glob("*.py")]


def test_no_kind_is_spelled_as_a_string_in_the_code():
    """A `kind=` argument is a Kind member (or a kind passed on), never a literal."""
    literal = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "kind" and isinstance(
                    node.value, (ast.Constant, ast.JoinedStr)):
                literal.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
    assert literal == []


def test_every_member_named_in_the_code_exists():
    named = {node.attr for path in SOURCES for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id == "Kind"}
    assert named and named <= set(Kind.__members__)


def test_a_string_kind_is_refused():
    with pytest.raises(TypeError):
        Unsupported("why", kind="not profitable")
    with pytest.raises(TypeError):
        Site(Where("f.mlir", 1, 1), "overlap-all-gather-matmul", False, kind="not profitable")


def test_members_print_their_text():
    assert len({k.value for k in Kind}) == len(Kind)
    site = Site(Where("f.mlir", 1, 1), "p", False, reason="below 1 MiB",
                kind=Kind.BELOW_THRESHOLD)
    assert f"{site.kind}" == str(site.kind) == "below threshold-mib" == site.counted_as
    assert statistics([site]) == {"p": {"seen": 1, "rewritten": 0,
                                        "skipped: below threshold-mib": 1}}
    plain = Site(Where("f.mlir", 1, 1), "p", False, reason="group size 1: nothing to overlap")
    assert plain.kind is Kind.NONE == "" and plain.counted_as == plain.reason


def test_every_kind_the_passes_produce_is_a_member():
    """Every lit input and example, rewritten three ways: each site's kind is a Kind
    (NONE where it was rewritten, or is counted by its own reason), and several occur."""
    found = set()
    inputs = [*sorted((ROOT / "lit_tests").glob("*.mlir")),
              *sorted((ROOT / "examples").glob("*.mlir"))]
    for path in inputs:
        for chunk in path.read_text().split("// -----"):
            for options in ({"threshold_mib": 0}, {"threshold_mib": 0, "target": "tpu"},
                            {"hardware": "tpu-v5e", "target": "tpu"}):
                try:
                    sites = overlap_hlo.remarks(chunk, **options)
                except Exception:   # noqa: BLE001 - inputs that expect an error
                    continue
                for site in sites:
                    assert type(site.kind) is Kind, site.format()
                    assert site.kind is Kind.NONE or not site.applied, site.format()
                    found.add(site.kind)
    assert {Kind.NOT_PROFITABLE, Kind.TPU_SUMMING_RING, Kind.DIVERGENT} <= found
