"""all_to_all -> dot: N-1 permutes interleaved with per-chunk dots, run before and after
the rewrite on 8 host CPU devices; sites it cannot take are left unchanged with a
remark."""
from collections import Counter

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check, op_counts, permutes

A2A = jax.lax.all_to_all
GONE = Counter({"stablehlo.all_to_all": 0})
EXPORT_FORMS = [pytest.param(True, id="shardy"), pytest.param(False, id="gspmd")]

CASES = {
    # MoE dispatch: experts split across devices, tokens (capacity) gathered, then the
    # expert matmul (experts a batch dim, capacity the chunk's free dim)
    "moe-dispatch": (lambda x, w: jnp.einsum("ecm,emh->ech", A2A(x, "x", 0, 1, tiled=True), w),
                     [((16, 4, 32), P()), ((16, 32, 24), P("x"))], P("x"), (8,), ("x",)),
    # Ulysses: heads split, sequence gathered, then a per-head projection
    "ulysses": (lambda q, w: jnp.einsum("shd,hde->she", A2A(q, "x", 1, 0, tiled=True), w),
                [((64, 16, 8), P("x")), ((16, 8, 12), P("x"))], P(None, "x"), (8,), ("x",)),
    # split and concat on the same dim, the exchanged tensor as the dot's rhs
    "same-dim-rhs": (lambda w, x: w @ A2A(x, "x", 1, 1, tiled=True),
                     [((24, 32), P()), ((32, 64), P())], P(None, "x"), (8,), ("x",)),
    # a subgroup: 4 of the 8 devices exchange
    # MoE combine: the expert matmul's output sent back (capacity split, experts concat)
    "moe-combine": (lambda h, w: A2A(jnp.einsum("ech,ehm->ecm", h, w), "x", 1, 0, tiled=True),
                    [((16, 32, 24), P("x")), ((16, 24, 32), P("x"))], P(None, "x"),
                    (8,), ("x",)),
    # the split dim from a batch dim of the dot (both operands sliced)
    "combine-batch-split": (lambda h, w: A2A(jnp.einsum("ech,ehm->ecm", h, w), "x", 0, 1,
                                             tiled=True),
                            [((64, 4, 24), P()), ((64, 24, 16), P())], P(None, "x"),
                            (8,), ("x",)),
    "subgroup": (lambda x, w: jnp.einsum("ecm,emh->ech", A2A(x, "x", 0, 1, tiled=True), w),
                 [((8, 4, 16), P()), ((8, 16, 12), P("x"))], P("x"),
                 (4, 2), ("x", "y")),
}


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_all_to_all_then_dot(case, shardy):
    fn, inputs, out_specs, mesh, axes = CASES[case]
    counts = check(Program(fn, mesh, axes, inputs, out_specs), shardy=shardy, left=GONE)
    size = mesh[0]
    assert counts["stablehlo.collective_permute"] == size - 1    # one per step but the own
    assert counts["stablehlo.dot_general"] == size


def _site(fn, inputs, out_specs):
    program = Program(fn, (8,), ("x",), inputs, out_specs)
    module = overlap_hlo.parse(program.jitted().lower(*program.args()).as_text())
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0)
    (site,) = [s for s in sites if s.pattern == "overlap-all-to-all-matmul"]
    return site, module


def test_a_dot_reached_through_a_view_is_left_unchanged_with_a_remark():
    site, module = _site(lambda x, w: A2A(x, "x", 0, 1, tiled=True).T @ w,
                         [((64, 4), P()), ((8, 24), P())], P())
    assert not site.applied and site.kind == "view before the dot"
    assert op_counts(module)["stablehlo.all_to_all"] == 1 and not permutes(module)


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
def test_a_product_exchanged_through_a_transpose(shardy):
    """Ulysses' attention output: the dot's result transposed, then exchanged."""
    program = Program(lambda h, w: A2A(jnp.einsum("hqd,de->qhe", h, w), "x", 0, 1,
                                       tiled=True),
                      (8,), ("x",), [((4, 64, 16), P()), ((16, 12), P())], P(None, "x"))
    counts = check(program, shardy=shardy, left=GONE)
    assert counts["stablehlo.collective_permute"] == 7
    assert counts["stablehlo.transpose"] >= 8     # replayed on each chunk's product


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
def test_a_combine_whose_exchange_feeds_a_contracting_dot(shardy):
    """MoE combine: the expert matmul's output exchanged, then contracted over the
    experts by the combine einsum. The reading dot cannot take it (the concat dim is
    contracting), so the exchange is split on the producing dot's side."""
    def combine(h, w, mask):
        return jnp.einsum("ecd,tec->td", A2A(jnp.einsum("ech,ehd->ecd", h, w), "x", 1, 0,
                                             tiled=True), mask)
    program = Program(combine, (8,), ("x",), [((16, 32, 24), P("x")), ((16, 24, 16), P("x")),
                                              ((8, 16, 4), P())], P())
    counts = check(program, shardy=shardy, left=GONE)
    assert counts["stablehlo.collective_permute"] == 7


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
def test_a_contracting_concat_dim_sums_the_chunk_products(shardy):
    """Ulysses' values: the exchanged tensor contracted over its concat dim. Each chunk
    multiplies its block of the other operand; the products are summed."""
    program = Program(lambda x, w: A2A(x, "x", 0, 1, tiled=True) @ w, (8,), ("x",),
                      [((64, 4), P()), ((32, 24), P())], P())
    counts = check(program, shardy=shardy, left=GONE)
    assert counts["stablehlo.collective_permute"] == 7
    assert counts["stablehlo.dot_general"] == 8 and counts["stablehlo.add"] >= 7


def test_a_summing_exchange_on_tpu_needs_tpu_summing_rings():
    fn, inputs = (lambda x, w: A2A(x, "x", 0, 1, tiled=True) @ w), [((64, 4), P()),
                                                                    ((32, 24), P())]
    program = Program(fn, (8,), ("x",), inputs, P())
    text = program.jitted().lower(*program.args()).as_text()
    (site,) = overlap_hlo.remarks(text, threshold_mib=0, target="tpu")
    assert not site.applied and site.kind == "summing ring on TPU"
    (site,) = overlap_hlo.remarks(text, threshold_mib=0, target="tpu", tpu_summing_rings=True)
    assert site.applied and "the products summed" in site.detail


def test_attention_scores_are_left_unchanged_with_a_remark():
    """Ulysses' queries exchanged, then the score dot: its result [heads, q, k] would be
    written in strided blocks along q, 16x the exchanged tensor: one copy per step."""
    site, module = _site(lambda q, k: jnp.einsum("qhd,khd->hqk", A2A(q, "x", 1, 0, tiled=True),
                                                 k),
                         [((64, 16, 4), P("x")), ((64, 2, 4), P())], P(None, None, None))
    assert not site.applied and site.kind == "strided blocks"
    assert "16x the exchanged tensor" in site.reason
    assert op_counts(module)["stablehlo.all_to_all"] == 1


def test_a_batch_concat_dim_is_left_unchanged_with_a_remark():
    site, module = _site(lambda x, w: jnp.einsum("ecm,emh->ech", A2A(x, "x", 1, 0, tiled=True),
                                                 w),
                         [((2, 16, 4), P()), ((16, 4, 3), P())], P())
    assert not site.applied and site.kind == "concat dim not free"
    assert op_counts(module)["stablehlo.all_to_all"] == 1


