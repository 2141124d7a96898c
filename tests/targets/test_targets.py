"""Forms for a named backend (`target`), checked on the host CPU devices.

On TPU and GPU a buffer that a ring writes whole starts uninitialised (custom_call
@AllocateBuffer, which the CPU backend cannot run). Here each such buffer is filled
with NaN (integers: a sentinel) before the module runs on 8 host devices: an element
the ring failed to write would show, so the comparison with the original proves that
every element is written.
"""
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

import overlap_hlo
from harness import Program, assert_close, op_counts, partitioner
from overlap_hlo.ir import compat
from overlap_hlo.targets.cpu import poison_buffers

AG = jax.lax.all_gather
A2A = jax.lax.all_to_all
RS = jax.lax.psum_scatter


def assert_runs_as_the_original(prog: Program, lowered, module: ir.Module) -> None:
    """`module` (the rewritten form of `lowered`, buffers poisoned) gives the original's
    results on the program's inputs of two seeds."""
    new = compat.replace_lowered_module(lowered, module).compile()
    reference = lowered.compile()
    for seed in (0, 1):
        args = prog.args(seed)
        for got, want in zip(jax.tree.leaves(new(*args)), jax.tree.leaves(reference(*args))):
            assert_close(got, want, (jnp.float32,))


def gated(x, w_gate, w_up):
    g = AG(x, "x", axis=0, tiled=True)
    return jax.nn.silu(g @ w_gate) * (g @ w_up)


def qkv(x, wq, wk, wv):   # three dots on one gather (GPU, two streams: serial blocks)
    g = AG(x, "x", axis=0, tiled=True)
    return g @ wq, g @ wk, g @ wv


def batched(x, w):
    return jnp.einsum("bsd,bdf->bsf", AG(x, "x", axis=0, tiled=True), w)


def reused(x, w, v):
    g = AG(x, "x", axis=0, tiled=True)
    return g @ w, jnp.sum(g) + g[:, :2] @ v[:2]


def scattered_and_read(x, w):
    y = x @ w
    return RS(y, "x", scatter_dimension=0, tiled=True), jnp.sum(y)


PROGRAMS = {
    "free": (lambda x, w: AG(x, "x", axis=0, tiled=True) @ w,
             [((64, 32), P("x")), ((32, 16), P())], P()),
    "gated epilogue": (gated, [((64, 32), P("x")), ((32, 16), P()), ((32, 16), P())], P()),
    "three dots": (qkv, [((64, 32), P("x"))] + [((32, 16), P())] * 3, (P(),) * 3),
    "batch": (batched, [((16, 4, 8), P("x")), ((16, 8, 4), P())], P()),
    "assembled for other readers": (reused, [((64, 32), P("x")), ((32, 16), P()),
                                             ((2, 16), P())], (P(), P())),
    "scatter product read after": (scattered_and_read, [((64, 32), P()), ((32, 16), P())],
                                   (P("x"), P())),
    # all_to_all then dot: on GPU each send waits for the dot two steps back
    "moe dispatch": (lambda x, w: jnp.einsum("ecm,emh->ech", A2A(x, "x", 0, 1, tiled=True),
                                             w),
                     [((16, 4, 32), P()), ((16, 32, 24), P("x"))], P("x")),
    "psum of a dot": (lambda x, w: jax.lax.psum(x @ w, "x"),
                      [((64, 32), P(None, "x")), ((32, 16), P("x"))], P()),
}


@pytest.mark.parametrize("target", ["tpu", "gpu"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", PROGRAMS)
def test_buffers_written_whole(name, bidirectional, target):
    fn, inputs, out_specs = PROGRAMS[name]
    prog = Program(fn, (8,), ("x",), inputs, out_specs)
    with partitioner(True):
        lowered = prog.jitted().lower(*prog.args())
        module = overlap_hlo.parse(lowered.as_text())
        sites = overlap_hlo.rewrite_module(module, threshold_mib=0, target=target,
                                           bidirectional=bidirectional)
        assert all(s.applied for s in sites), [s.format() for s in sites]
        # (a two-stream ring's sum is its loop's result: no buffer to write whole)
        assert poison_buffers(module) >= (0 if name == "psum of a dot" and bidirectional
                                          else 1)
        counts = op_counts(module)
        assert counts["stablehlo.reduce_scatter"] + counts["stablehlo.all_to_all"] == 0
        assert counts["stablehlo.all_gather"] == counts["stablehlo.all_reduce"] == 0 or (
            name == "psum of a dot" and counts["stablehlo.all_gather"] == 1)
        assert_runs_as_the_original(prog, lowered, module)


# tpu-summing-rings: the TPU forms of a ring that sums over a contracting gathered dim
# (own shard first, its sum tied each round; or last), alone and inside an FSDP x TP
# layer's scatter ring (whose gather ring assembles the gathered weight for the layer's
# other readers).
SUMMING = {
    "fsdp": (lambda x, w: x @ AG(w, "x", axis=0, tiled=True), (8,), ("x",),
             [((64, 32), P("x")), ((32, 16), P("x"))], P("x")),
    "fsdp x tp": (lambda x, w: RS(x @ AG(w, "batch", axis=0, tiled=True), "feats",
                                  scatter_dimension=1, tiled=True),
                  (4, 2), ("batch", "feats"),
                  [((32, 64), P("batch", "feats")), ((64, 16), P(("feats", "batch")))],
                  P("batch", "feats")),
    "fsdp x tp gradient": (
        jax.grad(lambda x, w: jnp.sum(jnp.tanh(RS(x @ AG(w, "batch", axis=0, tiled=True),
                                                  "feats", scatter_dimension=1,
                                                  tiled=True))), argnums=1),
        (4, 2), ("batch", "feats"),
        [((32, 64), P("batch", "feats")), ((64, 16), P(("feats", "batch")))],
        P(("feats", "batch"))),
}


@pytest.mark.parametrize("own_last", [False, True])
@pytest.mark.parametrize("name", SUMMING)
def test_tpu_summing_rings_match_the_original(name, own_last):
    fn, mesh, axes, inputs, out_specs = SUMMING[name]
    prog = Program(fn, mesh, axes, inputs, out_specs)
    with partitioner(True):
        lowered = prog.jitted().lower(*prog.args())
        module = overlap_hlo.parse(lowered.as_text())
        sites = overlap_hlo.rewrite_module(module, threshold_mib=0, target="tpu",
                                           bidirectional=True, tpu_summing_rings=True,
                                           own_shard_last=own_last)
        assert any(s.applied and s.plan.tied_sums and s.plan.in_loop_sum
                   and s.plan.own_in_last_round == own_last for s in sites), \
            [s.format() for s in sites]
        poison_buffers(module)
        counts = op_counts(module)
        assert counts["stablehlo.all_gather"] + counts["stablehlo.reduce_scatter"] == 0
        assert_runs_as_the_original(prog, lowered, module)


def test_tpu_target_unrolls_by_two_unless_told():
    text = overlap_hlo.rewrite_source(
        PROGRAMS_TEXT, threshold_mib=0, target="tpu")
    assert text.count("collective_permute") == 3       # one before the loop, two inside
    text = overlap_hlo.rewrite_source(PROGRAMS_TEXT, threshold_mib=0, target="tpu", unroll=1)
    assert text.count("collective_permute") == 2
    sites = overlap_hlo.remarks(PROGRAMS_TEXT, threshold_mib=0, hardware="tpu-v6e")
    assert sites[0].plan.unroll == 2


PROGRAMS_TEXT = """module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<16x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }
}
"""


def test_unknown_target_is_refused():
    with pytest.raises(overlap_hlo.PipelineError, match="target must be one of"):
        overlap_hlo.remarks(PROGRAMS_TEXT, target="npu")


def scanned_layers(x, w1s, w2s):
    """Two tensor-parallel layers under lax.scan: each layer's weights are slices of the
    stacked ones (JAX's dynamic_index_in_dim in the scan body)."""
    def layer(h, ws):
        w1, w2 = ws
        t = jnp.tanh(AG(h, "x", axis=0, tiled=True) @ w1 / 4)
        return h + RS((t / 4) @ w2, "x", scatter_dimension=0, tiled=True), None

    return jnp.sum(jax.lax.scan(layer, x, (w1s, w2s))[0] ** 2)


def loops_reading(module: ir.Module, shape: str = "") -> int:
    """stablehlo.while ops in `module` with a `shape` tensor among their operands."""
    return sum(1 for line in str(module).splitlines()
               if "stablehlo.while" in line and f"tensor<{shape}" in line.split(" : ")[-1])


@pytest.mark.parametrize("target", ["tpu", "gpu"])
def test_rings_slice_a_scanned_layers_weights_in_their_loop(target):
    """The TPU forms pass a scanned layer's stacked weights and its index into each ring
    loop and slice them there (given the slice, libtpu copies the whole weight out of
    the stack before the loop: tests/targets/test_tpu.py checks the schedule); the
    other forms pass the slice."""
    inputs = [((64, 16), P("x")), ((3, 16, 16), P()), ((3, 16, 16), P())]
    prog = Program(jax.grad(scanned_layers, argnums=(0, 1, 2)), (8,), ("x",), inputs,
                   (P("x"), P(), P()))
    with partitioner(True):
        lowered = prog.jitted().lower(*prog.args())
        module = overlap_hlo.parse(lowered.as_text())
        scans = loops_reading(module)   # the forward and backward scans
        assert scans == loops_reading(module, "3x16x16xf32") == 2
        sites = overlap_hlo.rewrite_module(module, threshold_mib=0, target=target,
                                           bidirectional=True, tpu_summing_rings=True)
        assert sum(s.applied for s in sites) == 4, [s.format() for s in sites]
        rings = loops_reading(module) - scans    # one ring of the four runs inline
        assert rings == 3
        assert loops_reading(module, "3x16x16xf32") - scans == (rings if target == "tpu"
                                                                else 0)
        poison_buffers(module)
        assert_runs_as_the_original(prog, lowered, module)
