"""Operations behind the bindings' op views."""
from __future__ import annotations

from jaxlib.mlir import ir


def as_op(owner) -> ir.Operation:
    """The operation behind an op view or an `ir.Operation` (a value's `owner`)."""
    return owner if isinstance(owner, ir.Operation) else owner.operation
