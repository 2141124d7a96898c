"""What overlap-sequence-parallel may move onto the shard, and where values flow.

The ops that keep the rows of a gathered dim apart (elementwise ops, views, reductions
over other dims) and the rule that gives each moved op's dims; which ops' results may
differ between devices; and how a value reaches a dot or the next iteration of its
loop, through calls, if/case results and loop carries.
"""
from __future__ import annotations

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from overlap_hlo.ir import ops
from overlap_hlo.ir.dominance import callee, private_calls
from overlap_hlo.ir.lookthrough import DOTS
from overlap_hlo.ir.ops import as_op
from overlap_hlo.rewrite import builders as b

# The shared elementwise ops, and more that keep elements apart (integer and bit ops,
# complex parts, CHLO's: `jnp.square` is `chlo.square`).
ELEMENTWISE = ops.ELEMENTWISE | frozenset(f"stablehlo.{name}" for name in (
    "bitcast_convert count_leading_zeros imag popcnt real reduce_precision shift_left "
    "shift_right_arithmetic shift_right_logical").split()) | frozenset(
    f"chlo.{name}" for name in (
        "acos acosh asin asinh atan atanh conj cosh digamma erf erf_inv erfc is_inf "
        "is_neg_inf is_pos_inf lgamma next_after polygamma sinh square tan zeta").split())
SHAPE_OPS = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.transpose",
                       "stablehlo.reshape", "stablehlo.reduce"})
# Ops whose result may differ between devices that read the same operands.
DEVICE_DEPENDENT = frozenset(f"stablehlo.{name}" for name in (
    "partition_id", "replica_id", "rng", "rng_bit_generator", "collective_permute",
    "collective_broadcast", "all_to_all", "reduce_scatter", "custom_call", "infeed",
    "outfeed", "send", "recv"))
MAX_PROOF_DEPTH = 256   # deeper operand chains are not proved the same on every device


MAX_DOT_SEARCH = 64   # ops looked at for a dot after an op that stopped a move


def reaches_dot(op: ir.Operation, callers) -> bool:
    """A dot reads `op`'s results, through other ops, a loop's carry, an if/case or a
    private function that returns them (at most MAX_DOT_SEARCH ops)."""
    pending, seen = list(op.results), set()
    while pending and len(seen) < MAX_DOT_SEARCH:
        value = pending.pop()
        for use in value.uses:
            user = as_op(use.owner)
            if user.name in DOTS:
                return True
            if hash(user) in seen:
                continue
            seen.add(hash(user))
            pending.extend(passed_on(use, callers))
    return False


def passed_on(use, callers) -> list[ir.Value]:
    """The values that carry what `use` reads on: a loop's carried block argument, an
    if/case's or a private function's callers' results, a callee's argument, or the
    reader's results."""
    user = as_op(use.owner)
    if yields_to_loop(use):
        return [user.block.arguments[use.operand_number]]
    if user.name == "stablehlo.return" and user.parent is not None:
        return [as_op(user.parent).results[use.operand_number]]
    if user.name == "func.return":
        calls = private_calls(as_op(user.parent), callers) or []
        return [call.results[use.operand_number] for call in calls]
    if user.name == "func.call":
        func = callee(user)
        return [] if func is None else [func.regions[0].blocks[0].arguments[use.operand_number]]
    return list(user.results)


def carried_by_loop(value: ir.Value, callers, limit: int = 8) -> bool:
    """`value` is what a while body yields, directly or returned by the functions that
    body calls."""
    pending = [value]
    while pending and limit > 0:
        limit -= 1
        for use in pending.pop().uses:
            if yields_to_loop(use):
                return True
            if as_op(use.owner).name == "func.return":
                pending.extend(passed_on(use, callers))
    return False


def yields_to_loop(use) -> bool:
    """`use` is a while body's return of the value the loop carries next."""
    user = as_op(use.owner)
    parent = user.parent
    return (user.name == "stablehlo.return" and parent is not None
            and parent.name == "stablehlo.while"
            and user.block == as_op(parent).regions[1].blocks[0])


def groups_key(collective: ir.Operation) -> tuple:
    """Equal for collectives over the same groups of the same kind of ids."""
    attrs = collective.attributes
    return (hash(attrs["replica_groups"]), "use_global_device_ids" in attrs,
            "channel_handle" in attrs)


def row_rule(op: ir.Operation, dims: list[int | None]
              ) -> tuple[list[int], list[int | None]] | None:
    """(each result's gathered dim, each operand's slice dim) when `op` keeps the rows of
    the gathered dim apart, else None. `dims`: each operand's gathered dim or None."""
    name = op.name
    known = {d for d in dims if d is not None}
    if len(known) != 1:
        return None
    dim = known.pop()
    shapes = [v.type for v in op.operands] + [r.type for r in op.results]
    if not all(isinstance(t, ir.RankedTensorType) and t.has_static_shape for t in shapes):
        return None
    if name in ELEMENTWISE or name == "sdy.sharding_constraint":
        shape = op.results[0].type.shape
        if any(list(v.type.shape) != list(shape) for v in op.operands):
            return None
        if name == "sdy.sharding_constraint" and shards_dim(op, dim):
            return None
        return [dim] * len(op.results), [None if d is not None else dim for d in dims]
    if name == "stablehlo.broadcast_in_dim":
        mapped = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        return [mapped[dim]], [None]
    if name == "stablehlo.transpose":
        permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        return [permutation.index(dim)], [None]
    if name == "stablehlo.reshape":
        before, after = op.operands[0].type.shape, op.results[0].type.shape
        prefix = int(np.prod(before[:dim], dtype=object))
        for out in range(len(after)):
            if int(np.prod(after[:out], dtype=object)) == prefix and after[out] == before[dim]:
                return [out], [None]
        return None
    if name == "stablehlo.reduce":
        half = len(op.operands) // 2
        if any(d != dim for d in dims[:half]) or any(d is not None for d in dims[half:]):
            return None
        reduced = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        if dim in reduced:
            return None
        out = dim - sum(1 for r in reduced if r < dim)
        return [out] * len(op.results), [None] * len(op.operands)
    return None


def function_of(block: ir.Block) -> ir.Operation | None:
    """The func.func whose body is `block`, if it is one."""
    parent = block.owner
    if parent is None or as_op(parent).name != "func.func":
        return None
    return as_op(parent)


def loop_of(block: ir.Block) -> ir.Operation | None:
    """The stablehlo.while whose region holds `block`, if it is one."""
    parent = block.owner
    if parent is None or as_op(parent).name != "stablehlo.while":
        return None
    return as_op(parent)


def shards_dim(op: ir.Operation, dim: int) -> bool:
    sharding = sdy.TensorShardingAttr(op.attributes["sharding"])
    dims = list(sharding.dimension_shardings)
    return dim < len(dims) and len(sdy.DimensionShardingAttr(dims[dim]).axes) > 0


def rows_of(value: ir.Value, dim: int, parts: int, position: ir.Value) -> ir.Value:
    """This device's rows of `value` (the same on every device of the group) along
    `dim`: a smaller broadcast of the source's rows when `value` is a broadcast (the
    whole one is never built), else a dynamic_slice."""
    vtype = value.type
    rows = vtype.shape[dim] // parts
    source, dims = ops.broadcast_source(value)
    offset = None
    if dims is None or ops.varies_along(source, dims, dim):
        offset = b.block_offset(position, 0, parts, rows)
    if dims is not None:
        return b.broadcast_rows(source, dims, b.with_dim(vtype, dim, rows), dim, offset)
    return b.slice_dim(value, dim, offset, rows)
