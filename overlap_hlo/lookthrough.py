"""Ops the passes see through between a collective and its dot.

A *view* op changes how a tensor is laid out or typed but keeps each gathered or
scattered block a block: `stablehlo.transpose` (the dim moves), `stablehlo.convert`
(the element type changes) and `sdy.sharding_constraint` (a propagation hint: no
change at all; JAX puts one after every op of a partially manual shard_map body).
The passes replay the views on each step's block inside the loop, so the data on the
wire keeps the collective's type and layout.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jaxlib.mlir import ir

TRANSPARENT = frozenset({"sdy.sharding_constraint"})
VIEWS = TRANSPARENT | {"stablehlo.transpose", "stablehlo.convert"}


def _op(owner) -> ir.Operation:
    return owner if isinstance(owner, ir.Operation) else owner.operation


def _permutation(op: ir.Operation) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))


def dim_after(op: ir.Operation, dim: int) -> int:
    """Where dim `dim` of the view's operand lands in its result."""
    return _permutation(op).index(dim) if op.name == "stablehlo.transpose" else dim


def dim_before(op: ir.Operation, dim: int) -> int:
    """Which dim of the view's operand becomes dim `dim` of its result."""
    return _permutation(op)[dim] if op.name == "stablehlo.transpose" else dim


def replay(views: Sequence[ir.Operation], value: ir.Value) -> ir.Value:
    """Apply `views` (in order) to `value`, a block of their original operand."""
    for view in views:
        if view.name in TRANSPARENT:
            continue
        shape = list(value.type.shape)
        if view.name == "stablehlo.transpose":
            shape = [shape[d] for d in _permutation(view)]
        result = ir.RankedTensorType.get(shape, view.results[0].type.element_type)
        attrs = {name: view.attributes[name] for name in view.attributes}
        value = ir.Operation.create(view.name, results=[result], operands=[value],
                                    attributes=attrs).result
    return value


@dataclass(frozen=True)
class ViewedUse:
    """An op reading `value`, which is the root value seen through `views`."""

    value: ir.Value
    views: tuple[ir.Operation, ...]
    user: ir.Operation


def users_through_views(root: ir.Value) -> tuple[list[ViewedUse], list[ir.Value]]:
    """Every non-view user of `root` through chains of views, and all values on them
    in topological order (root first)."""
    uses, values, paths = [], [root], [()]
    for value, path in zip(values, paths):
        for use in value.uses:
            owner = _op(use.owner)
            if owner.name in VIEWS:
                values.append(owner.results[0])
                paths.append((*path, owner))
            else:
                uses.append(ViewedUse(value, path, owner))
    return uses, values


def producer(value: ir.Value, kinds: frozenset = VIEWS
             ) -> tuple[ir.Operation | None, list[ir.Operation]]:
    """The op defining `value` above single-use ops of `kinds`, and those ops (nearest
    the producer first, i.e. in the order they apply)."""
    chain = []
    while isinstance(value, ir.OpResult):
        owner = _op(value.owner)
        if owner.name not in kinds or len(list(owner.results[0].uses)) != 1:
            return owner, chain[::-1]
        chain.append(owner)
        value = owner.operands[0]
    return None, chain[::-1]


def erase_unused(rewriter, values: list[ir.Value]) -> None:
    """Erase the ops defining `values` (last first) once nothing reads them."""
    for value in reversed(values):
        if not list(value.uses) and isinstance(value, ir.OpResult):
            rewriter.erase_op(_op(value.owner))
