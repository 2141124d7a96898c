"""Terse builders for the StableHLO ops the passes emit.

All builders create ops at the current insertion point and location
(`with rewriter.ip, op.location:`), like JAX's own `mlir.py` helpers.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy, stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.groups.manual import manual_axes_attr
from overlap_hlo.ir import loop_views
from overlap_hlo.ir.ops import ALLOCATE, varies_along

if TYPE_CHECKING:
    from overlap_hlo.plan.ring_plan import RingPlan

I32 = np.int32
INT32_MAX = 2**31 - 1


def i32_type() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def i64_type() -> ir.Type:
    return ir.IntegerType.get_signless(64)


_scalars: dict | None = None   # (block, value) -> constant, while a site is rewritten


@contextlib.contextmanager
def shared_scalars():
    """Reuse `tensor<i32>` constants within each block while one site is rewritten.

    Valid because a site's ops are inserted in program order: a constant created
    earlier in a block precedes every later insertion in it."""
    global _scalars
    outer, _scalars = _scalars, {}
    try:
        yield
    finally:
        _scalars = outer


def saved_scalars() -> dict | None:
    """A copy of the shared constants (`restore_scalars` puts it back)."""
    return None if _scalars is None else dict(_scalars)


def restore_scalars(saved: dict | None) -> None:
    if _scalars is not None and saved is not None:
        _scalars.clear()
        _scalars.update(saved)


def scalar_i32(value: int) -> ir.Value:
    """A `tensor<i32>` constant."""
    return scalar(value, np.int32)


def scalar(value: int, dtype=np.int32) -> ir.Value:
    """A scalar integer constant of `dtype` (np.int32 or np.int64)."""
    if _scalars is None:
        return constant_array(np.array(value, dtype=dtype))
    key = (ir.InsertionPoint.current.block, value, dtype)   # np.int32 or np.int64
    if key not in _scalars:
        _scalars[key] = constant_array(np.array(value, dtype=dtype))
    return _scalars[key]


def index_dtype(extent: int):
    """The index type for offsets into a dim of `extent` elements: int32 unless an
    offset could overflow it."""
    return np.int32 if extent <= INT32_MAX else np.int64


def zero_like(index: ir.Value) -> ir.Value:
    """A zero of `index`'s scalar integer type."""
    width = ir.IntegerType(ir.RankedTensorType(index.type).element_type).width
    return scalar(0, np.int64 if width == 64 else np.int32)


def constant_array(array: np.ndarray) -> ir.Value:
    attr = ir.DenseElementsAttr.get(np.array(array, order="C"))
    return ir.Operation.create("stablehlo.constant", results=[attr.type],
                               attributes={"value": attr}).result


def zeros(tensor_type: ir.RankedTensorType) -> ir.Value:
    """A splat zero of any int or float tensor type."""
    elt = tensor_type.element_type
    zero = (ir.FloatAttr.get(elt, 0.0) if isinstance(elt, ir.FloatType)
            else ir.IntegerAttr.get(elt, 0))
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(tensor_type, zero))


def buffer(tensor_type: ir.RankedTensorType, allocate: bool = False) -> ir.Value:
    """A tensor a ring overwrites whole: with `allocate` (TargetForm.allocates: TPU and
    GPU) uninitialised (`custom_call @AllocateBuffer`, what `jax.lax.empty` lowers to
    there), else zeros (the CPU backend has no such call)."""
    if not allocate:
        return zeros(tensor_type)
    return stablehlo.CustomCallOp([tensor_type], [], call_target_name=ALLOCATE,
                                  has_side_effect=False).result


def equal(a: ir.Value, b: ir.Value) -> ir.Value:
    """`a == b` for two scalar integers: a `tensor<i1>`."""
    return stablehlo.compare(a, b, stablehlo.ComparisonDirectionAttr.get("EQ"))


def split_weight(pred: ir.Value, first: ir.Value, second: ir.Value) -> list[ir.Value]:
    """`[first, second]`, weighted where the scalar `pred` holds (then the two slices are
    one block) so that two products of one block with them sum to exactly one: each
    float element halved where that is exact (at least twice the smallest normal
    number of its type; inf and NaN stay what they were), else kept whole in the
    first and zeroed in the second; integers `(1, 0)`."""
    elt = first.type.element_type
    if not isinstance(elt, ir.FloatType):
        return [first, stablehlo.select(pred, zeros(second.type), second)]
    halves = mul(first, splat(first.type, 0.5))
    normal = smallest_normal(elt)
    if normal is None:   # a type numpy does not know: halve only inf and NaN
        exact = stablehlo.not_(stablehlo.is_finite(first))
    else:
        exact = stablehlo.compare(stablehlo.abs(first), splat(first.type, 2 * normal),
                                  stablehlo.ComparisonDirectionAttr.get("GE"))
    return [stablehlo.select(pred, stablehlo.select(exact, halves, first), first),
            stablehlo.select(pred, stablehlo.select(exact, halves, zeros(second.type)),
                             second)]


def splat(tensor_type: ir.RankedTensorType, value: float) -> ir.Value:
    """A float constant of `tensor_type` holding `value` everywhere."""
    return stablehlo.constant(ir.DenseElementsAttr.get_splat(
        tensor_type, ir.FloatAttr.get(tensor_type.element_type, value)))


def smallest_normal(float_type: ir.Type) -> float | None:
    """The smallest positive normal number of an MLIR float type (f16, bf16,
    f8E4M3FN, ...), or None for a type ml_dtypes does not name."""
    import ml_dtypes

    name = str(float_type)
    names = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
             "tf32": "float32"}
    numpy_name = names.get(name) or ("float" + name[1] + "_" + name[2:].lower()
                                     if name[:2] in ("f4", "f6", "f8") else None)
    try:
        return float(ml_dtypes.finfo(numpy_name).smallest_normal)
    except (TypeError, ValueError):
        return None


def with_dim(tensor_type: ir.RankedTensorType, dim: int, size: int) -> ir.RankedTensorType:
    shape = list(tensor_type.shape)
    shape[dim] = size
    return ir.RankedTensorType.get(shape, tensor_type.element_type)


# The elementwise ops sites build most, made directly (a third of the generated
# builders' time: sites build tens of them each).
def _elementwise(name: str, a: ir.Value, b: ir.Value) -> ir.Value:
    return ir.Operation.create(name, results=[a.type], operands=[a, b]).result


def add(a: ir.Value, b: ir.Value) -> ir.Value:
    return _elementwise("stablehlo.add", a, b)


def mul(a: ir.Value, b: ir.Value) -> ir.Value:
    return _elementwise("stablehlo.multiply", a, b)


def rem(a: ir.Value, b: ir.Value) -> ir.Value:
    return _elementwise("stablehlo.remainder", a, b)


def block_offset(position: ir.Value, step: ir.Value | int, group_size: int,
                 block: int, sign: int = 1, extra: int = 0) -> ir.Value:
    """`((position + sign * step + extra) mod group_size) * block`, or, for a ring in
    physical order (`position` is then the device's visit row, see `ring_position`),
    `position[(sign * step + extra) mod group_size] * block`.

    `step` is a loop value in [0, group_size] or a Python int; the index is kept
    non-negative before the remainder. The block index is a `tensor<i32>`; the offset
    is one too unless the dim's extent (group_size * block) exceeds int32, then a
    `tensor<i64>` (the index converted before the multiply)."""
    visits = None
    if ir.RankedTensorType(position.type).rank == 1:
        visits, position = position, scalar_i32(0)
    if isinstance(step, int):
        index, shift = position, (sign * step + extra) % group_size
    elif sign > 0:
        index, shift = add(position, step), extra % group_size
    else:
        index = stablehlo.subtract(add(position, scalar_i32(group_size)), step)
        shift = extra % group_size
    if shift:
        index = add(index, scalar_i32(shift))
    index = rem(index, scalar_i32(group_size))
    if visits is not None:
        index = stablehlo.reshape(ir.RankedTensorType.get([], i32_type()), stablehlo.dynamic_slice(
            visits, [index], [1], results=[ir.RankedTensorType.get([1], i32_type())]))
    dtype = index_dtype(group_size * block)
    if dtype is np.int64:
        index = stablehlo.convert(ir.RankedTensorType.get([], i64_type()), index)
    return mul(index, scalar(block, dtype))


def plus_rows(offset: ir.Value, rows: int) -> ir.Value:
    """`offset + rows` for a scalar offset of either index type."""
    return offset if rows == 0 else add(offset, scalar(rows, np.int64 if ir.IntegerType(
        ir.RankedTensorType(offset.type).element_type).width == 64 else np.int32))


def plus(step: ir.Value | int, offset: int) -> ir.Value | int:
    """`step + offset` for a loop value or a Python int."""
    if isinstance(step, int) or offset == 0:
        return step + offset if isinstance(step, int) else step
    return add(step, scalar_i32(offset))


def concat(values: Sequence[ir.Value], dim: int) -> ir.Value:
    if len(values) == 1:
        return values[0]
    first = values[0].type
    size = sum(v.type.shape[dim] for v in values)
    return stablehlo.concatenate(list(values), dim, results=[with_dim(first, dim, size)])


def static_slice(value: ir.Value, dim: int, start: int, size: int) -> ir.Value:
    vtype = value.type
    if size == vtype.shape[dim]:
        return value
    starts = [start if d == dim else 0 for d in range(vtype.rank)]
    limits = [start + size if d == dim else n for d, n in enumerate(vtype.shape)]
    return stablehlo.slice(value, starts, limits, [1] * vtype.rank,
                           results=[with_dim(vtype, dim, size)])


def slice_dim(value: ir.Value, dim: int, offset: ir.Value, size: int) -> ir.Value:
    """`dynamic_slice` of `size` elements along `dim` starting at `offset`."""
    vtype = value.type
    starts = [offset if d == dim else zero_like(offset) for d in range(vtype.rank)]
    return stablehlo.dynamic_slice(value, starts, with_dim(vtype, dim, size).shape,
                                   results=[with_dim(vtype, dim, size)])


def broadcast_rows(source: ir.Value, dims: Sequence[int], block_type: ir.RankedTensorType,
                   dim: int, offset: ir.Value) -> ir.Value:
    """Rows of `broadcast_in_dim(source, dims)` along `dim`, starting at `offset`, as
    `block_type`: the source broadcast to the block, sliced first along the source dim
    that `dim` comes from unless that is 1 wide (the whole broadcast is never built)."""
    dims = list(dims)
    if varies_along(source, dims, dim):
        source = slice_dim(source, dims.index(dim), offset, block_type.shape[dim])
    return stablehlo.broadcast_in_dim(
        ir.RankedTensorType.get(block_type.shape, source.type.element_type), source, dims)


def update_dim(target: ir.Value, update: ir.Value, dim: int, offset: ir.Value) -> ir.Value:
    """`dynamic_update_slice` of `update` into `target` at `offset` along `dim`."""
    starts = [offset if d == dim else zero_like(offset) for d in range(target.type.rank)]
    return stablehlo.dynamic_update_slice(target, update, starts)


def table_lookup(table: Sequence[int], index: ir.Value) -> ir.Value:
    """`table[index]` as a `tensor<i32>`, for a constant table and a scalar index."""
    entry = stablehlo.dynamic_slice(
        constant_array(np.asarray(table, dtype=I32)), [index], [1],
        results=[ir.RankedTensorType.get([1], i32_type())])
    return stablehlo.reshape(ir.RankedTensorType.get([], i32_type()), entry)


def device_id(kind: str) -> ir.Value:
    """This device's `partition_id` or `replica_id`, as a `tensor<i32>`."""
    op = stablehlo.partition_id if kind == "partition" else stablehlo.replica_id
    return stablehlo.convert(ir.RankedTensorType.get([], i32_type()), op())


def ring_position(ring: Ring) -> ir.Value:
    """This device's position in its group (a table lookup of its id), or, for a ring
    in physical order, its visit row: the blocks it holds after 0..N-1 shifts (a
    `tensor<N x i32>`, see `Ring.visit_table`). The position is computed in a nested
    sdy.manual_computation over the automatic axes when the site sits in a partially
    manual region (as JAX's axis_index does)."""
    kind, auto = ring.kind, ring.auto
    if ring.orders is not None:   # never with automatic axes (Ring.in_physical_order)
        return table_row(ring.visit_table(), device_id(kind), ring.size)
    table = ring.position_table()
    if auto is None:
        return table_lookup(table, device_id(kind))
    scalar = ir.RankedTensorType.get([], i32_type())
    region = sdy.ManualComputationOp(
        [scalar], [], sdy.TensorShardingPerValueAttr.get([]),
        sdy.TensorShardingPerValueAttr.get([sdy.TensorShardingAttr.get(auto.mesh, [])]),
        manual_axes_attr(auto.axes))
    with ir.InsertionPoint(region.body.blocks.append()):
        sdy.ReturnOp([table_lookup(table, device_id(kind))])
    return region.results[0]


def table_row(table: Sequence[int], index: ir.Value, width: int) -> ir.Value:
    """Entries index*width .. index*width+width-1 of a constant table, a
    `tensor<width x i32>`."""
    start = mul(index, scalar_i32(width))
    return stablehlo.dynamic_slice(
        constant_array(np.asarray(table, dtype=I32)), [start], [width],
        results=[ir.RankedTensorType.get([width], i32_type())])


def collective_permute(value: ir.Value, pairs: Sequence[tuple[int, int]],
                       channel: int | None) -> ir.Value:
    """A permute along `pairs`; a channel handle makes the ids partition ids."""
    pairs_attr = ir.DenseIntElementsAttr.get(np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
    handle = None if channel is None else stablehlo.ChannelHandle.get(channel, 1)
    return stablehlo.collective_permute(value, pairs_attr, channel_handle=handle)


def _like(collective: ir.Operation, scan) -> dict:
    """`collective`'s groups and kind of ids, and a fresh channel (from `scan`, the
    ModuleScan) when it has one: the keywords of a new collective over its groups."""
    attrs = collective.attributes
    handle = None
    if "channel_handle" in attrs:
        kind = stablehlo.ChannelHandle(attrs["channel_handle"]).channel_type
        handle = stablehlo.ChannelHandle.get(scan.new_channel(), kind)
    return dict(replica_groups=attrs["replica_groups"], channel_handle=handle,
                use_global_device_ids="use_global_device_ids" in attrs or None)


def all_gather_like(collective: ir.Operation, value: ir.Value, dim: int,
                    result_type: ir.Type, scan) -> ir.Value:
    """An all_gather of `value` along `dim` over `collective`'s groups (`_like`)."""
    return stablehlo.AllGatherOp([result_type], [value], dim,
                                 **_like(collective, scan)).results[0]


def reduce_scatter_like(collective: ir.Operation, value: ir.Value, dim: int,
                        result_type: ir.Type, scan) -> ir.Value:
    """A reduce_scatter (add) of `value` along `dim` over `collective`'s groups
    (`_like`)."""
    op = stablehlo.ReduceScatterOp(result_type, value, dim, **_like(collective, scan))
    scalar = ir.RankedTensorType.get([], result_type.element_type)
    body = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        stablehlo.ReturnOp([stablehlo.AddOp(*body.arguments).result])
    return op.result


def barrier(values: Sequence[ir.Value]) -> list[ir.Value]:
    """`values` through one `optimization_barrier`: the compiler cannot fuse what
    produces them with what reads them."""
    if not values:
        return []
    op = stablehlo.OptimizationBarrierOp(list(values))
    return list(op.results)


def dot_like(original: ir.Operation, lhs: ir.Value, rhs: ir.Value,
             result_type: ir.Type) -> ir.Value:
    """A `dot_general` with all of `original`'s attributes on new operands."""
    attrs = {name: original.attributes[name] for name in original.attributes}
    return ir.Operation.create(
        "stablehlo.dot_general", results=[result_type], operands=[lhs, rhs],
        attributes=attrs).result


LoopBody = Callable[[ir.Value, list[ir.Value], list[ir.Value]], list[ir.Value]]


def counted_loop(start: int, stop: int, carried: Sequence[ir.Value],
                 invariants: Sequence[ir.Value], body: LoopBody,
                 step: int = 1, views_in_loop: bool = False) -> list[ir.Value]:
    """`for k in range(start, stop, step)` as a `stablehlo.while`.

    `body(k, carried, invariants)` returns the next carried values. Every value the
    body reads is passed explicitly (no implicit captures). With `views_in_loop`, an
    invariant that is a view of a larger buffer (loop_views) is passed as that buffer
    and rebuilt in the body. Returns the final carried values.
    """
    carried, invariants = list(carried), list(invariants)
    views = [loop_views.sunk_view(v) if views_in_loop else None for v in invariants]
    passed = list(dict.fromkeys(value for v, view in zip(invariants, views)
                                for value in (view.leaves if view else (v,))))
    operands = [scalar_i32(start), *carried, *passed]
    types = [v.type for v in operands]
    loop = stablehlo.WhileOp(types, operands)
    cond = loop.cond.blocks.append(*types)
    with ir.InsertionPoint(cond):
        limit = scalar_i32(stop)
        stablehlo.return_([stablehlo.compare(
            cond.arguments[0], limit, stablehlo.ComparisonDirectionAttr.get("LT"),
            compare_type=stablehlo.ComparisonTypeAttr.get("SIGNED"))])
    block = loop.body.blocks.append(*types)
    with ir.InsertionPoint(block):
        args = list(block.arguments)
        k, n = args[0], len(carried)
        inside = dict(zip(passed, args[1 + n:]))
        # The views' scalar operands (a layer's index) pass a barrier with k: else the
        # compiler hoists the invariant slice out of the loop and copies it again.
        scalars = [v for v in passed if _scalar(v) and any(
            view and v in view.leaves for view in views)]
        if scalars:
            inside.update(zip(scalars, barrier([k, *(inside[v] for v in scalars)])[1:]))
        step_out = body(k, args[1:1 + n], [
            view.rebuild([inside[leaf] for leaf in view.leaves]) if view else inside[v]
            for v, view in zip(invariants, views)])
        stablehlo.return_([add(k, scalar_i32(step)), *step_out, *args[1 + n:]])
    return list(loop.results[1:1 + len(carried)])


def _scalar(value: ir.Value) -> bool:
    return ir.RankedTensorType(value.type).rank == 0


RoundBody = Callable[[ir.Value | int, list, list[ir.Value]], list]


def planned_rounds(plan: RingPlan, carried: Sequence, invariants: Sequence[ir.Value],
                   body: RoundBody) -> list:
    """The rounds of `plan`: those before its loop inline, the loop (`plan.unroll`
    rounds per iteration, `plan.trip_count` iterations), then the remainder and the
    last rounds inline. `body(k, carried, invariants)` gets k as a loop value or an
    int; outside the loop `carried` may hold None (a value that does not exist yet),
    never where the loop starts."""
    carried = list(carried)
    for k in plan.rounds_before_loop:
        carried = body(k, carried, list(invariants))
    if plan.trip_count:
        if any(value is None for value in carried):
            raise ValueError(f"the loop of {plan} would carry a value that does not exist")

        def unrolled(k, values, loop_invariants):
            for j in range(plan.unroll):
                values = body(plus(k, j), values, loop_invariants)
            return values

        carried = counted_loop(plan.loop_start, plan.loop_end, carried, invariants,
                               unrolled, step=plan.unroll, views_in_loop=plan.views_in_loop)
    for k in plan.rounds_after_loop:
        carried = body(k, carried, list(invariants))
    return carried
