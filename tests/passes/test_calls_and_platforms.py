"""Sites in called functions and in multi-platform exports.

A ring's permutes span every device of the module, while an all_gather synchronises
only its group: a collective that some devices skip (a function called under a
device-dependent branch) must keep its collective, wherever the branch is. A nested
`jax.jit` layer (a func.call) is inlined where it receives a gathered value; a
multi-platform export's per-platform branches are inlined where they are the same.
Differential tests on 8 host CPU devices, plus the structure.
"""
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, auto_axis_types, check, gathered_dot, op_counts, partitioner

AG = jax.lax.all_gather


@jax.jit
def gathered_layer(x, w):
    return AG(x, "tp", axis=0, tiled=True) @ w


def pipeline_stage(x, w):
    """Pipeline parallelism: only the devices of stage 0 run the layer."""
    stage = jax.lax.axis_index("stage")
    return jax.lax.cond(stage == 0, lambda: gathered_layer(x, w),
                        lambda: jnp.zeros((x.shape[0] * 4, w.shape[1]), x.dtype))


def test_called_function_under_a_device_dependent_branch_keeps_its_collective():
    prog = Program(pipeline_stage, (2, 4), ("stage", "tp"),
                   [((32, 16), P("tp")), ((16, 16), P())], P("stage"))
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    assert "func.call @gathered_layer" in text   # the layer is a called function
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert [s.applied for s in sites] == [False], [s.format() for s in sites]
    assert "in @gathered_layer, called inside a stablehlo.case branch" in sites[0].reason
    # Left unchanged, the program runs (a ring spanning all 8 devices would deadlock).
    check(prog, rewritten=0, left=Counter({"stablehlo.all_gather": 1}))


def test_called_function_on_every_device_is_rewritten():
    def body(x, w):
        return gathered_layer(x, w) + 1.0

    check(Program(body, (2, 4), ("stage", "tp"), [((32, 16), P("tp")), ((16, 16), P())],
                  P("stage")))


@jax.jit
def layer_of_gathered(g, w):
    return jnp.tanh(g @ w)


def test_gathered_value_passed_to_a_nested_jit_is_inlined_and_rewritten():
    def body(x, w):
        return layer_of_gathered(AG(x, "i", axis=0, tiled=True), w)

    prog = Program(body, (8,), ("i",), [((64, 32), P("i")), ((32, 16), P())], P())
    counts = check(prog)
    assert counts["func.call"] == 0 and counts["stablehlo.collective_permute"] > 0


def test_psum_scatter_of_a_nested_jit_is_inlined_and_rewritten():
    @jax.jit
    def product(x, w):
        return x @ w

    def body(x, w):
        return jax.lax.psum_scatter(product(x, w), "i", scatter_dimension=0, tiled=True)

    check(Program(body, (8,), ("i",), [((64, 32), P()), ((32, 16), P())], P("i")))


def test_dot_in_a_scan_body_reading_a_gather_from_outside_is_reported():
    def body(x, ws):
        g = AG(x, "i", axis=0, tiled=True)
        return jax.lax.scan(lambda c, w: (c + g @ w, None), jnp.zeros((64, 16)), ws)[0]

    prog = Program(body, (8,), ("i",), [((64, 32), P("i")), ((3, 32, 16), P())], P())
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert [s.applied for s in sites] == [False]
    assert "through a stablehlo.while operand" in sites[0].reason
    assert sites[0].kind == "dot across a region boundary"


@pytest.fixture(scope="module")
def mesh():
    return jax.sharding.Mesh(np.array(jax.devices()), ("x",), **auto_axis_types(1))


def multi_platform_export(mesh):
    fn, x, w = gathered_dot(mesh, seed=2)
    return jax.export.export(fn, platforms=("cpu", "tpu"))(x, w), (x, w)


def test_multi_platform_export_is_rewritten_for_every_platform(mesh):
    exported, args = multi_platform_export(mesh)
    text = exported.mlir_module()
    assert '"stablehlo.case"' in text and "_platform_index" in text
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    new = overlap_hlo.rewrite_exported(exported, threshold_mib=0)
    counts = op_counts(overlap_hlo.parse(new.mlir_module()))
    assert counts["stablehlo.all_gather"] == 0 and counts["stablehlo.collective_permute"] > 0
    assert new.platforms == ("cpu", "tpu")
    np.testing.assert_allclose(np.asarray(new.call(*args)), np.asarray(exported.call(*args)),
                               rtol=1e-5, atol=1e-5)


DIFFERENT_BRANCHES = """module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%p: tensor<i32> {jax.global_constant = "_platform_index"}, %x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.case"(%p) ({
      %1 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
      stablehlo.return %1 : tensor<8x16xf32>
    }, {
      %1 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
      stablehlo.return %1 : tensor<8x16xf32>
    }) : (tensor<i32>) -> tensor<8x16xf32>
    %2 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    return %2 : tensor<8x8xf32>
  }
}
"""


def test_per_platform_branches_that_differ_are_reported():
    sites = overlap_hlo.remarks(DIFFERENT_BRANCHES, threshold_mib=0)
    assert [s.applied for s in sites] == [False, False]
    assert all("through the result of a stablehlo.case" in s.reason for s in sites)


def test_identical_per_platform_branches_are_inlined():
    text = DIFFERENT_BRANCHES.replace("handle = 2", "handle = 1")   # branches now equal
    module = overlap_hlo.parse(text)
    assert [s.applied for s in overlap_hlo.rewrite_module(module, threshold_mib=0)] == [True]
    assert op_counts(module)["stablehlo.case"] == 0


BRANCH_ON_PLATFORM = """module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%p: tensor<i32> {jax.global_constant = "_platform_index"}, %x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<8x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = "stablehlo.case"(%p) ({
      %2 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
      stablehlo.return %2 : tensor<8x8xf32>
    }, {
      %2 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
      stablehlo.return %2 : tensor<8x8xf32>
    }) : (tensor<i32>) -> tensor<8x8xf32>
    return %1 : tensor<8x8xf32>
  }
}
"""


def test_a_branch_on_the_platform_index_runs_alike_on_every_device():
    """The platform index is the same on every device: the dots inside the branches of
    a case on it get their rings there, not hoisted in front of the case."""
    module = overlap_hlo.parse(BRANCH_ON_PLATFORM)
    sites = overlap_hlo.rewrite_module(module, threshold_mib=0)
    assert [s.applied for s in sites] == [True], [s.format() for s in sites]
    assert "hoisted" not in sites[0].detail
    counts = op_counts(module)
    assert counts["stablehlo.all_gather"] == 0 and counts["stablehlo.case"] == 1
