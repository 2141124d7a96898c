"""Sites under control flow that the devices may not all take the same way.

Every device of a group must reach a ring's permutes. A dot inside an if/case branch
or inside a while whose trip count depends on the device, reading an all_gather from
outside, gets its ring hoisted in front of that region (when its other operand already
exists there) or is left unchanged; a while with a constant trip count (a scan) keeps
the ring inside. Differential tests on 8 host CPU devices, plus the structure.
"""
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir

import overlap_hlo
from harness import Program, check, op_counts, ops_named, partitioner, run_spmd_module
from overlap_hlo.ir.dominance import divergent_between, is_uniform, uniform_trip_count
from overlap_hlo.ir.unsupported import Kind

AG = jax.lax.all_gather
DIVERGENT = ("stablehlo.if", "stablehlo.case")


def permutes_under(module: ir.Module, names) -> int:
    """collective_permutes with an enclosing op named in `names`."""
    found = []

    def visit(op):
        if op.name == "stablehlo.collective_permute":
            parent = op.parent
            while parent is not None and parent.name != "builtin.module":
                if parent.name in names:
                    found.append(op)
                    break
                parent = parent.parent
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return len(found)


def rewritten_module(program: Program) -> ir.Module:
    with partitioner(True):
        text = program.jitted().lower(*program.args()).as_text()
    module = overlap_hlo.parse(text)
    overlap_hlo.rewrite_module(module, threshold_mib=0)
    return module


def branch_gather(x, w):
    g = AG(x, "i", axis=0, tiled=True)
    return jax.lax.cond(jax.lax.axis_index("i") < 4, lambda: g @ w,
                        lambda: jnp.zeros((g.shape[0], w.shape[1])))


def test_dot_in_a_device_dependent_branch_is_hoisted():
    prog = Program(branch_gather, (8,), ("i",), [((64, 32), P("i")), ((32, 16), P())], P())
    check(prog)
    module = rewritten_module(prog)
    assert op_counts(module)["stablehlo.collective_permute"] >= 1
    assert permutes_under(module, DIVERGENT) == 0


def test_default_options_hoist_too():
    prog = Program(branch_gather, (8,), ("i",), [((512, 512), P("i")), ((512, 512), P())],
                   P())
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    module = overlap_hlo.parse(text)
    (site,) = overlap_hlo.rewrite_module(module)
    assert site.applied and "hoisted out of stablehlo.case" in site.detail
    assert permutes_under(module, DIVERGENT) == 0


def test_branch_and_unconditional_dots_share_one_ring():
    def fn(x, w1, w2):
        g = AG(x, "i", axis=0, tiled=True)
        h = g @ w1
        return h + jax.lax.cond(jax.lax.axis_index("i") % 2 == 0, lambda: g @ w2,
                                lambda: jnp.ones((64, 16)))

    prog = Program(fn, (8,), ("i",), [((64, 32), P("i")), ((32, 16), P()), ((32, 16), P())],
                   P())
    counts = check(prog)
    assert counts["stablehlo.while"] == 1
    assert permutes_under(rewritten_module(prog), DIVERGENT) == 0


def test_other_operand_computed_in_the_branch_is_left_unchanged():
    def fn(x, w):
        g = AG(x, "i", axis=0, tiled=True)
        return jax.lax.cond(jax.lax.axis_index("i") < 4, lambda: g @ (w * 2.0),
                            lambda: jnp.zeros((64, 16)))

    prog = Program(fn, (8,), ("i",), [((64, 32), P("i")), ((32, 16), P())], P())
    counts = check(prog, rewritten=0, left=Counter({"stablehlo.all_gather": 1}))
    assert counts["stablehlo.collective_permute"] == 0
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    (site,) = overlap_hlo.remarks(text, threshold_mib=0)
    assert not site.applied and site.kind == Kind.DIVERGENT
    assert "inside a stablehlo.case branch" in site.reason


def test_one_dot_hoisted_the_other_reads_the_assembled_tensor():
    """The second dot's other operand exists only in the branch: it gets no ring but
    reads the gathered tensor that the hoisted ring assembles."""
    def fn(x, w1, w2):
        g = AG(x, "i", axis=0, tiled=True)
        return jax.lax.cond(jax.lax.axis_index("i") < 4, lambda: g @ w1 + g @ (w2 * 2.0),
                            lambda: jnp.zeros((64, 16)))

    prog = Program(fn, (8,), ("i",), [((64, 32), P("i")), ((32, 16), P()), ((32, 16), P())],
                   P())
    module = rewritten_module(prog)
    assert permutes_under(module, DIVERGENT) == 0
    check(prog, rewritten=1)
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    (site,) = overlap_hlo.remarks(text, threshold_mib=0)
    assert site.applied and "1 dot(s) left reading it: dot inside a stablehlo.case" in site.detail
    assert "the ring assembles the gathered tensor for 1 other reader(s)" in site.detail


# Hand-written modules: JAX passes closed-over values through a while's carried
# operands, but StableHLO also lets a while body read them directly.
WHILE = """
module @m attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<2x16xf32> {{mhlo.sharding = "{{manual}}"}}, %w: tensor<16x8xf32> {{mhlo.sharding = "{{manual}}"}}) -> (tensor<16x8xf32> {{mhlo.sharding = "{{manual}}"}}) {{
    %g = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, use_global_device_ids}}> : (tensor<2x16xf32>) -> tensor<16x16xf32>
    %pid = stablehlo.partition_id {{mhlo.sharding = "{{manual}}"}} : tensor<ui32>
    %id = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %three = stablehlo.constant dense<3> : tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %init = stablehlo.constant dense<0.0> : tensor<16x8xf32>
    %r:2 = stablehlo.while(%k = %zero, %acc = %init) : tensor<i32>, tensor<16x8xf32>
      cond {{
        %c = stablehlo.compare LT, %k, {bound}, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      }} do {{
        %one = stablehlo.constant dense<1> : tensor<i32>
        %k1 = stablehlo.add %k, %one : tensor<i32>
        %kf = stablehlo.convert %k1 : (tensor<i32>) -> tensor<f32>
        %kb = stablehlo.broadcast_in_dim %kf, dims = [] : (tensor<f32>) -> tensor<16x8xf32>
        %wk = stablehlo.multiply %w, %kb : tensor<16x8xf32>
        %d = stablehlo.dot_general %g, {other}, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
        %a = stablehlo.add %acc, %d : tensor<16x8xf32>
        stablehlo.return %k1, %a : tensor<i32>, tensor<16x8xf32>
      }}
    return %r#1 : tensor<16x8xf32>
  }}
}}
"""


def run_while(bound: str, other: str, applied: bool, bidirectional: bool = False):
    text = WHILE.format(bound=bound, other=other)
    module = overlap_hlo.parse(text)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, bidirectional=bidirectional)
    assert site.applied == applied, site.format()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((8, 2, 16), np.float32),
              np.repeat(rng.standard_normal((1, 16, 8), np.float32), 8, axis=0)]
    want = run_spmd_module(text, 1, 8, inputs)[0]
    got = run_spmd_module(overlap_hlo.serialize(module), 1, 8, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return site, module


@pytest.mark.parametrize("bidirectional", [False, True])
def test_device_dependent_trip_count_hoists_the_ring(bidirectional):
    site, module = run_while("%id", "%w", True, bidirectional)
    assert "hoisted out of stablehlo.while" in site.detail
    counts = op_counts(module)
    assert counts["stablehlo.all_gather"] == 0 and counts["stablehlo.while"] == 2
    # The ring's loop sits beside the device-dependent loop, not in it.
    assert permutes_under(module, ("stablehlo.while",)) > 0
    outer = [op for op in module.body.operations[0].regions[0].blocks[0].operations
             if op.operation.name == "stablehlo.while"]
    assert len(outer) == 2


def test_device_dependent_trip_count_with_a_carried_operand_is_left_unchanged():
    site, module = run_while("%id", "%wk", False)
    assert site.kind == Kind.DIVERGENT
    assert "loop whose trip count may differ between devices" in site.reason
    assert op_counts(module)["stablehlo.collective_permute"] == 0


@pytest.mark.parametrize("other", ["%w", "%wk"])
def test_constant_trip_count_keeps_the_ring_inside(other):
    site, module = run_while("%three", other, True)
    assert "hoisted" not in site.detail
    func = module.body.operations[0].regions[0].blocks[0]
    (outer,) = [op for op in func.operations if op.operation.name == "stablehlo.while"]
    assert uniform_trip_count(outer.operation)
    body_ops = [op.operation.name for op in outer.regions[1].blocks[0].operations]
    assert "stablehlo.while" in body_ops   # the ring, inside the scan-like loop


SCATTER_IN_LOOP = """
module @m attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<16x16xf32> {mhlo.sharding = "{manual}"}, %w: tensor<16x8xf32> {mhlo.sharding = "{manual}"}) -> (tensor<2x8xf32> {mhlo.sharding = "{manual}"}) {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
    %three = stablehlo.constant dense<3> : tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %init = stablehlo.constant dense<0.0> : tensor<2x8xf32>
    %r:2 = stablehlo.while(%k = %zero, %acc = %init) : tensor<i32>, tensor<2x8xf32>
      cond {
        %c = stablehlo.compare LT, %k, %three, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      } do {
        %one = stablehlo.constant dense<1> : tensor<i32>
        %k1 = stablehlo.add %k, %one : tensor<i32>
        %s = "stablehlo.reduce_scatter"(%d) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
        ^bb0(%a0: tensor<f32>, %b0: tensor<f32>):
          %t = stablehlo.add %a0, %b0 : tensor<f32>
          stablehlo.return %t : tensor<f32>
        }) : (tensor<16x8xf32>) -> tensor<2x8xf32>
        %a = stablehlo.add %acc, %s : tensor<2x8xf32>
        stablehlo.return %k1, %a : tensor<i32>, tensor<2x8xf32>
      }
    return %r#1 : tensor<2x8xf32>
  }
}
"""


def test_scatter_ring_sits_where_the_scatter_runs():
    """The reduce_scatter's ring is built at the collective itself (here inside a
    scan-like loop, its dot outside): every device that ran the scatter runs it."""
    module = overlap_hlo.parse(SCATTER_IN_LOOP)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0)
    assert site.applied, site.format()
    assert op_counts(module)["stablehlo.reduce_scatter"] == 0
    func = module.body.operations[0].regions[0].blocks[0]
    (outer,) = [op for op in func.operations if op.operation.name == "stablehlo.while"]
    assert permutes_under(module, ("stablehlo.while",)) == op_counts(module)[
        "stablehlo.collective_permute"]
    assert not any(op.operation.name == "stablehlo.collective_permute"
                   for op in func.operations)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((8, 16, 16), np.float32),
              rng.standard_normal((8, 16, 8), np.float32)]
    want = run_spmd_module(SCATTER_IN_LOOP, 1, 8, inputs)[0]
    got = run_spmd_module(overlap_hlo.serialize(module), 1, 8, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _whiles(module: ir.Module) -> list[ir.Operation]:
    return ops_named(module, "stablehlo.while")


def test_trip_count_analysis_on_jax_loops():
    def fn(x, w):
        def scan_body(c, _):
            return c + 1.0, None

        y = jax.lax.scan(scan_body, x, None, length=3)[0]
        fixed = jax.lax.fori_loop(0, 4, lambda k, acc: acc * 2.0, y)
        return jax.lax.fori_loop(0, jax.lax.axis_index("i"), lambda k, acc: acc + 1.0, fixed)

    prog = Program(fn, (8,), ("i",), [((8, 4), P("i")), ((4, 4), P())], P("i"))
    with partitioner(True):
        module = overlap_hlo.parse(prog.jitted().lower(*prog.args()).as_text())
    verdicts = [uniform_trip_count(loop) for loop in _whiles(module)]
    assert verdicts == [True, True, False]


def test_divergent_between_lists_the_regions():
    module = overlap_hlo.parse(WHILE.format(bound="%id", other="%w"))
    func = module.body.operations[0].regions[0].blocks[0]
    (loop,) = [op.operation for op in func.operations if op.operation.name == "stablehlo.while"]
    dot = [op.operation for op in loop.regions[1].blocks[0].operations
           if op.operation.name == "stablehlo.dot_general"][0]
    assert divergent_between(func, dot) == [loop]
    assert divergent_between(loop.regions[1].blocks[0], dot) == []
    pid = [op.operation for op in func.operations
           if op.operation.name == "stablehlo.convert"][0]
    assert not is_uniform(pid.results[0], set())
