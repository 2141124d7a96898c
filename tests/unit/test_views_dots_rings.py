"""Unit tests of the IR helpers and replica groups the passes build on: views through
reshapes and transposes (lookthrough), dot dimensions (dots), rings read from a
collective's groups (collectives) and the scan of one module. No pass runs."""
import pytest
from jaxlib.mlir import ir

import overlap_hlo
from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import DotDims, flops, tensor_bytes, traffic
from overlap_hlo.ir.lookthrough import (producer, returned_by_program, users_through_views,
                                        view_forward)
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.rewrite.scan import ModuleScan

# An all_gather of dim 0 seen through a transpose and a reshape that merges dims, and
# a dot whose sum is scattered behind a transpose.
VIEWS = """module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @main(%x: tensor<2x3x8xf32>, %w: tensor<8x16xf32>, %v: tensor<24x5xf32>) -> (tensor<3x4x16xf32>, tensor<8x5xf32>, tensor<4x5xf32>) {
    %g = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 2, 1, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x3x8xf32>) -> tensor<8x3x8xf32>
    %t = stablehlo.transpose %g, dims = [1, 0, 2] : (tensor<8x3x8xf32>) -> tensor<3x8x8xf32>
    %r = stablehlo.reshape %g : (tensor<8x3x8xf32>) -> tensor<24x8xf32>
    %d = stablehlo.dot_general %r, %w, contracting_dims = [1] x [0] : (tensor<24x8xf32>, tensor<8x16xf32>) -> tensor<24x16xf32>
    %e = stablehlo.dot_general %v, %r, contracting_dims = [0] x [0] : (tensor<24x5xf32>, tensor<24x8xf32>) -> tensor<5x8xf32>
    %et = stablehlo.transpose %e, dims = [1, 0] : (tensor<5x8xf32>) -> tensor<8x5xf32>
    %s = "stablehlo.reduce_scatter"(%et) <{channel_handle = #stablehlo.channel_handle<handle = 7, type = 1>, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %sum = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %sum : tensor<f32>
    }) : (tensor<8x5xf32>) -> tensor<4x5xf32>
    %u = stablehlo.reshape %t : (tensor<3x8x8xf32>) -> tensor<3x4x16xf32>
    return %u, %et, %s : tensor<3x4x16xf32>, tensor<8x5xf32>, tensor<4x5xf32>
  }
}
"""


@pytest.fixture
def ops():
    module = overlap_hlo.parse(VIEWS)
    body = module.body.operations[0].regions[0].blocks[0]
    ops = [op.operation for op in body.operations][:-1]   # in order, without the return
    yield module, dict(zip(["%g", "%t", "%r", "%d", "%e", "%et", "%s", "%u"], ops))


def test_views_follow_the_gathered_dim(ops):
    _, op = ops
    gathered = op["%g"].results[0]
    uses, values = users_through_views(gathered, 0)
    dots = [use for use in uses if use.user.name == "stablehlo.dot_general"]
    assert {hash(use.user) for use in dots} == {hash(op["%d"]), hash(op["%e"])}
    # through the reshape (8x3 rows merged into 24: a block of 2 rows is 6 rows there)
    assert all([v.op for v in use.views] == [op["%r"]] and use.dim == 0 and use.factor == 3
               for use in dots)
    # the transpose moves dim 0 to dim 1; the reshape after it splits that dim: not a view
    transposed = view_forward(op["%t"], 0, 0)
    assert (transposed.dim_in, transposed.dim_out) == (0, 1)
    assert view_forward(op["%u"], 0, 1) is None
    assert [use.user for use in uses if use.user.name == "stablehlo.reshape"] == [op["%u"]]
    assert values[0] == gathered and op["%t"].results[0] in values


def test_producer_looks_back_through_single_use_views(ops):
    _, op = ops
    top, views, dim = producer(op["%s"].operands[0], 0)
    # %et has two users (the scatter and the return): the chain stops at it
    assert top == op["%et"] and views == [] and dim == 0
    top, views, dim = producer(op["%et"].results[0], 0)
    assert top == op["%et"]


def test_dot_dims_classify_and_trace_result_dims(ops):
    _, op = ops
    dims = DotDims.of(op["%e"])   # [24x5] x [24x8] contracting dim 0 of both
    assert dims.classify(0, 0) == ("contracting", None, 0)
    assert dims.classify(0, 1) == ("free", 0, None)
    assert dims.classify(1, 1) == ("free", 1, None)
    assert dims.result_source(0) == [(0, 1)] and dims.result_source(1) == [(1, 1)]
    assert flops(op["%e"]) == 2 * 5 * 8 * 24
    f32 = ir.RankedTensorType(op["%e"].results[0].type)
    assert tensor_bytes(f32) == 5 * 8 * 4
    whole, sliced = traffic(op["%e"], {1})
    assert whole == 24 * 5 * 4 and sliced == 24 * 8 * 4 + 5 * 8 * 4


def test_rings_read_from_groups(ops):
    module, op = ops
    with module.context:
        scan = ModuleScan(module.operation, "stablehlo.all_gather")
        gather = Ring.from_collective(op["%g"], scan)
        scatter = Ring.from_collective(op["%s"], scan)
    assert scan.last_channel == 7 and scan.numbers == {hash(op["%g"]): 0}
    assert (gather.kind, gather.size, gather.num_ids) == ("partition", 4, 4)
    assert gather.spans_all_devices and not scatter.spans_all_devices
    # position q sends to q - 1 in the group's order 0 2 1 3
    assert gather.shift_pairs(+1) == [(0, 3), (2, 0), (1, 2), (3, 1)]
    assert gather.shift_pairs(-1) == [(0, 2), (2, 1), (1, 3), (3, 0)]
    assert gather.position_table() == [0, 2, 1, 3]
    assert scatter.groups == ((0, 1), (2, 3)) and scatter.size == 2
    assert scatter.shift_pairs() == [(0, 1), (1, 0), (2, 3), (3, 2)]


def test_groups_that_do_not_partition_the_devices_are_unsupported():
    text = VIEWS.replace("dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>",
                         "dense<[[0, 1]]> : tensor<1x2xi64>")
    module = overlap_hlo.parse(text)
    body = module.body.operations[0].regions[0].blocks[0]
    scatter = next(op.operation for op in body.operations
                   if op.operation.name == "stablehlo.reduce_scatter")
    with module.context, pytest.raises(Unsupported):
        Ring.from_collective(scatter, ModuleScan(module.operation))


# Values returned by the program: through GSPMD's sharding calls, a Shardy region's
# result; not after an add, nor from a private function.
OUTPUTS = """module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func @main(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<32xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
    %0 = stablehlo.custom_call @Sharding(%a) {mhlo.sharding = "{manual}"} : (tensor<8xf32>) -> tensor<8xf32>
    %1 = stablehlo.custom_call @SPMDShardToFullShape(%0) {mhlo.sharding = "{devices=[4]<=[4]}"} : (tensor<8xf32>) -> tensor<32xf32>
    %2 = sdy.manual_computation(%b) in_shardings=[<@mesh, [{"x"}]>] out_shardings=[<@mesh, [{"x"}]>] manual_axes={"x"} (%c: tensor<2xf32>) {
      %r = stablehlo.reshape %c : (tensor<2xf32>) -> tensor<2xf32>
      sdy.return %r : tensor<2xf32>
    } : (tensor<8xf32>) -> tensor<8xf32>
    %3 = stablehlo.add %b, %b : tensor<8xf32>
    %4 = func.call @inner(%b) : (tensor<8xf32>) -> tensor<8xf32>
    return %1, %2, %3, %4 : tensor<32xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
  func.func private @inner(%x: tensor<8xf32>) -> tensor<8xf32> {
    return %x : tensor<8xf32>
  }
}
"""


def test_values_returned_by_the_program():
    module = overlap_hlo.parse(OUTPUTS)
    main = module.body.operations[1].regions[0].blocks[0]
    a, b = main.arguments
    region = [op for op in main.operations if op.name == "sdy.manual_computation"][0]
    inner_arg = module.body.operations[2].regions[0].blocks[0].arguments[0]
    assert returned_by_program(a)                 # through @Sharding, @SPMDShardToFullShape
    assert returned_by_program(region.regions[0].blocks[0].arguments[0])  # sdy.return
    assert not returned_by_program(b)             # read by the region, an add and a call
    assert not returned_by_program(inner_arg)     # returned by a private function
