"""Valid modules the rewrite once turned into invalid IR, and the safety net under every
site: a rewrite that raises or leaves IR that does not verify is undone, its site left
unchanged and reported as an internal error (never as "rewritten", never blaming the
input), and the other sites of the module are still rewritten.

Hand-written per-device modules run on the host CPU devices before and after.
"""
import dataclasses
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

import overlap_hlo
from harness import MANUAL, Program, check, op_counts, run_spmd_module
from overlap_hlo.passes.all_gather_matmul import OverlapAllGatherMatmul
from overlap_hlo.tools.overlap_opt import main

GATHER = ('"stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = '
          '#stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = '
          'dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : '
          '(tensor<2x16xf32>) -> tensor<8x16xf32>')


def module(args: str, results: str, body: str, functions: str = "") -> str:
    """A per-device program of 4 partitions (`args`: `%x: tensor<...>` entries)."""
    args = ", ".join(f"{arg}{MANUAL}" for arg in args.split(", "))
    results = ", ".join(f"{result}{MANUAL}" for result in results.split(", "))
    return (f"module attributes {{mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : "
            f"i32}} {{\n  func.func @main({args}) -> ({results}) {{\n{body}\n  }}\n"
            f"{functions}}}\n")


def differential(text: str, inputs: list[np.ndarray], rewritten: int = 1, **options):
    """Rewrite `text`, run both on 4 devices (input i: one array per device), compare."""
    mod = overlap_hlo.parse(text)
    sites = overlap_hlo.rewrite_module(mod, threshold_mib=0, **options)
    assert sum(s.applied for s in sites) == rewritten, [s.format() for s in sites]
    want = run_spmd_module(text, 1, 4, inputs)
    got = run_spmd_module(overlap_hlo.serialize(mod), 1, 4, inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=1e-5, atol=1e-5)
    return mod, sites


def per_device(rng, *shape, same=False):
    value = rng.standard_normal((1 if same else 4, *shape)).astype(np.float32)
    return np.repeat(value, 4, axis=0) if same else value


# Dots in different blocks: one in a while body that captures the gathered value,
# one before the loop and one after it (an earlier dot must not join a later ring).
DOTS_IN_BLOCKS = module("%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %v: tensor<16x8xf32>",
                        "tensor<8x8xf32>", f"""
    %0 = {GATHER}
    %1 = stablehlo.dot_general %0, %v, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %l:2 = stablehlo.while(%i = %c0, %acc = %1) : tensor<i32>, tensor<8x8xf32>
     cond {{
      %c3 = stablehlo.constant dense<3> : tensor<i32>
      %p = stablehlo.compare LT, %i, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    }} do {{
      %d = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
      %s = stablehlo.add %acc, %d : tensor<8x8xf32>
      %c1 = stablehlo.constant dense<1> : tensor<i32>
      %n = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %n, %s : tensor<i32>, tensor<8x8xf32>
    }}
    %2 = stablehlo.dot_general %0, %v, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %3 = stablehlo.add %l#1, %2 : tensor<8x8xf32>
    return %3 : tensor<8x8xf32>""")


def test_dots_in_different_blocks():
    rng = np.random.default_rng(5)
    mod, _ = differential(DOTS_IN_BLOCKS, [per_device(rng, 2, 16), per_device(rng, 16, 8, same=True),
                                           per_device(rng, 16, 8, same=True)])
    assert op_counts(mod)["stablehlo.all_gather"] == 0


# A gated epilogue whose private function clamps with scalar constant bounds.
CLAMPED_EPILOGUE = module("%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %v: tensor<16x8xf32>",
                          "tensor<8x8xf32>", f"""
    %0 = {GATHER}
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = stablehlo.dot_general %0, %v, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %3 = func.call @clipped(%1) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %4 = stablehlo.multiply %3, %2 : tensor<8x8xf32>
    return %4 : tensor<8x8xf32>""", """  func.func private @clipped(%a: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %lo = stablehlo.constant dense<-1.0> : tensor<f32>
    %hi = stablehlo.constant dense<1.0> : tensor<f32>
    %0 = stablehlo.clamp %lo, %a, %hi : (tensor<f32>, tensor<8x8xf32>, tensor<f32>) -> tensor<8x8xf32>
    return %0 : tensor<8x8xf32>
  }
""")


def test_epilogue_inlining_a_function_with_scalar_constants():
    rng = np.random.default_rng(6)
    _, sites = differential(CLAMPED_EPILOGUE, [per_device(rng, 2, 16),
                                               per_device(rng, 16, 8, same=True),
                                               per_device(rng, 16, 8, same=True)])
    assert "elementwise epilogue" in sites[0].detail


# A reduce_scatter that sums in a wider type than its operand (XLA runs it).
PROMOTED_SCATTER = module("%x: tensor<8x16xbf16>, %w: tensor<16x8xbf16>", "tensor<2x8xf32>", """
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xbf16>
    %1 = "stablehlo.reduce_scatter"(%0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<8x8xbf16>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>""")


def test_reduce_scatter_summing_in_a_wider_type():
    """The ring sums in f32, as the region says; XLA:CPU runs the original in bf16 (its
    output buffer is bf16), so the reference is numpy's f32 sum of the bf16 products,
    to bf16 rounding (XLA may fold the ring's convert into its dot and not round)."""
    rng = np.random.default_rng(7)
    x = per_device(rng, 8, 16).astype(jnp.bfloat16)
    w = per_device(rng, 16, 8, same=True).astype(jnp.bfloat16)
    mod = overlap_hlo.parse(PROMOTED_SCATTER)
    (site,) = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    assert site.applied, site.format()
    got = run_spmd_module(overlap_hlo.serialize(mod), 1, 4, [x, w])[0]
    assert got.dtype == np.float32
    products = [(x[d].astype(np.float32) @ w[d].astype(np.float32)).astype(jnp.bfloat16)
                for d in range(4)]
    total = np.sum([p.astype(np.float32) for p in products], axis=0)
    bf16 = 2 ** -7 * np.abs(total).max()
    np.testing.assert_allclose(got, total.reshape(4, 2, 8), rtol=0, atol=bf16)
    xla = run_spmd_module(PROMOTED_SCATTER, 1, 4, [x, w])[0].astype(np.float32)
    np.testing.assert_allclose(got, xla, rtol=0, atol=2 * bf16)


LEGACY_DOTS = module("%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %y: tensor<8x16xf32>",
                     "tensor<8x8xf32>, tensor<2x8xf32>", f"""
    %0 = {GATHER}
    %1 = "stablehlo.dot"(%0, %w) : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = "stablehlo.dot"(%y, %w) : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %3 = "stablehlo.reduce_scatter"(%2) <{{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %4 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %4 : tensor<f32>
    }}) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %1, %3 : tensor<8x8xf32>, tensor<2x8xf32>""")


def test_legacy_dot_op():
    rng = np.random.default_rng(8)
    mod, _ = differential(LEGACY_DOTS, [per_device(rng, 2, 16), per_device(rng, 16, 8, same=True),
                                        per_device(rng, 8, 16)], rewritten=2)
    counts = op_counts(mod)
    assert counts["stablehlo.all_gather"] == counts["stablehlo.reduce_scatter"] == 0


def biased_sum_read_twice(x, w, b):
    y = x @ w + b
    return jax.lax.psum_scatter(y, "i", scatter_dimension=0, tiled=True), jnp.sum(y)


@pytest.mark.parametrize("shardy", [True, False])
def test_biased_sum_read_after_the_scatter_is_assembled_by_the_ring(shardy):
    """The sum of the dot and the bias is read again after the scatter: the ring writes
    each block of this device's sum as it computes it, and that buffer replaces it."""
    prog = Program(biased_sum_read_twice, (8,), ("i",),
                   [((64, 16), P()), ((16, 32), P()), ((64, 32), P())], (P("i"), P()))
    counts = check(prog, shardy=shardy, rewritten=1)
    assert counts["stablehlo.dynamic_update_slice"] >= 8   # every block of the sum


def biased_sum_read_before(x, w, b):
    y = x @ w + b
    z = jnp.sin(y)
    return jax.lax.psum_scatter(y, "i", scatter_dimension=0, tiled=True), z


def test_biased_sum_read_before_the_scatter_is_left_unchanged():
    prog = Program(biased_sum_read_before, (8,), ("i",),
                   [((64, 16), P()), ((16, 32), P()), ((64, 32), P())], (P("i"), P()))
    with pytest.warns(overlap_hlo.SitesLeftUnchanged, match="1 sum read elsewhere"):
        check(prog, rewritten=0, left=Counter({"stablehlo.reduce_scatter": 1}))


def biased_psum_read_twice(x, w, b):
    y = x @ w + b
    return jax.lax.psum(y, "i"), y * 3


def test_biased_psum_read_again_is_assembled_by_the_ring():
    """The all_reduce pass builds the same ring (then its all_gather): the sum it
    assembles replaces the one the multiply reads."""
    prog = Program(biased_psum_read_twice, (8,), ("i",),
                   [((64, 16), P(None, "i")), ((16, 32), P("i")), ((32,), P())],
                   (P(), P(None, "i")))
    check(prog, rewritten=1, left=Counter({"stablehlo.all_gather": 1}))


def gathered_product_scattered_and_read(x, w):
    y = jax.lax.all_gather(x, "i", axis=1, tiled=True) @ w
    return jax.lax.psum_scatter(y, "i", scatter_dimension=0, tiled=True), jnp.sum(y)


def test_gather_dot_scatter_whose_product_is_read_after_the_scatter():
    """Both collectives decomposed; the scatter ring assembles the product."""
    check(Program(gathered_product_scattered_and_read, (8,), ("i",),
                  [((64, 32), P(None, "i")), ((32, 16), P())], (P("i"), P())), rewritten=2)


# One gather site and one scatter site: breaking the first must not cost the second.
TWO_SITES = LEGACY_DOTS.replace('"stablehlo.dot"', "stablehlo.dot_general").replace(
    "(%0, %w)", "%0, %w, contracting_dims = [1] x [0]").replace(
    "(%y, %w)", "%y, %w, contracting_dims = [1] x [0]")


def broken_rewrite(how: str):
    """The gather pass's emitter, broken: it raises after building its ring, or leaves
    an op that does not verify (an add of two shapes) in front of the all_gather."""
    real = OverlapAllGatherMatmul.emit

    def emit(self, match, plan, ring, rewriter, scan):
        gather = match.build.gather
        if how == "invalid IR":
            shard = gather.operands[0]
            with ir.InsertionPoint(gather):
                other = stablehlo.constant(ir.DenseElementsAttr.get(np.zeros(3, np.float32)))
                bad = ir.Operation.create("stablehlo.add", results=[shard.type],
                                          operands=[shard, other])
            gather.operands[0] = bad.result
            # the ring reads it, so nothing erases it
            match = dataclasses.replace(match, build=dataclasses.replace(match.build,
                                                                         shard=bad.result))
        real(self, match, plan, ring, rewriter, scan)
        if how == "raises":
            raise RuntimeError("a bug in the middle of a rewrite")

    return emit


@pytest.mark.parametrize("how", ["raises", "invalid IR"])
def test_a_failed_site_is_undone_and_reported(monkeypatch, how):
    monkeypatch.setattr(OverlapAllGatherMatmul, "emit", broken_rewrite(how))
    mod = overlap_hlo.parse(TWO_SITES)
    with pytest.warns(overlap_hlo.SitesLeftUnchanged, match="1 internal error"):
        sites = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    gather, scatter = sites
    assert not gather.applied and gather.kind == "internal error"
    assert "valid input" in gather.reason and "please report" in gather.reason
    assert scatter.applied
    counts = op_counts(mod)
    assert counts["stablehlo.all_gather"] == 1 and counts["stablehlo.reduce_scatter"] == 0
    rng = np.random.default_rng(9)
    inputs = [per_device(rng, 2, 16), per_device(rng, 16, 8, same=True), per_device(rng, 8, 16)]
    for got, want in zip(run_spmd_module(overlap_hlo.serialize(mod), 1, 4, inputs),
                         run_spmd_module(TWO_SITES, 1, 4, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_failed_site_on_the_command_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(OverlapAllGatherMatmul, "emit", broken_rewrite("invalid IR"))
    source = tmp_path / "two.mlir"
    source.write_text(TWO_SITES)
    out = tmp_path / "out.mlir"
    assert main([str(source), "--threshold-mib=0", "--remarks", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "left unchanged: internal error" in err and ": rewritten" in err
    assert "overlap-all-gather-matmul: rewritten" not in err
    assert ": error:" not in err   # no diagnostic blames the input
    assert op_counts(overlap_hlo.parse(out.read_text()))["stablehlo.all_gather"] == 1


def test_verification_deferred_to_the_end_of_the_pipeline(monkeypatch):
    """A run that verifies its result leaves the passes' own verification out (one
    check at the end); a run that does not verify keeps it, pass by pass."""
    from overlap_hlo.rewrite import module_pass
    real, calls = module_pass.verification_error, []

    def counted(op):
        calls.append(op)
        return real(op)

    monkeypatch.setattr(module_pass, "verification_error", counted)
    mod = overlap_hlo.parse(TWO_SITES)
    sites = overlap_hlo.rewrite_module(mod, threshold_mib=0)
    assert all(site.applied for site in sites) and calls == []
    mod.operation.verify()
    sites = overlap_hlo.rewrite_module(overlap_hlo.parse(TWO_SITES), threshold_mib=0,
                                       verify=False)
    assert all(site.applied for site in sites) and len(calls) == 2   # each ring pass


def normalize_calls(monkeypatch) -> list:
    from overlap_hlo.rewrite import site
    real, calls = site.normalize, []

    def counted(op):
        calls.append(op)
        return real(op)

    monkeypatch.setattr(site, "normalize", counted)
    return calls


@pytest.mark.parametrize("pipeline, undeclared, threshold, expected", [
    (None, None, 1e6, 1),   # nothing rewritten: only before the passes
    (None, None, 0, 1),     # the gather pass's rings keep the normal form: not again
    ("builtin.module(overlap-matmul-reduce-scatter,overlap-all-gather-matmul)",
     "overlap-matmul-reduce-scatter", 0, 2),   # again after a pass not declaring so
    ("builtin.module(overlap-all-gather-matmul,canonicalize,overlap-matmul-reduce-scatter)",
     None, 1e6, 2),         # again after a pass not of ours
])
def test_the_module_is_normalized_again_only_after_it_changed(monkeypatch, pipeline,
                                                              undeclared, threshold,
                                                              expected):
    calls = normalize_calls(monkeypatch)
    if undeclared is not None:   # a pass that rewrites and does not keep the normal form
        monkeypatch.setattr(overlap_hlo.registered_passes()[undeclared],
                            "keeps_normal_form", False)
    options = {} if pipeline is None else {"pipeline": pipeline}
    mod = overlap_hlo.parse(LEGACY_DOTS)
    sites = overlap_hlo.rewrite_module(mod, threshold_mib=threshold, **options)
    assert [site.applied for site in sites] == [threshold == 0] * 2
    assert len(calls) == expected
    assert "stablehlo.dot " not in str(mod) and '"stablehlo.dot"' not in str(mod)


TWICE = "builtin.module(overlap-all-gather-matmul,overlap-all-gather-matmul)"
# One all_gather feeds a dot, the other only the result.
GATHER_LEFT = module("%x: tensor<2x16xf32>, %w: tensor<16x8xf32>",
                     "tensor<8x8xf32>, tensor<8x16xf32>", f"""
    %0 = {GATHER}
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = {GATHER.replace("handle = 1", "handle = 2")}
    return %1, %2 : tensor<8x8xf32>, tensor<8x16xf32>""")


@pytest.mark.parametrize("pipeline, threshold, expected", [
    (None, 1e6, 2),   # the sequence-parallel pass's walk serves the gather pass too
    (None, 0, 2),     # ... which rewrites: the scatter pass (another root) walks again
    (TWICE, 1e6, 1),  # nothing rewritten: one walk
    (TWICE, 0, 2),    # the second run walks the rewritten module (its other gather)
    ("builtin.module(overlap-all-gather-matmul,canonicalize,overlap-all-gather-matmul)",
     1e6, 2),         # a pass not of ours may have changed anything
])
def test_the_module_is_walked_again_only_after_it_changed(monkeypatch, pipeline, threshold,
                                                          expected):
    """A pass run that left the module unchanged hands its walk (ModuleScan) to the next
    pass with the same root; any change, ours or not, makes the next pass walk again."""
    from overlap_hlo.rewrite import module_pass
    walks = []

    class Counted(module_pass.ModuleScan):
        def __init__(self, *args, **kwargs):
            walks.append(args[1])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(module_pass, "ModuleScan", Counted)
    options = {} if pipeline is None else {"pipeline": pipeline}
    mod = overlap_hlo.parse(LEGACY_DOTS if pipeline is None else GATHER_LEFT)
    sites = overlap_hlo.rewrite_module(mod, threshold_mib=threshold, **options)
    assert sites[0].applied == (threshold == 0)
    assert len(walks) == expected
    mod.operation.verify()
    if threshold == 0 and pipeline == TWICE:   # the walk found the gather left
        assert op_counts(mod)["stablehlo.all_gather"] == 1



def test_the_log_a_pipeline_returns_holds_no_walk():
    """The ModuleScan handed between passes holds op handles, which would keep the
    module alive as long as the log: the pipeline drops it before returning."""
    from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE, run_pipeline
    from overlap_hlo.rewrite.site import SiteLog
    mod = overlap_hlo.parse(GATHER_LEFT)
    with mod.context:
        log = run_pipeline(mod.operation, DEFAULT_PIPELINE, lambda deferred: SiteLog(
            deferred=deferred), {"threshold_mib": 1e6})
    assert log.sites and log.scan is None
