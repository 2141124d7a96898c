"""Ops the passes see through between a collective and its dot.

An `sdy.sharding_constraint` only steers sharding propagation (JAX puts one after
every op of a partially manual shard_map body); it never changes values, so a
collective and a dot joined through such constraints are still a site.
"""
from __future__ import annotations

from jaxlib.mlir import ir

TRANSPARENT = frozenset({"sdy.sharding_constraint"})


def _op(owner) -> ir.Operation:
    return owner if isinstance(owner, ir.Operation) else owner.operation


def aliases(value: ir.Value) -> list[ir.Value]:
    """`value` and the values that equal it through transparent ops, in order."""
    found = [value]
    for current in found:
        for use in current.uses:
            owner = _op(use.owner)
            if owner.name in TRANSPARENT:
                found.append(owner.results[0])
    return found


def producer(value: ir.Value) -> tuple[ir.Operation | None, list[ir.Operation]]:
    """The op defining `value` above single-use transparent ops, and those ops."""
    chain = []
    while isinstance(value, ir.OpResult):
        owner = _op(value.owner)
        if owner.name not in TRANSPARENT or len(list(owner.results[0].uses)) != 1:
            return owner, chain
        chain.append(owner)
        value = owner.operands[0]
    return None, chain


def erase_unused(rewriter, values: list[ir.Value]) -> None:
    """Erase the ops defining `values` (last first) once nothing reads them."""
    for value in reversed(values):
        if not list(value.uses) and isinstance(value, ir.OpResult):
            rewriter.erase_op(_op(value.owner))
