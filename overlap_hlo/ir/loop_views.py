"""Views of a larger buffer, rebuilt inside the loop that reads them.

A scanned layer's weight is a slice of the stacked weights (`dynamic_slice` and
`reshape`, often in a `func.call` JAX makes of `dynamic_index_in_dim`). A dot reading it
fuses the slice; a `stablehlo.while` given it as an operand makes the compiler
materialize it first (a copy of the whole weight per layer). `sunk_views` says what to
pass into a loop instead: the buffer and its indices, with the ops that rebuild the view
inside the body, where the slice fuses again into each dot that reads it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo.ir.dominance import callee
from overlap_hlo.ir.ops import as_op

VIEW_OPS = frozenset({"stablehlo.dynamic_slice", "stablehlo.slice", "stablehlo.reshape"})
# Scalar arithmetic on an index (JAX wraps negative indices) and constants.
INDEX_OPS = frozenset({"stablehlo.constant", "stablehlo.add", "stablehlo.subtract",
                       "stablehlo.compare", "stablehlo.select", "stablehlo.convert"})
MAX_OPS = 16


@dataclass(frozen=True)
class SunkView:
    """`ops` (program order) compute the view from `leaves`, values defined outside."""

    view: ir.Value
    ops: tuple[ir.Operation, ...]
    leaves: tuple[ir.Value, ...]

    def rebuild(self, leaves: list[ir.Value]) -> ir.Value:
        """The view computed again at the insertion point from `leaves` (the loop's
        copies of self.leaves)."""
        mapped = dict(zip(self.leaves, leaves))
        for op in self.ops:
            copy = op.clone()
            for i, operand in enumerate(op.operands):
                if operand in mapped:
                    copy.operands[i] = mapped[operand]
            mapped.update(zip(op.results, copy.results))
        return mapped[self.view]


def _pure_views(func: ir.Operation) -> bool:
    body = func.regions[0].blocks[0]
    return all(op.name in VIEW_OPS | INDEX_OPS | {"func.return"} for op in body.operations)


def sunk_view(value: ir.Value) -> SunkView | None:
    """`value` as views of a larger buffer, or None when it is not one (or reads no
    larger buffer, or only a constant: nothing to gain)."""
    ops: list[ir.Operation] = []
    leaves: list[ir.Value] = []
    seen: set = set()

    def visit(v: ir.Value, top: bool) -> bool:
        if v in seen:
            return True
        seen.add(v)
        owner = as_op(v.owner) if isinstance(v, ir.OpResult) else None
        if owner is None or not _is_view(owner, top, v):
            if top:
                return False
            leaves.append(v)
            return True
        if len(ops) >= MAX_OPS or not all(visit(o, False) for o in owner.operands):
            return False
        ops.append(owner)
        return True

    if not visit(value, True) or not ops:
        return None
    source = max(leaves, key=_elements)
    if _elements(source) <= _elements(value) or _is_constant(source):
        return None   # nothing copied, or a table the compiler holds anyway
    return SunkView(value, tuple(ops), tuple(leaves))


def _is_view(op: ir.Operation, top: bool, value: ir.Value) -> bool:
    if op.name in VIEW_OPS:
        return True
    if op.name in INDEX_OPS:
        return not top and ir.RankedTensorType(value.type).rank == 0
    if op.name == "func.call":
        func = callee(op)
        return func is not None and len(op.results) == 1 and _pure_views(func)
    return False


def _is_constant(value: ir.Value) -> bool:
    return isinstance(value, ir.OpResult) and as_op(value.owner).name == "stablehlo.constant"


def _elements(value: ir.Value) -> int:
    t = ir.RankedTensorType(value.type)
    return math.prod(t.shape) if t.has_static_shape else 0
