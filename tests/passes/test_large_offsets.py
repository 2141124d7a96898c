"""Block offsets of dims whose extent exceeds int32, checked on the IR only.

Shapes this large cannot run here. The test reads the rewritten module with the typed
bindings and evaluates every dynamic_slice / dynamic_update_slice offset for every
device and every loop round, in the offset's own integer type (i32 arithmetic wraps
as on the device), and checks that each device visits each block exactly once.
"""
import numpy as np
import pytest
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

import overlap_hlo

GATHER = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<{b}x4xf32>, %w: tensor<4x8xf32>) -> tensor<{full}x8xf32> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, {attrs}}}> : (tensor<{b}x4xf32>) -> tensor<{full}x4xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{full}x4xf32>, tensor<4x8xf32>) -> tensor<{full}x8xf32>
    return %1 : tensor<{full}x8xf32>
  }}
}}"""

CONTRACTING = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<4x{b}xf32>, %w: tensor<{full}x8xf32>) -> tensor<4x8xf32> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 1 : i64, {attrs}}}> : (tensor<4x{b}xf32>) -> tensor<4x{full}xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<4x{full}xf32>, tensor<{full}x8xf32>) -> tensor<4x8xf32>
    return %1 : tensor<4x8xf32>
  }}
}}"""

SCATTER = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<{full}x4xf32>, %w: tensor<4x8xf32>) -> tensor<{b}x8xf32> {{
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{full}x4xf32>, tensor<4x8xf32>) -> tensor<{full}x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{{scatter_dimension = 0 : i64, {attrs}}}> ({{
    ^bb0(%a: tensor<f32>, %c: tensor<f32>):
      %2 = stablehlo.add %a, %c : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }}) : (tensor<{full}x8xf32>) -> tensor<{b}x8xf32>
    return %1 : tensor<{b}x8xf32>
  }}
}}"""


def attrs(n: int) -> str:
    return ("channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, "
            f"replica_groups = dense<[{list(range(n))}]> : tensor<1x{n}xi64>, "
            "use_global_device_ids")


def wrap(value: int, width: int) -> int:
    """Two's-complement wraparound to `width` bits, as the device computes."""
    half = 1 << (width - 1)
    return (value + half) % (1 << width) - half


def width_of(value: ir.Value) -> int:
    return ir.IntegerType(ir.RankedTensorType(value.type).element_type).width


def op_of(value: ir.Value) -> ir.Operation:
    owner = value.owner
    return owner if isinstance(owner, ir.Operation) else owner.operation


class Evaluator:
    """Integer scalar values of the ring's index arithmetic for one device and one
    loop counter value (the only block argument that changes across rounds)."""

    def __init__(self, device: int, k: int):
        self.device, self.k = device, k

    def __call__(self, value: ir.Value):
        if isinstance(value, ir.BlockArgument):
            loop = value.owner.owner.operation
            assert loop.name == "stablehlo.while"
            if value.arg_number == 0:
                return self.k
            return self(loop.operands[value.arg_number])   # an invariant: passed through
        op = op_of(value)
        name, args = op.name, [self(v) for v in op.operands]
        if name == "stablehlo.constant":
            return np.array(ir.DenseElementsAttr(op.attributes["value"])).astype(object)
        if name == "stablehlo.partition_id":
            return self.device
        if name == "stablehlo.dynamic_slice":   # the position table lookup
            return args[0][args[1]:args[1] + 1]
        if name == "stablehlo.reshape":
            return np.asarray(args[0]).reshape(()).item()
        if name == "stablehlo.convert":
            return int(args[0])
        ops = {"stablehlo.add": lambda a, b: a + b, "stablehlo.subtract": lambda a, b: a - b,
               "stablehlo.multiply": lambda a, b: a * b,
               "stablehlo.remainder": lambda a, b: int(np.fmod(a, b))}
        return wrap(int(ops[name](*(int(a) for a in args))), width_of(value))


def loop_range(loop: ir.Operation) -> range:
    """start, stop, step of one of the ring's counted loops."""
    start = Evaluator(0, 0)(loop.operands[0])
    compare = op_of(list(loop.regions[0].blocks[0].operations)[-1].operands[0])
    stop = Evaluator(0, 0)(compare.operands[1])
    body = loop.regions[1].blocks[0]
    increment = op_of(list(body.operations)[-1].operands[0])
    step = Evaluator(0, 0)(increment.operands[1])
    return range(int(start), int(stop), int(step))


def slices(module: ir.Module) -> list[tuple[ir.Operation, list[ir.Value], ir.Operation | None]]:
    """(op, start indices, enclosing loop) of every dynamic slice/update of data."""
    found = []

    def visit(op):
        if op.name in ("stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice"):
            first = 1 if op.name == "stablehlo.dynamic_slice" else 2
            source = op.operands[0]
            if isinstance(source, ir.OpResult) and op_of(source).name == "stablehlo.constant" \
                    and op.name == "stablehlo.dynamic_slice" and source.type.rank == 1:
                return ir.WalkResult.ADVANCE   # the position table
            loop = op.parent if op.parent.name == "stablehlo.while" else None
            found.append((op, list(op.operands)[first:], loop))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def visited_offsets(module: ir.Module, n: int, dim: int) -> list[list[int]]:
    """Per device, every offset along `dim` over all rounds, of the slices and updates
    of a tensor of the whole extent along `dim` (not of one block's buffer)."""
    per_device = [[] for _ in range(n)]
    extent = max(op.operands[0].type.shape[dim] for op, _, _ in slices(module))
    for op, starts, loop in slices(module):
        types = {str(s.type) for s in starts}
        assert len(types) == 1, f"start indices of mixed types {types}"
        if op.operands[0].type.shape[dim] != extent:
            continue
        ks = loop_range(loop) if loop is not None else [0]
        for device in range(n):
            for k in ks:
                per_device[device].append(Evaluator(device, k)(starts[dim]))
    return per_device


def rewritten(template: str, b: int, n: int, **options) -> ir.Module:
    text = template.format(b=b, n=n, full=b * n, attrs=attrs(n))
    module = overlap_hlo.parse(text)
    (site,) = overlap_hlo.rewrite_module(module, threshold_mib=0, **options)
    assert site.applied, site.format()
    return module


def index_types(module: ir.Module) -> set[str]:
    return {str(s.type) for _, starts, _ in slices(module) for s in starts}


CASES = [
    pytest.param(GATHER, 2**29, 8, 0, id="gather-2^29-rows-over-8"),
    pytest.param(GATHER, 3 * 10**9, 2, 0, id="gather-3e9-row-block"),
    pytest.param(CONTRACTING, 2**29, 8, 0, id="contracting-2^29-over-8"),
    pytest.param(SCATTER, 2**29, 8, 0, id="scatter-2^29-rows-over-8"),
    pytest.param(SCATTER, 3 * 10**9, 2, 0, id="scatter-3e9-row-block"),
]


@pytest.mark.parametrize("template, b, n, dim", CASES)
def test_huge_extents_use_i64_offsets_that_visit_every_block(template, b, n, dim):
    module = rewritten(template, b, n)
    assert index_types(module) == {"tensor<i64>"}
    for offsets in visited_offsets(module, n, dim):
        # A reduce_scatter ring's two chains take the halves of each block.
        halves = [0, b // 2] if template == SCATTER else [0]
        assert sorted(offsets) == [j * b + h for j in range(n) for h in halves]


@pytest.mark.parametrize("template", [GATHER, SCATTER])
@pytest.mark.parametrize("bidirectional, unroll", [(True, 1), (False, 2), (True, 2)])
def test_huge_extents_with_options(template, bidirectional, unroll):
    b, n = 2**29, 8
    module = rewritten(template, b, n, bidirectional=bidirectional, unroll=unroll)
    assert index_types(module) == {"tensor<i64>"}
    for offsets in visited_offsets(module, n, 0):
        assert all(0 <= off < n * b and off % b in (0, b // 2) for off in offsets)
        assert {off - off % b for off in offsets} == {j * b for j in range(n)}


def test_the_offset_constant_is_the_block_in_i64():
    b = 2**29
    module = rewritten(GATHER, b, 8)
    multipliers = []

    def visit(op):
        if op.name == "stablehlo.multiply" and op.results[0].type.rank == 0:
            for operand in op.operands:
                if isinstance(operand, ir.OpResult) and op_of(operand).name == "stablehlo.constant":
                    attr = ir.DenseIntElementsAttr(op_of(operand).attributes["value"])
                    multipliers.append((str(op.results[0].type), int(np.array(attr))))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    assert multipliers and set(multipliers) == {("tensor<i64>", b)}


def test_ordinary_extents_keep_i32():
    module = rewritten(GATHER, 16, 8)
    assert index_types(module) == {"tensor<i32>"}
    for offsets in visited_offsets(module, 8, 0):
        assert sorted(offsets) == [16 * j for j in range(8)]


@pytest.mark.parametrize("b, expected", [(2**28 - 1, "tensor<i32>"), (2**28, "tensor<i64>")])
def test_int32_boundary(b, expected):
    """Eight blocks of 2^28 - 1 rows fit int32; of 2^28, the extent is 2^31."""
    module = rewritten(GATHER, b, 8)
    assert index_types(module) == {expected}
    for offsets in visited_offsets(module, 8, 0):
        assert sorted(offsets) == [j * b for j in range(8)]
