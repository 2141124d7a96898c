"""Ops the passes see through between a collective and its dot.

A *view* changes how a tensor is laid out or typed but keeps each gathered or
scattered block a block along one dim:

- `sdy.sharding_constraint`: a propagation hint, no change at all (JAX puts one after
  every op of a partially manual shard_map body);
- `stablehlo.convert`: the element type changes;
- `stablehlo.transpose`: the dim moves;
- `stablehlo.reshape` that keeps the dim intact (same size, and the dims before it
  hold the same number of elements), e.g. merging the batch and sequence dims of
  activations gathered along the hidden dim; on the all_gather side also one that
  merges the dim with the dims after it (a non-tiled all_gather's new axis folded
  into the next one: a block then spans the merged size);
- `stablehlo.multiply` by a `broadcast_in_dim` that does not vary along the dim (a
  dequantizing scale; all_gather side only);
- `stablehlo.dynamic_slice` that takes the whole dim (slices only other dims; all_gather
  side only): its start indices are read as they are, the one along the dim clamps to 0.

The passes replay the views on each step's block inside the loop, so the data on the
wire keeps the collective's own type and layout.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dominance import callee, is_public
from overlap_hlo.ir.ops import ELEMENTWISE, as_op, broadcast_source, varies_along

TRANSPARENT = frozenset({"sdy.sharding_constraint"})
# Views a value keeps its rows through, one operand each (those `view_backward` takes).
VIEWS = TRANSPARENT | {"stablehlo.convert", "stablehlo.transpose", "stablehlo.reshape"}
# VIEWS that change the shape or type: the ones a remark names (the transparent left out).
RESHAPING_VIEWS = VIEWS - TRANSPARENT
# VIEWS and the ops that cut or wrap a value (slices, barriers, custom calls): the
# coverage report follows them from a gathered value to its dot, farther than a pass.
COVERAGE_VIEWS = VIEWS | {"stablehlo.slice", "stablehlo.dynamic_slice",
                          "stablehlo.optimization_barrier", "stablehlo.custom_call"}


def _ints(attr: ir.Attribute) -> list[int]:
    return list(ir.DenseI64ArrayAttr(attr))


@dataclass(frozen=True)
class View:
    """One view op on the chain, with the block dim before and after it."""

    op: ir.Operation
    dim_in: int
    dim_out: int
    operand: int = 0                 # which operand of `op` is on the chain
    reads: tuple[ir.Value, ...] = () # other values it reads: a multiply's scale (the value
                                     # broadcast), a dynamic_slice's start indices
    factor: int = 1                  # a block of size s along dim_in is s * factor along dim_out


def _kept_dim(shape_in, shape_out, dim: int) -> int | None:
    """The dim of `shape_out` that is dim `dim` of `shape_in` unsplit, if any."""
    merged = merged_dim(shape_in, shape_out, dim)
    return merged[0] if merged and merged[1] == 1 else None


def merged_dim(shape_in, shape_out, dim: int) -> tuple[int, int] | None:
    """(out dim, factor) when dim `dim` of `shape_in`, with the dims after it up to
    some point, forms one dim of `shape_out` (factor: their sizes multiplied)."""
    before = math.prod(shape_in[:dim])
    for out in range(len(shape_out)):
        if math.prod(shape_out[:out]) != before:
            continue
        for end in range(dim + 1, len(shape_in) + 1):
            if math.prod(shape_in[dim:end]) == shape_out[out]:
                return out, math.prod(shape_in[dim + 1:end])
    return None


def view_forward(op: ir.Operation, operand: int, dim: int, reading: bool = True
                 ) -> View | None:
    """`op` as a view of its operand `operand` along `dim`, or None."""
    name = op.name
    if name in TRANSPARENT or name == "stablehlo.convert":
        return View(op, dim, dim)
    if name == "stablehlo.transpose":
        return View(op, dim, _ints(op.attributes["permutation"]).index(dim))
    if name == "stablehlo.reshape":
        merged = merged_dim(op.operands[0].type.shape, op.results[0].type.shape, dim)
        return None if merged is None else View(op, dim, merged[0], factor=merged[1])
    if name == "stablehlo.multiply" and reading:
        scale, dims = broadcast_source(op.operands[1 - operand])
        if dims is not None and not varies_along(scale, dims, dim):
            # the scale is the same for every block along `dim`
            return View(op, dim, dim, operand, (scale,))
    if name == "stablehlo.dynamic_slice" and reading and operand == 0:
        sizes = _ints(op.attributes["slice_sizes"])
        if sizes[dim] == op.operands[0].type.shape[dim]:   # the whole dim: blocks stay blocks
            return View(op, dim, dim, 0, tuple(op.operands[1:]))
    return None


def view_backward(op: ir.Operation, dim: int) -> View | None:
    """`op` as a view of its first operand whose result dim `dim` it keeps, or None."""
    name = op.name
    if name in TRANSPARENT or name == "stablehlo.convert":
        return View(op, dim, dim)
    if name == "stablehlo.transpose":
        return View(op, _ints(op.attributes["permutation"])[dim], dim)
    if name == "stablehlo.reshape":
        before = _kept_dim(op.results[0].type.shape, op.operands[0].type.shape, dim)
        return None if before is None else View(op, before, dim)
    return None


def replay(views: Sequence[View], value: ir.Value, reads: Sequence[ir.Value] = ()
           ) -> ir.Value:
    """Apply `views` (in order) to `value`, a block of the chain's start.

    `reads` are the values the views read besides the chain, in order (a multiply's
    scale, a dynamic_slice's start indices; inside a loop: its block arguments)."""
    reads = iter(reads)
    for view in views:
        op = view.op
        if op.name in TRANSPARENT:
            continue
        full = op.results[0].type
        shape = list(full.shape)
        shape[view.dim_out] = value.type.shape[view.dim_in] * view.factor
        result = ir.RankedTensorType.get(shape, full.element_type)
        attrs = {name: op.attributes[name] for name in op.attributes}
        if op.name == "stablehlo.multiply":
            broadcast = as_op(op.operands[1 - view.operand].owner)
            scale = stablehlo.broadcast_in_dim(
                result, next(reads), broadcast.attributes["broadcast_dimensions"])
            operands = [value, scale] if view.operand == 0 else [scale, value]
        elif op.name == "stablehlo.dynamic_slice":
            operands = [value] + [next(reads) for _ in view.reads]
            attrs["slice_sizes"] = ir.DenseI64ArrayAttr.get(shape)
        else:
            operands = [value]
        value = ir.Operation.create(op.name, results=[result], operands=operands,
                                    attributes=attrs).result
    return value


@dataclass(frozen=True)
class ViewedUse:
    """An op reading `value`, which is the root value seen through `views`."""

    value: ir.Value
    views: tuple[View, ...]
    user: ir.Operation
    dim: int                        # the root's dim, where it enters `user`

    @property
    def factor(self) -> int:
        """How much larger a block is where it enters `user` (reshapes merging dims)."""
        return math.prod(v.factor for v in self.views)

    @property
    def reads(self) -> list[ir.Value]:
        """What the views read besides the chain, in order (for `replay`)."""
        return [value for v in self.views for value in v.reads]


def users_through_views(root: ir.Value, dim: int) -> tuple[list[ViewedUse], list[ir.Value]]:
    """Every non-view user of `root` (along `dim`) through chains of views, and all
    values on those chains in topological order (root first)."""
    uses, values, paths, dims = [], [root], [()], [dim]
    for value, path, current in zip(values, paths, dims):
        for use in value.uses:
            owner = as_op(use.owner)
            view = view_forward(owner, use.operand_number, current)
            if view is not None:
                values.append(owner.results[0])
                paths.append((*path, view))
                dims.append(view.dim_out)
            else:
                uses.append(ViewedUse(value, path, owner, current))
    return uses, values


DOTS = frozenset({"stablehlo.dot_general", "stablehlo.dot"})
# Ops a value reaches a dot through in the search below (views and their kin).
PASSING = VIEWS | {"stablehlo.multiply", "stablehlo.dynamic_slice", "stablehlo.slice"}
# Region ops whose operand i is argument i of their region(s): the value crosses into it.
INTO_REGION = {"stablehlo.while": (0, 1), "sdy.manual_computation": (0,)}


def dot_across_regions(root: ir.Value, limit: int = 256) -> str | None:
    """Where a dot reads `root` only across a region boundary that the passes do not
    follow (a while's carried value, the result of an if/case branch, an
    optimization_barrier), e.g. "through a stablehlo.while operand"; None when no dot
    is reached that way within `limit` values."""
    frontier, seen = [(root, None)], 0
    while frontier and seen < limit:
        value, crossed = frontier.pop()
        seen += 1
        for use in value.uses:
            user = as_op(use.owner)
            if user.name in DOTS:
                if crossed is not None:
                    return crossed
                continue
            step = crossed
            if user.name in INTO_REGION:
                step = crossed or f"through a {user.name} operand"
                for region in INTO_REGION[user.name]:
                    frontier.append((user.regions[region].blocks[0].arguments[
                        use.operand_number], step))
                continue
            if user.name == "func.call":
                func = callee(user)
                if func is not None:
                    name = ir.FlatSymbolRefAttr(user.attributes["callee"]).value
                    frontier.append((func.regions[0].blocks[0].arguments[use.operand_number],
                                     crossed or f"through a call of @{name}"))
                continue
            if user.name in ("stablehlo.return", "sdy.return"):
                parent = user.parent
                if parent is not None and parent.name in ("stablehlo.case", "stablehlo.if"):
                    frontier.append((parent.results[use.operand_number],
                                     crossed or f"through the result of a {parent.name}"))
                continue
            if user.name == "stablehlo.optimization_barrier":
                frontier.append((user.results[use.operand_number],
                                 crossed or "through a stablehlo.optimization_barrier"))
                continue
            if user.name in PASSING:
                frontier.extend((result, step) for result in user.results)
    return None


def dots_reading(root: ir.Value, limit: int = 64) -> list[ir.Operation]:
    """The dots that read `root` through PASSING and elementwise ops (in one region),
    within `limit` values: what a collective's result feeds."""
    dots, frontier, seen = [], [root], 0
    while frontier and seen < limit:
        value = frontier.pop()
        seen += 1
        for use in value.uses:
            user = as_op(use.owner)
            if user.name in DOTS:
                if not any(user == dot for dot in dots):
                    dots.append(user)
            elif user.name in PASSING or user.name in ELEMENTWISE:
                frontier.extend(user.results)
    return dots


def add_leaves(top: ir.Operation | None) -> list[ir.Operation]:
    """`top`, or when it is a stablehlo.add, the ops that the tree of single-use adds
    under it sums, in operand order (operands that are block arguments or that other
    ops read too are left out)."""
    if top is None or top.name != "stablehlo.add":
        return [] if top is None else [top]
    leaves, pending = [], [top]
    while pending:
        op = pending.pop()
        if op.name != "stablehlo.add":
            leaves.append(op)
            continue
        pending += [as_op(operand.owner) for operand in reversed(list(op.operands))
                    if isinstance(operand, ir.OpResult) and len(list(operand.uses)) == 1]
    return leaves


def producer(value: ir.Value, dim: int) -> tuple[ir.Operation | None, list[View], int]:
    """The op defining `value` above single-use views along `dim`, those views (in the
    order they apply) and the dim in the op's result."""
    chain = []
    while isinstance(value, ir.OpResult):
        owner = as_op(value.owner)
        view = view_backward(owner, dim)
        if view is None or len(list(owner.results[0].uses)) != 1:
            return owner, chain[::-1], dim
        chain.append(view)
        dim = view.dim_in
        value = owner.operands[0]
    return None, chain[::-1], dim


def only_transparent(value: ir.Value) -> ir.Operation | None:
    """The op defining `value` above single-use transparent ops."""
    while isinstance(value, ir.OpResult):
        owner = as_op(value.owner)
        if owner.name not in TRANSPARENT or len(list(owner.results[0].uses)) != 1:
            return owner
        value = owner.operands[0]
    return None


# Ops a value leaves a manual region through, unchanged, on its way to the program's
# output (Shardy's region results; GSPMD's sharding custom calls).
_TO_OUTPUT = TRANSPARENT | {"stablehlo.reshape", "stablehlo.custom_call"}
_OUTPUT_CALLS = ("Sharding", "SPMDShardToFullShape")


def returned_by_program(root: ir.Value, limit: int = 16) -> bool:
    """Whether `root` is an output of the program: returned by a public function, through
    sharding hints, reshapes and the results of `sdy.manual_computation` regions only
    (within `limit` values)."""
    frontier, seen = [root], 0
    while frontier and seen < limit:
        value = frontier.pop()
        seen += 1
        for use in value.uses:
            user = as_op(use.owner)
            if user.name == "func.return":
                if is_public(user.parent):
                    return True
            elif user.name == "sdy.return":
                parent = user.parent
                if parent is not None and parent.name == "sdy.manual_computation":
                    frontier.append(parent.results[use.operand_number])
            elif user.name in _TO_OUTPUT and (
                    user.name != "stablehlo.custom_call" or ir.StringAttr(
                        user.attributes["call_target_name"]).value in _OUTPUT_CALLS):
                frontier.extend(user.results)
    return False


def erase_unused(rewriter, values: list[ir.Value]) -> None:
    """Erase the ops defining `values` (last first) once nothing reads them."""
    for value in reversed(values):
        if not list(value.uses) and isinstance(value, ir.OpResult):
            rewriter.erase_op(as_op(value.owner))
