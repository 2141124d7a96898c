"""The sum a reduce_scatter ring replaces: the dots and added terms a collective sums,
the other readers of that sum, and why a collective with no such sum is no site."""
from __future__ import annotations

from typing import NoReturn

from jaxlib.mlir import ir

from overlap_hlo.ir.dominance import after
from overlap_hlo.ir.dots import DotDims
from overlap_hlo.ir.lookthrough import (RESHAPING_VIEWS, TRANSPARENT, View, add_leaves,
                                        only_transparent, producer, view_backward)
from overlap_hlo.ir.ops import as_op, defining_op
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.passes.epilogue import Epilogue, find_prologue
from overlap_hlo.rewrite.rewrite_pass import NoMatch


def summed_dots(top: ir.Operation | None
                ) -> tuple[list[ir.Operation], list[ir.Operation], list[ir.Value]]:
    """The dots whose sum `top` is (a dot, or a tree of single-use adds whose leaves are
    dots and other values, the added terms, e.g. a bias), the adds (outermost first) and
    the added terms; no dots if `top` is anything else or the tree holds no dot."""
    if top is None:
        return [], [], []
    if top.name == "stablehlo.dot_general":
        return [top], [], []
    if top.name != "stablehlo.add":
        return [], [], []
    dots, adds, addends = [], [top], []
    for operand in top.operands:
        inner = as_op(operand.owner) if isinstance(operand, ir.OpResult) else None
        more = ([], [], [])
        if inner is not None and len(list(operand.uses)) == 1:
            more = summed_dots(inner)
        if not more[0]:
            addends.append(operand)   # no dot under it: a term added to the sum
            continue
        dots += more[0]
        adds += more[1]
        addends += more[2]
    return (dots, adds, addends) if dots else ([], [], [])


def is_add_reduction(region: ir.Region) -> bool:
    """The region returns add(arg0, arg1), in either order, maybe through constraints."""
    block = region.blocks[0]
    ops = [op.operation for op in block.operations]
    add = only_transparent(ops[-1].operands[0]) if len(ops[-1].operands) == 1 else None
    if add is None or add.name != "stablehlo.add" or add.block != block:
        return False
    if any(op.name not in TRANSPARENT for op in ops if op != add and op != ops[-1]):
        return False
    args, operands = list(block.arguments), list(add.operands)
    return len(args) == 2 and (operands == args or operands == args[::-1])


def refuse_without_dots(top: ir.Operation | None, scatter: ir.Operation) -> NoReturn:
    """Why no dot is summed into `scatter`'s operand where a ring could replace it, when
    one is further away; else no site."""
    if top is not None and top.name == "stablehlo.optimization_barrier":
        raise Unsupported("an optimization_barrier separates it from its operand")
    if top is not None and any(summed_dots(producer(value, 0)[0])[0]
                               for value in returned(top, scatter.operands[0])):
        where = ("a stablehlo.while body, summed into a carried value"
                 if top.name == "stablehlo.while" else
                 f"the branches of a {top.name} (that differ)")
        raise Unsupported(f"its dot is inside {where}: a ring cannot be placed there",
                          kind=Kind.ACROSS_REGION)
    if top is not None and top.name == "stablehlo.add" and _viewed_dot_in_sum(top):
        raise Unsupported("a dot of its sum reaches the add through a transpose, "
                          "reshape or convert: not followed inside a sum",
                          kind=Kind.VIEW_IN_SUM)
    behind = _dot_behind_reshapes(top)
    if behind:
        raise Unsupported(f"its dot reaches it through a {behind} that splits or "
                          "merges the scattered dim: not followed",
                          kind=Kind.RESHAPED_SCATTER_DIM)
    raise NoMatch


def other_readers(scatter: ir.Operation, top: ir.Operation, between: list[View],
                  dots: list[ir.Operation], adds: list[ir.Operation],
                  addends: list[ir.Value]) -> tuple[list, bool]:
    """The readers of the dots' product (or of the whole sum: then True) other than the
    chain to `scatter`, for the ring to assemble; refused where it cannot."""
    readers = [use for dot in dots for use in dot.results[0].uses
               if as_op(use.owner) not in adds and as_op(use.owner) not in
               [view.op for view in between] and as_op(use.owner) != scatter]
    sum_read = False   # the sum (dots and added terms) has readers besides the chain
    if adds:
        chain = between[0].op if between else scatter
        # The dots of a sum are single-use (summed_dots): only the sum has readers.
        readers = [use for use in top.results[0].uses if as_op(use.owner) != chain]
        before = [use for use in readers if not after(scatter, as_op(use.owner))]
        if before:
            raise Unsupported(f"the sum of its dot and added terms is also read by "
                              f"{as_op(before[0].owner).name} before it: the ring "
                              "does not compute that sum there", kind=Kind.SUM_READ_ELSEWHERE)
        sum_read = bool(readers)
    if readers and not sum_read and (
            len(dots) > 1 or addends
            or not all(after(scatter, as_op(use.owner)) for use in readers)):
        raise Unsupported("the dot result has users other than the "
                          + scatter.name.removeprefix("stablehlo.")
                          + ("" if len(dots) == 1 and not addends else
                             " (in a sum of dots or with an added term)")
                          + ("" if all(after(scatter, as_op(u.owner)) for u in readers)
                             else " before it"))
    return readers, sum_read


def scatter_fed_by(dot: ir.Operation) -> ir.Operation | None:
    """The reduce_scatter that `dot` feeds as one of the summed dots of its site (through
    single-use views and adds; the product itself may have other readers), or None."""
    for use in dot.results[0].uses:   # the dot's product may have other readers too
        user = as_op(use.owner)
        while True:
            if user.name == "stablehlo.reduce_scatter":
                dim = ir.IntegerAttr(user.attributes["scatter_dimension"]).value
                top, _, _ = producer(user.operands[0], dim)
                if dot in summed_dots(top)[0]:
                    return user
                break
            if user.name != "stablehlo.add" and view_backward(user, 0) is None:
                break
            uses = list(user.results[0].uses)
            if len(uses) != 1:
                break
            user = as_op(uses[0].owner)
    return None


def returned(region_op: ir.Operation, value: ir.Value) -> list[ir.Value]:
    """What the regions of an if/case (each branch) or a while (its body) return for
    `value`, a result of `region_op` maybe behind single-use views; [] for other ops."""
    regions = {"stablehlo.case": region_op.regions, "stablehlo.if": region_op.regions,
               "stablehlo.while": region_op.regions[1:]}.get(region_op.name, [])
    while regions and as_op(value.owner) != region_op:
        value = as_op(value.owner).operands[0]
    return [as_op(list(region.blocks[0].operations)[-1]).operands[value.result_number]
            for region in regions]


def _viewed_dot_in_sum(top: ir.Operation) -> bool:
    """Whether a leaf of the add tree `top` is a dot behind single-use views."""
    for inner in add_leaves(top):
        while inner.name in RESHAPING_VIEWS and len(list(inner.results[0].uses)) == 1 \
                and isinstance(inner.operands[0], ir.OpResult):
            inner = as_op(inner.operands[0].owner)
            if inner.name == "stablehlo.dot_general":
                return True
    return False


def _dot_behind_reshapes(top: ir.Operation | None, limit: int = 8) -> str:
    """The first reshape or transpose ("reshape", "transpose") on a chain of reshapes,
    transposes and converts from `top` back to a dot_general, or "" when the chain
    reaches no dot or holds only converts."""
    chain, op = [], top
    while op is not None and len(chain) < limit and op.name in RESHAPING_VIEWS:
        chain.append(op.name.removeprefix("stablehlo."))
        op = defining_op(op.operands[0])
    shaping = [name for name in chain if name != "convert"]
    return shaping[0] if shaping and op is not None and op.name == "stablehlo.dot_general" \
        else ""


def sliced_prologues(dots: list[ir.Operation], result_dim: int
                     ) -> dict[tuple[int, int], Epilogue]:
    """(dot index, operand index) -> the elementwise prologue of an operand the ring
    slices (one that makes `result_dim`), when only these dots read it."""
    found = {}
    for i, dot in enumerate(dots):
        for index, _ in DotDims.of(dot).result_source(result_dim):
            operand = dot.operands[index]
            readers = {as_op(use.owner) for use in operand.uses}
            if not readers <= set(dots):
                continue
            prologue = find_prologue(operand)
            if prologue is not None:
                found[(i, index)] = prologue
    return found
