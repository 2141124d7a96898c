"""Operations behind the bindings' op views."""
from __future__ import annotations

from jaxlib.mlir import ir


def as_op(owner) -> ir.Operation:
    """The operation behind an op view or an `ir.Operation` (a value's `owner`)."""
    return owner if isinstance(owner, ir.Operation) else owner.operation


def contains(op: ir.Operation, names) -> bool:
    """Whether an op named `names` (one name or a set of them) is anywhere in `op`; the
    walk stops at the first."""
    names = {names} if isinstance(names, str) else names
    found = []

    def visit(inner):
        if inner.name in names:
            found.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return bool(found)
