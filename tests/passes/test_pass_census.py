"""Each pass declares the collectives and buffers its rewrites create (`ModulePass.created`):
a later pass whose root (or `requires`) is none of the module's tracked ops is skipped
without a walk (`SiteLog.may_hold`), so an undeclared creation would leave sites unseen. A pass that
declares `keeps_normal_form` leaves a normalized module as `normalize` would: the
passes after it do not normalize again."""
import glob
import os

import pytest

import overlap_hlo
from overlap_hlo.ir.normalize import normalize
from overlap_hlo.ir.ops import TRACKED, names_in
from overlap_hlo.rewrite import module_pass, site
from overlap_hlo.rewrite.pipeline import registered_passes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUTS = sorted(glob.glob(os.path.join(ROOT, "lit_tests", "*.mlir"))
                + glob.glob(os.path.join(ROOT, "examples", "*.mlir")))
OPTIONS = [{"threshold_mib": 0}, {"threshold_mib": 0, "bidirectional": True, "target": "tpu",
                                  "tpu_summing_rings": True}]


def chunks(path: str) -> list[str]:
    with open(path) as f:
        return [c for c in f.read().split("// -----") if "func.func" in c]


def parsed(text: str):
    try:
        return overlap_hlo.parse(text)
    except Exception:   # the inputs of the diagnostics tests
        return None


def counted_contains(monkeypatch) -> list:
    """The root names passes look for in the module (`contains` calls)."""
    asked = []
    real = module_pass.contains

    def counted(op, names):
        asked.append(names)
        return real(op, names)

    monkeypatch.setattr(module_pass, "contains", counted)
    return asked


@pytest.mark.parametrize("path", INPUTS, ids=os.path.basename)
def test_a_pass_creates_only_the_tracked_ops_it_declares(path):
    passes = registered_passes()
    checked = 0
    for text in chunks(path):
        for name, cls in passes.items():
            for options in OPTIONS:
                mod = parsed(text)
                if mod is None:
                    continue
                before = names_in(mod.operation, TRACKED)
                overlap_hlo.rewrite_module(mod, f"builtin.module({name})", **options)
                new = names_in(mod.operation, TRACKED) - before
                assert new <= cls.from_options({}, options).created(), (name, new)
                checked += 1
    assert checked or not chunks(path)


def test_a_pass_that_keeps_the_normal_form_leaves_nothing_to_normalize():
    """Over every lit input and example: after the pass, `normalize` changes nothing."""
    passes = [name for name, cls in registered_passes().items() if cls.keeps_normal_form]
    assert passes   # the gather and scatter passes declare it
    rewritten = 0
    for path in INPUTS:
        for text in chunks(path):
            for name in passes:
                for options in OPTIONS:
                    mod = parsed(text)
                    if mod is None:
                        continue
                    sites = overlap_hlo.rewrite_module(mod, f"builtin.module({name})",
                                                       **options)
                    rewritten += sum(site.applied for site in sites)
                    after = overlap_hlo.serialize(mod)
                    normalize(mod.operation)
                    assert overlap_hlo.serialize(mod) == after, (path, name, options)
    assert rewritten > 100   # the rings are there to look at


def test_a_pass_with_no_root_in_the_module_is_skipped_without_a_walk(monkeypatch):
    """The module holds all_gather and reduce_scatter sites: the all_reduce and
    all_to_all passes are decided by the one look at the module's collectives."""
    asked = counted_contains(monkeypatch)
    with open(os.path.join(ROOT, "examples", "tp_mlp.mlir")) as f:
        mod = overlap_hlo.parse(f.read())
    sites = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    assert sites and all(site.applied for site in sites)
    assert "stablehlo.all_reduce" not in asked and "stablehlo.all_to_all" not in asked
    assert "stablehlo.all_gather" in asked and "stablehlo.reduce_scatter" in asked


def test_a_collective_a_pass_creates_is_seen_by_the_passes_after_it(monkeypatch):
    """The all_reduce pass creates an all_gather (its ring's second half) in modules
    that held none: the gather pass after it still looks for its root."""
    asked = counted_contains(monkeypatch)
    checked = 0
    for text in chunks(os.path.join(ROOT, "lit_tests", "overlap-matmul-all-reduce.mlir")):
        mod = parsed(text)
        if mod is None or "stablehlo.all_gather" in str(mod):
            continue
        asked.clear()
        sites = overlap_hlo.rewrite_module(mod, threshold_mib=0)
        if any(site.applied for site in sites) and "stablehlo.all_gather" in str(mod):
            assert "stablehlo.all_gather" in asked
            checked += 1
    assert checked


def test_the_stack_pass_is_skipped_without_a_walk_when_no_ring_allocates(monkeypatch):
    """Rings built for the CPU start from zeros, not uninitialised buffers: after them
    (and canonicalize and cse, which create none) the stack pass does not look for its
    root; rings built for TPU allocate, and it does."""
    asked = counted_contains(monkeypatch)
    with open(os.path.join(ROOT, "examples", "tp_mlp.mlir")) as f:
        text = f.read()
    for target, looked in (("cpu", False), ("tpu", True)):
        asked.clear()
        sites = overlap_hlo.rewrite_module(overlap_hlo.parse(text), threshold_mib=0,
                                           target=target)
        assert sites and all(site.applied for site in sites)
        assert ("stablehlo.dynamic_update_slice" in asked) is looked, target


def test_a_pass_not_of_ours_may_have_created_anything(monkeypatch):
    """After a pass that is not a simplifier the module's tracked ops are looked at
    again; after canonicalize or cse what was known still holds."""
    walks = []
    real = site.names_in
    monkeypatch.setattr(site, "names_in", lambda op, names: walks.append(1) or real(op, names))
    with open(os.path.join(ROOT, "examples", "tp_mlp.mlir")) as f:
        text = f.read()
    for between, looks in (("symbol-dce", 2), ("cse", 1), ("canonicalize", 1)):
        walks.clear()
        overlap_hlo.rewrite_module(overlap_hlo.parse(text), (
            "builtin.module(overlap-all-gather-matmul{target=tpu threshold-mib=0},"
            f"{between},overlap-stack-in-place)"))
        assert len(walks) == looks, between
