"""Every pattern variant, run before and after the rewrite on 8 host CPU devices."""
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, assert_close, check, partitioner

AG = jax.lax.all_gather
RS = jax.lax.psum_scatter
EXPORT_FORMS = [pytest.param(True, id="shardy"), pytest.param(False, id="gspmd")]


def ag(axis, dim):
    return lambda x: AG(x, axis, axis=dim, tiled=True)


def rs(axis, dim):
    return lambda y: RS(y, axis, scatter_dimension=dim, tiled=True)


# name -> (fn, inputs, out_specs); mesh (4, 2) with axes ("x", "y").
GATHER_CASES = {
    # free dim of the lhs: sequence-parallel activations gathered before a matmul
    "free-lhs": (lambda x, w: ag("x", 0)(x) @ w,
                 [((64, 32), P("x")), ((32, 24), P())], P()),
    # free dim of the rhs
    "free-rhs": (lambda w, x: jnp.einsum("kd,nd->kn", w, ag("x", 0)(x)),
                 [((24, 32), P()), ((64, 32), P("x"))], P()),
    # contracting dim of the lhs
    "contracting-lhs": (lambda x, w: ag("x", 1)(x) @ w,
                        [((16, 64), P(None, "x")), ((64, 24), P())], P()),
    # contracting dim of the rhs (FSDP-style gathered weight)
    "contracting-rhs": (lambda x, w: x @ ag("x", 0)(w),
                        [((16, 64), P()), ((64, 24), P("x"))], P()),
    # free dim of a gathered weight (the rhs)
    "weight-free-rhs": (lambda x, w: x @ ag("x", 1)(w),
                        [((16, 32), P()), ((32, 64), P(None, "x"))], P()),
    # batch dim of the lhs
    "batch-lhs": (lambda x, w: jnp.einsum("bij,bjk->bik", ag("x", 0)(x), w),
                  [((8, 16, 32), P("x")), ((8, 32, 24), P())], P()),
    # batch dim of the rhs, batch not leading in the operand
    "batch-rhs": (lambda w, x: jnp.einsum("bij,jbk->bik", w, ag("x", 1)(x)),
                  [((8, 16, 32), P()), ((32, 8, 24), P(None, "x"))], P()),
}

SCATTER_CASES = {
    "free-lhs": (lambda x, w: rs("x", 0)(x @ w),
                 [((64, 32), P(None, "x")), ((32, 24), P("x"))], P("x")),
    "free-rhs": (lambda x, w: rs("x", 1)(x @ w),
                 [((24, 32), P(None, "x")), ((32, 64), P("x"))], P(None, "x")),
    "batch": (lambda x, w: rs("x", 0)(jnp.einsum("bij,bjk->bik", x, w)),
              [((8, 16, 32), P(None, None, "x")), ((8, 32, 24), P(None, "x"))], P("x")),
    # the transpose of one gather feeding Q/K/V: a sum of three dots is scattered
    "sum-of-dots": (lambda dq, dk, wq, wk: rs("x", 0)(dq @ wq.T + dk @ wk.T),
                    [((64, 16), P(None, "x")), ((64, 16), P(None, "x")),
                     ((32, 16), P(None, "x")), ((32, 16), P(None, "x"))], P("x")),
    "batched-free-rhs": (lambda x, w: rs("x", 2)(jnp.einsum("bij,bjk->bik", x, w)),
                         [((8, 16, 32), P(None, None, "x")), ((8, 32, 64), P(None, "x"))],
                         P(None, None, "x")),
}


# Views between the collective and the dot: transposes and converts.
VIEW_CASES = {
    # weight gradient g.T @ dy: transpose of the gathered activations
    "gather-transpose": (lambda x, dy: ag("x", 0)(x).T @ dy,
                         [((64, 32), P("x")), ((64, 16), P())], P()),
    # bf16 activations gathered, then upcast for an f32 matmul
    "gather-convert": (lambda x, w: ag("x", 0)(x).astype(jnp.float32) @ w,
                       [((64, 32), P("x")), ((32, 16), P())], P()),
    # f32 partial sums rounded to bf16 before the scatter
    "scatter-convert": (lambda x, w: rs("x", 0)((x @ w).astype(jnp.bfloat16)),
                        [((64, 32), P(None, "x")), ((32, 24), P("x"))], P("x")),
    # activations gathered along the hidden dim, batch and sequence merged by a reshape
    "gather-reshape": (lambda x, w: ag("x", 2)(x).reshape(-1, 64) @ w,
                       [((2, 8, 64), P(None, None, "x")), ((64, 24), P())], P()),
    # non-tiled gathers: a new leading axis merged into the next one by a reshape
    "gather-nontiled-free": (lambda x, w: AG(x, "x", axis=0).reshape(-1, 32) @ w,
                             [((64, 32), P("x")), ((32, 24), P())], P()),
    "gather-nontiled-contracting": (lambda x, w: AG(x, "x", axis=1).reshape(16, -1) @ w,
                                    [((16, 64), P(None, "x")), ((64, 24), P())], P()),
    # int8 weights gathered, upcast and scaled per output column (dequantized)
    "gather-dequantize": (lambda w, x, scale: x @ (ag("x", 0)(w).astype(jnp.float32) * scale),
                          [((64, 24), P("x"), jnp.int8), ((16, 64), P()), ((24,), P())], P()),
    # dot output reshaped to (batch, seq, hidden) before scattering the hidden dim
    "scatter-reshape": (lambda x, w: rs("x", 2)((x @ w).reshape(2, 8, 64)),
                        [((16, 32), P(None, "x")), ((32, 64), P("x"))], P(None, None, "x")),
    # a product used transposed (JAX's weight gradients): the ring sums dot(b, a)
    "gather-product-transposed": (lambda h, dy: (h.T @ ag("x", 0)(dy)).T,
                                  [((64, 32), P()), ((64, 16), P("x"))], P()),
    "scatter-product-transposed": (lambda x, w: rs("x", 0)((x @ w).T),
                                   [((64, 32), P(None, "x")), ((32, 24), P("x"))], P("x")),
    # batched dot whose output JAX transposes (einsum "ibj,bjk->ibk")
    "scatter-transpose": (lambda x, w: rs("x", 1)(jnp.einsum("ibj,bjk->ibk", x, w)),
                          [((16, 8, 32), P(None, None, "x")), ((8, 32, 24), P(None, "x"))],
                          P(None, "x")),
}


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
@pytest.mark.parametrize("case", sorted(VIEW_CASES))
def test_views_between_collective_and_dot(case, shardy):
    fn, inputs, out_specs = VIEW_CASES[case]
    dtype = jnp.bfloat16 if case == "gather-convert" else jnp.float32
    prog = Program(fn, (4, 2), ("x", "y"), inputs, out_specs, dtype=dtype)
    check(prog, shardy=shardy)


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
@pytest.mark.parametrize("case", sorted(GATHER_CASES))
def test_all_gather_matmul(case, shardy):
    fn, inputs, out_specs = GATHER_CASES[case]
    check(Program(fn, (4, 2), ("x", "y"), inputs, out_specs), shardy=shardy)


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
@pytest.mark.parametrize("case", sorted(SCATTER_CASES))
def test_matmul_reduce_scatter(case, shardy):
    fn, inputs, out_specs = SCATTER_CASES[case]
    check(Program(fn, (4, 2), ("x", "y"), inputs, out_specs), shardy=shardy)


# Group layouts: one group of 8, strided groups, contiguous pairs, 3-D mesh, two axes.
LAYOUTS = {
    "one-group-8": ((8,), ("x",), "x"),
    "strided-4": ((4, 2), ("x", "y"), "x"),
    "contiguous-2": ((4, 2), ("x", "y"), "y"),
    "3d-middle-axis": ((2, 2, 2), ("x", "y", "z"), "y"),
    "two-axes": ((2, 2, 2), ("x", "y", "z"), ("x", "z")),
}


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_group_layouts(layout, shardy):
    mesh_shape, axes, axis = LAYOUTS[layout]

    def mlp(x, w1, w2):
        h = AG(x, axis, axis=0, tiled=True) @ w1
        return RS(jax.nn.relu(h) @ w2, axis, scatter_dimension=0, tiled=True)

    inputs = [((64, 32), P(axis)), ((32, 48), P(None, axis)), ((48, 32), P(axis))]
    check(Program(mlp, mesh_shape, axes, inputs, P(axis)), shardy=shardy, rewritten=2)


@pytest.mark.parametrize("shardy", EXPORT_FORMS)
def test_sequence_parallel_mlp_bf16(shardy):
    def mlp(x, w1, w2):
        h = ag("x", 0)(x) @ w1
        return rs("x", 0)(jax.nn.gelu(h) @ w2)

    inputs = [((64, 32), P("x")), ((32, 64), P(None, "x")), ((64, 32), P("x"))]
    check(Program(mlp, (4, 2), ("x", "y"), inputs, P("x"), dtype=jnp.bfloat16),
          shardy=shardy, rewritten=2)


def test_gated_mlp_one_gather_two_dots():
    def gated(x, wg, wu, wd):
        g = ag("x", 0)(x)
        h = jax.nn.silu(g @ wg) * (g @ wu)
        return rs("x", 0)(h @ wd)

    inputs = [((64, 32), P("x")), ((32, 48), P(None, "x")), ((32, 48), P(None, "x")),
              ((48, 32), P("x"))]
    counts = check(Program(gated, (4, 2), ("x", "y"), inputs, P("x")), rewritten=2)
    # One ring carries the gathered shard for both dots; the scatter has its own.
    assert counts["stablehlo.while"] == 2


def test_gather_with_other_users_is_assembled_by_the_ring():
    def fn(x, w):
        g = ag("x", 0)(x)
        return g @ w + g.sum()   # the sum reads the gathered tensor after the dot

    inputs = [((64, 32), P("x")), ((32, 32), P())]
    check(Program(fn, (4, 2), ("x", "y"), inputs, P()))


def test_gather_read_before_the_ring_keeps_it():
    def fn(x, w):
        g = ag("x", 0)(x)
        s = g.sum()              # read before the dot: the ring's buffer comes too late
        return g @ (w + s)

    inputs = [((64, 32), P("x")), ((32, 32), P())]
    check(Program(fn, (4, 2), ("x", "y"), inputs, P()),
          left=Counter({"stablehlo.all_gather": 1}))


def test_integer_dot():
    def fn(x, w):
        return ag("x", 0)(x) @ w

    prog = Program(fn, (4, 2), ("x", "y"), [((64, 32), P("x")), ((32, 16), P())], P(),
                   dtype=jnp.int32)
    check(prog)


def test_gather_and_scatter_on_the_same_dot():
    def fn(x, w):
        return rs("x", 1)(ag("x", 0)(x) @ w)

    inputs = [((64, 32), P("x")), ((32, 64), P())]
    # Both rings: the scatter's, whose first partial dot is the gather ring's consumer.
    check(Program(fn, (4, 2), ("x", "y"), inputs, P(None, "x")), rewritten=2)


def test_scale_varying_along_the_gathered_dim_is_not_a_view():
    def fn(w, x, scale):   # a per-row scale: each gathered block has its own
        return x @ (ag("x", 0)(w).astype(jnp.float32) * scale[:, None])

    inputs = [((64, 24), P("x"), jnp.int8), ((16, 64), P()), ((64,), P())]
    check(Program(fn, (4, 2), ("x", "y"), inputs, P()), rewritten=0,
          left=Counter({"stablehlo.all_gather": 1}))


# (bidirectional, unroll, dtype) covering every form of a summing ring's plan on a
# group of 8: the sum started by round 0's product or from zeros (one stream, unroll 2
# and 4), rounds before the loop (unroll 3), and with two streams the shared last
# round, where both hold p+4 (floats weight each half, integers one of them).
SUMMING_FORMS = [(False, 1, "bfloat16"), (False, 2, "bfloat16"), (False, 3, "bfloat16"),
                 (False, 4, "bfloat16"), (True, 1, "bfloat16"), (True, 2, "float32"),
                 (True, 1, "int32")]


def fsdp_program(dtype=jnp.float32) -> Program:
    """x @ all_gather(w) over one group of 8, w gathered along its rows (contracting)."""
    def fsdp(x, w):
        return x @ ag("x", 0)(w)

    return Program(fsdp, (8,), ("x",), [((64, 64), P("x")), ((64, 24), P("x"))], P("x"),
                   dtype=dtype)


@pytest.mark.parametrize("bidirectional, unroll, dtype", SUMMING_FORMS,
                         ids=[f"{'bidi' if b else 'one'}-unroll{u}-{t}" for b, u, t in SUMMING_FORMS])
def test_summing_gather_ring_forms(bidirectional, unroll, dtype):
    opts = f"{{bidirectional={str(bidirectional).lower()} unroll={unroll}}}"
    check(fsdp_program(jnp.dtype(dtype)),
          pipeline=f"builtin.module(overlap-all-gather-matmul{opts},canonicalize,cse)")


def test_shared_round_keeps_infinities_and_nans():
    """Two streams on 8 devices: the last round holds block p+4 on both streams and
    weights each half. A non-finite weight in that block gives what the original
    gives (inf stays inf, not NaN)."""
    prog = fsdp_program()
    x, w = (np.array(a) for a in prog.args(0))
    x = np.abs(x)             # products of one sign: an inf weight gives +-inf, not NaN
    w[4 * 8, 3], w[5 * 8 + 1, 7] = np.inf, np.nan  # in the block device 0 gets last
    args = [jax.device_put(a, s) for a, s in zip((x, w), (s.sharding for s in prog.args(0)))]
    opts = "{bidirectional=true}"
    with partitioner(True):
        lowered = prog.jitted().lower(*args)
        new = overlap_hlo.rewrite_lowered(
            lowered, f"builtin.module(overlap-all-gather-matmul{opts})", threshold_mib=0)
    want, got = np.asarray(lowered.compile()(*args)), np.asarray(new.compile()(*args))
    assert np.isinf(want).any() and np.isnan(want).any()
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=1e-4)


def test_f16_summing_ring_sums_in_f32():
    """Products of f16 blocks summed round by round in f16 overflow where the one dot,
    which accumulates in f32, does not: f16 rings always sum in f32."""
    def fsdp(x, w):
        return x @ ag("x", 0)(w)

    prog = Program(fsdp, (8,), ("x",), [((16, 64), P()), ((64, 64), P("x"))], P(),
                   dtype=jnp.float16)
    rng = np.random.default_rng(4)
    x = rng.uniform(1, 2, (16, 64))
    w = np.where(np.arange(64)[:, None] < 32, 1500.0, -1500.0) + rng.standard_normal((64, 64))
    # Half the contracted blocks add about +72000 (beyond f16's 65504), the other half
    # take it back: a sum kept in f16 between rounds overflows, the final one does not.
    args = [jax.device_put(jnp.asarray(a, jnp.float16), s.sharding)
            for a, s in zip((x, w), prog.args(0))]
    with partitioner(True):
        lowered = prog.jitted().lower(*args)
        for bidirectional in (False, True):
            new = overlap_hlo.rewrite_lowered(lowered, threshold_mib=0,
                                              bidirectional=bidirectional)
            want = np.asarray(lowered.compile()(*args), np.float64)
            got = np.asarray(new.compile()(*args), np.float64)
            assert np.isfinite(want).all() and np.isfinite(got).all()
            assert_close(got, want, (jnp.float16,))


def test_shared_round_is_exact_for_f8():
    """Two streams, even group: the shared last round splits the other operand's block
    between the streams. Halving an f8 value below twice its smallest normal loses bits;
    those elements go whole to one stream, so the sum is exact to f32 rounding."""
    f8 = jnp.float8_e4m3fn

    def fsdp(x, w):
        return jnp.dot(x, ag("x", 0)(w), preferred_element_type=jnp.float32)

    prog = Program(fsdp, (8,), ("x",), [((64, 64), P("x")), ((64, 24), P("x"))], P("x"),
                   dtype=f8)
    rng = np.random.default_rng(3)
    shardings = [a.sharding for a in prog.args(0)]
    tiny = rng.uniform(2 ** -9, 2 ** -5, (64, 64)) * rng.choice((-1, 1), (64, 64))
    args = [jax.device_put(jnp.asarray(a, f8), s) for a, s in
            zip((tiny, rng.standard_normal((64, 24))), shardings)]
    with partitioner(True):
        lowered = prog.jitted().lower(*args)
        new = overlap_hlo.rewrite_lowered(lowered, threshold_mib=0, bidirectional=True)
        want = np.asarray(lowered.compile()(*args))
        got = np.asarray(new.compile()(*args))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("case", ["free-lhs", "batch"])
def test_gpu_form_of_a_two_stream_scatter_ring(case):
    """target=gpu: the own block's dot adds the up stream's sum behind a barrier and the
    down stream's after it (so XLA's GPU GEMM does not wait for the last transfer);
    the same numbers on the 8 host devices."""
    fn, inputs, out_specs = SCATTER_CASES[case]
    counts = check(Program(fn, (8,), ("x",), inputs, out_specs), pipeline=(
        "builtin.module(overlap-matmul-reduce-scatter{bidirectional=true target=gpu})"))
    assert counts["stablehlo.optimization_barrier"] == 1
