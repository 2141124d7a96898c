"""Sites that involve more than one collective or more than a dot.

- a dot that reads an all_gather and feeds a reduce_scatter (FSDP x TP): both rings;
- a bias added between the dot and the reduce_scatter: folded into the ring;
- chained all_gathers: one ring over the combined groups;
- one dot feeding two reduce_scatters: one ring, and a remark saying why not two.

Each runs before and after the rewrite on 8 host CPU devices (harness.check), in every
option setting where it matters.
"""
from collections import Counter
from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check, op_counts, partitioner, permute_count, ring_pipeline
from overlap_hlo.passes import all_gather_matmul
from overlap_hlo.passes.all_gather_matmul import OverlapAllGatherMatmul

AG = jax.lax.all_gather
RS = jax.lax.psum_scatter
OPTIONS = [(False, 1), (True, 1), (False, 2), (True, 3)]
OPTION_IDS = ["default", "bidi", "unroll2", "bidi-unroll3"]


def pipeline(bidirectional: bool, unroll: int) -> str:
    return ring_pipeline(bidirectional, unroll)


def sites_of(prog: Program, **options):
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    return overlap_hlo.remarks(text, threshold_mib=0, **options)


# FSDP x TP from JAX's shard_map docs: the weight gathered over "batch" along its
# contracting dim, the product scattered over "feats" along the weight's free dim.
def fsdp_tp_layer(x, w):
    return RS(x @ AG(w, "batch", axis=0, tiled=True), "feats", scatter_dimension=1,
              tiled=True)


FSDP_TP = dict(mesh_shape=(4, 2), axes=("batch", "feats"),
               inputs=[((32, 64), P("batch", "feats")), ((64, 16), P(("feats", "batch")))])


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_gather_dot_scatter_gets_both_rings(options):
    prog = Program(fsdp_tp_layer, out_specs=P("batch", "feats"), **FSDP_TP)
    check(prog, rewritten=2, pipeline=pipeline(*options))


def test_gather_dot_scatter_remarks():
    prog = Program(fsdp_tp_layer, out_specs=P("batch", "feats"), **FSDP_TP)
    gather, scatter = sites_of(prog)
    assert gather.pattern == "overlap-all-gather-matmul" and gather.applied
    assert "its dot is decomposed inside the reduce_scatter ring at" in gather.detail
    assert "through stablehlo.dynamic_slice" in gather.detail
    assert scatter.pattern == "overlap-matmul-reduce-scatter" and scatter.applied
    assert "the dot reads an all_gather whose ring runs inside" in scatter.detail



def test_a_composite_site_is_matched_once(monkeypatch):
    """The driver settles the scatter first (`settles_first`), then matches the gather
    once, with the scatter's outcome."""
    from overlap_hlo.passes import OverlapAllGatherMatmul

    calls, real = [], OverlapAllGatherMatmul.match

    def counted(self, op, scan, settled=None):
        calls.append(settled)
        return real(self, op, scan, settled)

    monkeypatch.setattr(OverlapAllGatherMatmul, "match", counted)
    prog = Program(fsdp_tp_layer, out_specs=P("batch", "feats"), **FSDP_TP)
    sites = sites_of(prog)
    assert [s.applied for s in sites] == [True, True]
    assert len(calls) == 1 and [o.built for o in calls[0]] == [True]

@partial(jax.remat, policy=lambda op, *_, **__: str(op) != "all_gather")
def predict_fsdp_tp(params, inputs):
    for w_frag, b_frag in params:
        w = AG(w_frag, "batch", tiled=True)
        b = AG(b_frag, "batch", tiled=True)
        outputs = RS(inputs @ w, "feats", scatter_dimension=1, tiled=True) + b
        inputs = jax.nn.relu(outputs)
    return outputs


def loss_fsdp_tp(w1, b1, w2, b2, inputs, targets):
    predictions = predict_fsdp_tp([(w1, b1), (w2, b2)], inputs)
    err = jax.lax.psum(jnp.sum((predictions - targets) ** 2, axis=-1), "feats")
    return jax.lax.pmean(jnp.mean(err), "batch")


D, B = 32, 16
PW, PD = P(("feats", "batch")), P("batch", "feats")
DOCS_INPUTS = [((D, D), PW), ((D,), PW), ((D, D), PW), ((D,), PW), ((B, D), PD), ((B, D), PD)]


def matmul_collectives(module) -> Counter:
    """all_gathers and reduce_scatters left that touch a matrix (not the bias vectors,
    which no dot reads: they are not sites)."""
    from jaxlib.mlir import ir

    left = Counter()

    def visit(op):
        if op.name in ("stablehlo.all_gather", "stablehlo.reduce_scatter") \
                and op.operands[0].type.rank > 1:
            left[op.name] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return left


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("per_row", [False, True], ids=["per-column", "per-row"])
def test_broadcast_bias_is_broadcast_per_block(options, per_row):
    """A bias vector broadcast over the rows (flax Dense), or one value per row (its
    vector spans the scattered dim): each block broadcasts its part of the vector."""
    def fn(x, w, b):
        return RS(x @ w + (b[:, None] if per_row else b[None, :]), "x", scatter_dimension=0,
                  tiled=True)

    inputs = [((64, 16), P(None, "x")), ((16, 8), P("x")), ((64 if per_row else 8,), P())]
    check(Program(fn, (8,), ("x",), inputs, P("x")), pipeline=pipeline(*options))


@pytest.mark.parametrize("options", OPTIONS[:2], ids=OPTION_IDS[:2])
@pytest.mark.parametrize("grad", [False, True], ids=["loss", "grad"])
def test_docs_fsdp_tp_model_is_fully_decomposed(grad, options):
    fn = jax.grad(loss_fsdp_tp, argnums=(0, 1, 2, 3)) if grad else loss_fsdp_tp
    outs = (PW, PW, PW, PW) if grad else P()
    prog = Program(fn, (4, 2), ("batch", "feats"), DOCS_INPUTS, outs)
    sites = sites_of(prog, bidirectional=options[0], unroll=options[1])
    assert sites and all(s.applied for s in sites), [s.format() for s in sites]
    with partitioner(True):
        module = overlap_hlo.parse(prog.jitted().lower(*prog.args()).as_text())
    overlap_hlo.rewrite_module(module, pipeline(*options), threshold_mib=0)
    assert matmul_collectives(module) == Counter()
    # Left: the bias vectors' gathers (and, in the gradient, their scatters): no dot.
    check(prog, rewritten=len(sites), pipeline=pipeline(*options),
          left=Counter({"stablehlo.all_gather": 2, "stablehlo.reduce_scatter": 2 * grad}))


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_same_axis_gather_and_scatter_of_the_other_operand(options):
    """Gathered rows, scattered columns (of the other operand), one axis."""
    def fn(x, w):
        return RS(AG(x, "x", axis=0, tiled=True) @ w, "x", scatter_dimension=1, tiled=True)

    prog = Program(fn, (4, 2), ("x", "y"), [((64, 32), P("x")), ((32, 64), P())],
                   P(None, "x"))
    check(prog, rewritten=2, pipeline=pipeline(*options))


def test_scatter_dim_that_is_the_gathered_dim_keeps_the_scatter():
    def fn(x, w):
        return RS(AG(x, "x", axis=0, tiled=True) @ w, "x", scatter_dimension=0, tiled=True)

    prog = Program(fn, (4, 2), ("x", "y"), [((64, 32), P("x")), ((32, 16), P())], P("x"))
    check(prog, rewritten=1, left=Counter({"stablehlo.reduce_scatter": 1,
                                           "stablehlo.all_gather": 0}))
    gather, scatter = sites_of(prog)
    assert gather.applied and not scatter.applied
    assert scatter.kind == "scatter dim is the gathered dim"


# A bias added between the dot and the reduce_scatter (a row-parallel Dense with bias):
# the scatter sums (dot + bias) over the devices; the ring adds each device's own
# block of its bias once, so the result is exactly the same sum.
def bias_layer(x, w, bias):
    return RS(x @ w + bias, "x", scatter_dimension=0, tiled=True)


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_bias_is_folded_into_the_ring(options, dtype):
    # each device adds its own bias block: 512 rows over 8 devices
    inputs = [((64, 16), P(None, "x")), ((16, 8), P("x")), ((512, 8), P("x"))]
    prog = Program(lambda x, w, b: bias_layer(x, w, b), (8,), ("x",), inputs, P("x"),
                   dtype=dtype)
    check(prog, pipeline=pipeline(*options))


def test_broadcast_bias_and_remark():
    def fn(x, w, b):   # flax Dense: a bias vector broadcast over the rows
        return RS(x @ w + b[None, :], "x", scatter_dimension=0, tiled=True)

    inputs = [((64, 16), P(None, "x")), ((16, 8), P("x")), ((8,), P())]
    prog = Program(fn, (8,), ("x",), inputs, P("x"))
    check(prog)
    (site,) = sites_of(prog)
    assert "1 added term(s) (a bias) folded in" in site.detail


@pytest.mark.parametrize("options", OPTIONS[:2], ids=OPTION_IDS[:2])
@pytest.mark.parametrize("axes", [("a", "b"), ("b", "a")])
def test_chained_gathers_make_one_ring(axes, options):
    def fn(x, w):
        return AG(AG(x, "a", axis=0, tiled=True), "b", axis=0, tiled=True) @ w

    prog = Program(fn, (2, 4), axes, [((64, 16), P(("b", "a"))), ((16, 8), P())], P())
    counts = check(prog, pipeline=pipeline(*options))
    opts = OverlapAllGatherMatmul(bidirectional=options[0], unroll=options[1])
    assert counts["stablehlo.collective_permute"] == permute_count(all_gather_matmul, 8, opts)
    (site,) = sites_of(prog)
    assert "groups of 8 (an all_gather of the all_gather at" in site.detail


# JAX's test_matmul_reduce_scatter: one product scattered over "y" and over ("z", "y").
def two_scatters(a, b):
    c = a @ b
    return (RS(c, "y", scatter_dimension=0, tiled=True),
            RS(c, ("z", "y"), scatter_dimension=0, tiled=True))


def test_one_dot_feeding_two_scatters():
    prog = Program(two_scatters, (2, 4), ("z", "y"),
                   [((16, 16), P("z", "y")), ((16, 8), P("y", None))],
                   (P(("z", "y")), P(("z", "y"))))
    counts = check(prog, rewritten=1, left=Counter({"stablehlo.reduce_scatter": 1}))
    assert counts["stablehlo.dot_general"] >= 1
    first, second = sites_of(prog)
    assert first.applied and "assembles the dot's product for 1 other reader(s)" in first.detail
    assert not second.applied and second.kind == "dot shared with another reduce_scatter"
    assert "a ring of its own would compute the dot a second time" in second.reason


def test_gathered_then_dynamically_sliced():
    """A dynamic_slice that keeps the gathered dim whole is a view: replayed per block."""
    def fn(x, w, i):
        g = jax.lax.dynamic_slice_in_dim(AG(x, "x", axis=0, tiled=True), i[0], 16, axis=1)
        return g @ w

    inputs = [((64, 32), P("x")), ((16, 8), P()), ((1,), P(), jnp.int32)]
    prog = Program(fn, (8,), ("x",), inputs, P())
    check(prog)
    (site,) = sites_of(prog)
    assert "free dim through stablehlo.dynamic_slice" in site.detail


def test_site_counts_by_hand():
    """op_counts of one combined site: no collective left, permutes of both rings."""
    prog = Program(fsdp_tp_layer, out_specs=P("batch", "feats"), **FSDP_TP)
    with partitioner(True):
        module = overlap_hlo.parse(prog.jitted().lower(*prog.args()).as_text())
    overlap_hlo.rewrite_module(module, threshold_mib=0)
    counts = op_counts(module)
    assert counts["stablehlo.all_gather"] == counts["stablehlo.reduce_scatter"] == 0
    assert counts["stablehlo.collective_permute"] >= 2


@pytest.mark.parametrize("layer, spec", [
    (fsdp_tp_layer, FSDP_TP),
    (lambda x, w: RS(AG(x, "batch", axis=0, tiled=True) @ w, "batch", scatter_dimension=1,
                     tiled=True),
     dict(mesh_shape=(4, 2), axes=("batch", "feats"),
          inputs=[((64, 32), P("batch")), ((32, 64), P())])),
], ids=["fsdp-tp", "same-axis"])
def test_scatter_pass_first_gives_the_same_two_rings(layer, spec):
    """With the reduce_scatter pass first, its ring reads the gathered tensor, and the
    all_gather pass then finds the ring's first partial dot and the loop to serve."""
    out = P(None, "batch") if spec is not FSDP_TP else P("batch", "feats")
    prog = Program(layer, out_specs=out, **spec)
    check(prog, rewritten=2, pipeline="builtin.module(overlap-matmul-reduce-scatter,"
                                      "overlap-all-gather-matmul,canonicalize,cse)")
