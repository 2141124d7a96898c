"""Operations behind the bindings' op views."""
from __future__ import annotations

from jaxlib.mlir import ir


# Ops that compute each element from the same elements of their operands.
ELEMENTWISE = frozenset(f"stablehlo.{name}" for name in (
    "abs add and atan2 cbrt ceil clamp compare convert cosine divide exponential "
    "exponential_minus_one floor is_finite log log_plus_one logistic maximum minimum "
    "multiply negate not or power remainder round_nearest_afz round_nearest_even rsqrt "
    "select sign sine sqrt subtract tan tanh xor").split())


def as_op(owner) -> ir.Operation:
    """The operation behind an op view or an `ir.Operation` (a value's `owner`)."""
    return owner if isinstance(owner, ir.Operation) else owner.operation


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op whose result `value` is; None for a block argument."""
    return as_op(value.owner) if isinstance(value, ir.OpResult) else None


def broadcast_source(value: ir.Value) -> tuple[ir.Value, list[int] | None]:
    """(its source, broadcast_dimensions) for a value made by broadcast_in_dim, else
    (the value, None)."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.broadcast_in_dim":
        return value, None
    return op.operands[0], list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))


def varies_along(source: ir.Value, dims: list[int], dim: int) -> bool:
    """Whether `broadcast_in_dim(source, dims)` varies along its result dim `dim`: `dim`
    comes from a source dim wider than 1."""
    return dim in dims and source.type.shape[dims.index(dim)] != 1


# The collectives the passes start from.
COLLECTIVES = frozenset({"stablehlo.all_gather", "stablehlo.all_reduce",
                         "stablehlo.reduce_scatter", "stablehlo.all_to_all"})


# An uninitialised buffer (`custom_call @AllocateBuffer`, what `jax.lax.empty` lowers to
# on TPU and GPU), and the kind `names_in` gives it.
ALLOCATE = "AllocateBuffer"
ALLOCATION = f"stablehlo.custom_call @{ALLOCATE}"
# What `SiteLog.may_hold` keeps track of.
TRACKED = COLLECTIVES | {ALLOCATION}


def is_allocation(op: ir.Operation | None) -> bool:
    """`op` is an uninitialised buffer."""
    return (op is not None and op.name == "stablehlo.custom_call"
            and ir.StringAttr(op.attributes["call_target_name"]).value == ALLOCATE)


def names_in(op: ir.Operation, names: frozenset[str]) -> set[str]:
    """Which of `names` name an op anywhere in `op` (the walk stops once all have); an
    uninitialised buffer is named ALLOCATION."""
    found: set[str] = set()

    def visit(inner):
        name = inner.name
        if name == "stablehlo.custom_call" and is_allocation(inner):
            name = ALLOCATION
        if name in names:
            found.add(name)
            if len(found) == len(names):
                return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


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
