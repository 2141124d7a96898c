"""Training steps: the gathered tensor reused instead of sent twice.

Under jax.grad the forward all_gather also feeds the backward pass (the weight
gradient's dot, whose other operand only exists later, or a residual saved by a scan).
The first ring then assembles the gathered tensor as it goes and every other reader
reads that buffer: no all_gather is left and no shard travels twice. Each program runs
before and after the rewrite on 8 host CPU devices (tests/harness.py's check).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check, partitioner, permute_count, ring_pipeline
from overlap_hlo.passes import all_gather_matmul, matmul_reduce_scatter
from overlap_hlo.passes.all_gather_matmul import OverlapAllGatherMatmul

AG = jax.lax.all_gather
RS = jax.lax.psum_scatter
OPTIONS = [pytest.param((False, 1), id="default"), pytest.param((True, 1), id="bidi"),
           pytest.param((False, 2), id="unroll2"), pytest.param((True, 3), id="bidi-unroll3")]


def pipeline(options) -> str:
    bidirectional, unroll = options
    return ring_pipeline(bidirectional, unroll)


def sp_mlp(x, w1, w2):
    h = AG(x, "x", axis=0, tiled=True) @ (w1 / np.sqrt(w1.shape[0]))
    return RS(jax.nn.gelu(h) @ (w2 / np.sqrt(w2.shape[0])), "x", scatter_dimension=0,
              tiled=True)


def swiglu(x, wg, wu, wd):
    g = AG(x, "x", axis=0, tiled=True)
    h = jax.nn.silu(g @ wg) * (g @ wu)
    return RS(h @ (wd / 8.0), "x", scatter_dimension=0, tiled=True)


def fsdp(x, w):
    """FSDP: the weight is gathered (along its contracting dim) for the matmul."""
    return jnp.tanh(x @ AG(w, "x", axis=0, tiled=True) / 8.0)   # unit-scale pre-activations


def ring_permutes(n: int, options, gathers: int, scatters: int, summing: int = 0) -> int:
    """Permutes of `gathers` all_gather rings (`summing` of them sum products of a
    contracting dim, with sends in every round of the loop's form) and `scatters`
    reduce_scatter rings."""
    bidirectional, unroll = options
    opts = OverlapAllGatherMatmul(bidirectional=bidirectional, unroll=unroll)
    return ((gathers - summing) * permute_count(all_gather_matmul, n, opts)
            + summing * permute_count(all_gather_matmul, n, opts, sums=True)
            + scatters * permute_count(matmul_reduce_scatter, n, opts))


def grad_of(fn, argnums):
    return jax.grad(lambda *args: jnp.sum(fn(*args) ** 2), argnums=argnums)


MLP_INPUTS = [((64, 32), P("x")), ((32, 64), P(None, "x")), ((64, 32), P("x"))]


@pytest.mark.parametrize("options", OPTIONS)
def test_sequence_parallel_mlp_gradient(options):
    prog = Program(grad_of(sp_mlp, (0, 1, 2)), (8,), ("x",), MLP_INPUTS,
                   (P("x"), P(None, "x"), P("x")))
    counts = check(prog, rewritten=4, pipeline=pipeline(options))
    # One ring per collective: the forward gather's ring serves the weight gradient
    # (which reads the buffer it assembles); the backward gather's ring sums the
    # gradient of w2 (its gathered dim contracting).
    assert counts["stablehlo.collective_permute"] == ring_permutes(8, options, 2, 2, summing=1)


@pytest.mark.parametrize("options", OPTIONS[:2])
def test_swiglu_gradient(options):
    inputs = [((64, 32), P("x")), ((32, 64), P(None, "x")), ((32, 64), P(None, "x")),
              ((64, 32), P("x"))]
    prog = Program(grad_of(swiglu, (0, 1, 2, 3)), (4, 2), ("x", "y"), inputs,
                   (P("x"), P(None, "x"), P(None, "x"), P("x")))
    counts = check(prog, rewritten=4, pipeline=pipeline(options))
    assert counts["stablehlo.collective_permute"] == ring_permutes(4, options, 2, 2)


@pytest.mark.parametrize("options", OPTIONS[:2])
def test_fsdp_gradient(options):
    inputs = [((32, 64), P("x")), ((64, 16), P("x"))]
    prog = Program(grad_of(fsdp, (0, 1)), (8,), ("x",), inputs, (P("x"), P("x")))
    check(prog, rewritten=2, pipeline=pipeline(options))


def test_reused_dot_has_no_ring_of_its_own():
    prog = Program(grad_of(sp_mlp, (0, 1, 2)), (8,), ("x",), MLP_INPUTS,
                   (P("x"), P(None, "x"), P("x")))
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert len(sites) == 4 and all(s.applied for s in sites)
    forward = sites[0]
    assert "1 dot(s) (free dim)" in forward.detail
    assert "assembles the gathered tensor for 1 other reader(s), 1 of them dot(s)" \
        in forward.detail
    assert "loops" not in forward.detail


def test_scanned_residual_is_assembled():
    def layer(h, w):   # weights scaled by 1/sqrt(16): the gradient stays well conditioned
        return h + RS(jnp.tanh(AG(h, "x", axis=0, tiled=True) @ (w[0] / 4)) @ (w[1] / 4),
                      "x", scatter_dimension=0, tiled=True), None

    def loss(x, ws):
        return jnp.sum(jax.lax.scan(layer, x, ws)[0] ** 2)

    inputs = [((64, 16), P("x")), ((3, 2, 16, 16), P())]
    prog = Program(jax.grad(loss, argnums=(0, 1)), (8,), ("x",), inputs, (P("x"), P()))
    check(prog, rewritten=4)


@pytest.fixture
def sums_left_out(monkeypatch):
    """Every site with the other form (contracting-dim dots reading the ring's buffer)
    builds it, whatever decides."""
    from overlap_hlo.rewrite.rewrite_pass import RewritePass

    chosen = RewritePass._chosen_form

    def prefer_alternative(self, match, ordered):
        return chosen(self, match.alternative or match, ordered)

    monkeypatch.setattr(RewritePass, "_chosen_form", prefer_alternative)


@pytest.mark.parametrize("options", OPTIONS[:2])
def test_weight_gradients_read_the_assembled_tensor(sums_left_out, options):
    """The backward gather's ring computes the input gradient and assembles the
    gathered output gradient; the weight gradient reads it once, after the ring."""
    prog = Program(grad_of(sp_mlp, (0, 1, 2)), (8,), ("x",), MLP_INPUTS,
                   (P("x"), P(None, "x"), P("x")))
    counts = check(prog, rewritten=4, pipeline=pipeline(options))
    assert counts["stablehlo.collective_permute"] == ring_permutes(8, options, 2, 2)
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    sites = overlap_hlo.remarks(text, pipeline(options), threshold_mib=0)
    left_out = [s for s in sites if s.applied and all_gather_matmul.SUMS_LEFT_OUT in s.detail]
    assert len(left_out) == 1 and "1 dot(s) (free dim)" in left_out[0].detail


def test_swiglu_weight_gradients_read_the_assembled_tensor(sums_left_out):
    inputs = [((64, 32), P("x")), ((32, 64), P(None, "x")), ((32, 64), P(None, "x")),
              ((64, 32), P("x"))]
    prog = Program(grad_of(swiglu, (0, 1, 2, 3)), (4, 2), ("x", "y"), inputs,
                   (P("x"), P(None, "x"), P(None, "x"), P("x")))
    check(prog, rewritten=4, pipeline=pipeline(OPTIONS[0].values[0]))
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    sites = overlap_hlo.remarks(text, pipeline(OPTIONS[0].values[0]), threshold_mib=0)
    assert [s for s in sites if s.applied and all_gather_matmul.SUMS_LEFT_OUT in s.detail]
