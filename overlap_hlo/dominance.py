"""Program-order questions within one function's nested regions."""
from __future__ import annotations

from jaxlib.mlir import ir


def _as_op(owner) -> ir.Operation:
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
    owner = _as_op(value.owner)
    at = ancestor_in(owner.block, op)
    return at is not None and at != owner and owner.is_before_in_block(at)
