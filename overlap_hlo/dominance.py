"""Program-order and execution questions within one function's nested regions.

`dominates`: is a value available at an op (structured control flow: no CFG needed).
`divergent_between`: the regions between a collective's block and an op nested in it
that the devices may not all execute the same number of times, so a ring (whose
permutes every device of a group must reach) must not be placed inside them.
"""
from __future__ import annotations

from jaxlib.mlir import ir

# Ops whose region every device that reaches the op executes exactly once.
ONCE = frozenset({"sdy.manual_computation", "sdy.named_computation"})

# Ops whose result is the same on every device when their operands are: no device
# ids, no data from arguments, no collectives (the loop-counter arithmetic of a scan).
UNIFORM_OPS = frozenset({
    "stablehlo.constant", "stablehlo.iota", "stablehlo.add", "stablehlo.subtract",
    "stablehlo.multiply", "stablehlo.divide", "stablehlo.remainder", "stablehlo.negate",
    "stablehlo.abs", "stablehlo.sign", "stablehlo.maximum", "stablehlo.minimum",
    "stablehlo.clamp", "stablehlo.compare", "stablehlo.select", "stablehlo.and",
    "stablehlo.or", "stablehlo.xor", "stablehlo.not", "stablehlo.convert",
    "stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.slice",
    "stablehlo.concatenate", "stablehlo.transpose", "stablehlo.shift_left",
    "stablehlo.shift_right_arithmetic", "stablehlo.shift_right_logical",
})


def as_op(owner) -> ir.Operation:
    """The operation behind an op view or an `ir.Operation` (a value's `owner`)."""
    return owner if isinstance(owner, ir.Operation) else owner.operation


def ancestor_in(block: ir.Block, op: ir.Operation) -> ir.Operation | None:
    """`op` or the op enclosing it that sits directly in `block`."""
    while op is not None and op.name != "builtin.module":
        if op.block == block:
            return op
        op = op.parent
    return None


def dominates(value: ir.Value, op: ir.Operation) -> bool:
    """`value` is available at `op` (structured control flow: no CFG needed)."""
    if isinstance(value, ir.BlockArgument):
        return ancestor_in(value.owner, op) is not None
    owner = as_op(value.owner)
    at = ancestor_in(owner.block, op)
    return at is not None and at != owner and owner.is_before_in_block(at)


def after(anchor: ir.Operation, op: ir.Operation) -> bool:
    """A value built just before `anchor` is available at `op`: `op` is `anchor`, is
    nested in it, or comes after it (or after an op enclosing it) in its block."""
    at = ancestor_in(anchor.block, op)
    return at is not None and (at == anchor or anchor.is_before_in_block(at))


def enclosing_ops(block: ir.Block, op: ir.Operation) -> list[ir.Operation] | None:
    """The ops enclosing `op` up to the one sitting directly in `block`, innermost
    first (empty when `op` itself sits in `block`); None if `op` is not nested in it."""
    chain = []
    while op.block != block:
        op = op.parent
        if op is None or op.name == "builtin.module":
            return None
        chain.append(op)
    return chain


def divergent_between(block: ir.Block, op: ir.Operation) -> list[ir.Operation] | None:
    """The enclosing ops between `block` and `op` (innermost first) whose regions the
    devices may not all execute equally often: if/case branches, while loops whose
    trip count is not provably the same on every device, any other region op (a
    reduction body...). None if `op` is not nested in `block`."""
    chain = enclosing_ops(block, op)
    if chain is None:
        return None
    return [e for e in chain if e.name not in ONCE
            and not (e.name == "stablehlo.while" and uniform_trip_count(e))]


def uniform_trip_count(loop: ir.Operation) -> bool:
    """The while's condition depends only on constants and on carried values that
    start from constants and are updated from constants: the trip count of a scan or
    of a fori_loop with constant bounds, the same on every device."""
    cond = loop.regions[0].blocks[0]
    terminator = as_op(list(cond.operations)[-1])
    return all(is_uniform(v, set()) for v in terminator.operands)


def is_uniform(value: ir.Value, assumed: set) -> bool:
    """`value` is the same on every device (conservative: False when unsure).

    `assumed` holds the (while, index) pairs of carried values being checked, so that
    a loop-carried cycle is accepted when everything else along it is uniform."""
    if isinstance(value, ir.BlockArgument):
        parent = value.owner.owner
        parent = as_op(parent) if parent is not None else None
        if parent is None or parent.name != "stablehlo.while":
            return False   # function and manual-computation arguments: per-device data
        key = (parent, value.arg_number)
        if key in assumed:
            return True
        assumed.add(key)
        body = parent.regions[1].blocks[0]
        update = as_op(list(body.operations)[-1]).operands[value.arg_number]
        return (is_uniform(parent.operands[value.arg_number], assumed)
                and is_uniform(update, assumed))
    owner = as_op(value.owner)
    if owner.name not in UNIFORM_OPS:
        return False
    return all(is_uniform(operand, assumed) for operand in owner.operands)
