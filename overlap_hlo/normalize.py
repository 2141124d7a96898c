"""Input put in the form the passes match, by rewrites that keep its meaning.

- An if/case whose branches are all the same computation is that computation. A
  multi-platform `jax.export` (`platforms=("cpu", "tpu")`) lowers each primitive
  once per platform and picks one with a `stablehlo.case` on the platform index: an
  all_gather and the dot that reads it sit in branches of two different cases,
  joined only through the cases' results. Where every branch is the same (the usual
  case for collectives and dots), the case is its first branch, inlined.
- A func.call that receives a gathered value, or whose result a reduce_scatter
  scatters (a nested `jax.jit` layer), is its callee's body: the call is inlined
  there (XLA inlines every call before it schedules), so the dot inside is seen.
- A legacy `stablehlo.dot` (older exporters, hand-written modules) next to an
  all_gather or a reduce_scatter is the `dot_general` it abbreviates.

Only ops next to a collective or holding one are touched; the rest of a module
stays as it was.
"""
from __future__ import annotations

from jaxlib.mlir import ir

from jaxlib.mlir.dialects import stablehlo

from .dominance import Callers, as_op
from .lookthrough import producer, users_through_views

BRANCHING = ("stablehlo.case", "stablehlo.if")
CANDIDATES = frozenset({"stablehlo.all_gather", "stablehlo.reduce_scatter",
                        "stablehlo.dot_general", "stablehlo.dot"})


# Rounds of call inlining (a layer's call of a call receives the value one round later).
MAX_INLINE_ROUNDS = 16


def normalize(module_op: ir.Operation) -> None:
    """Every rewrite above, in place."""
    inline_identical_branches(module_op)
    for _ in range(MAX_INLINE_ROUNDS):
        if not inline_calls_next_to_collectives(module_op):
            break
    legacy_dots_as_dot_general(module_op)


def inline_calls_next_to_collectives(module_op: ir.Operation) -> int:
    """Inline each func.call that reads an all_gather's result (through views) or whose
    result a reduce_scatter scatters; returns how many. A private callee that nothing
    calls any more is erased."""
    calls: list[ir.Operation] = []

    def visit(op):
        if op.name == "stablehlo.all_gather" and len(op.results) == 1:
            dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
            calls.extend(use.user for use in users_through_views(op.results[0], dim)[0]
                         if use.user.name == "func.call")
        elif op.name == "stablehlo.reduce_scatter":
            dim = ir.IntegerAttr(op.attributes["scatter_dimension"]).value
            top = producer(op.operands[0], dim)[0]
            if top is not None and top.name == "func.call":
                calls.append(top)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    if not calls:
        return 0
    table = ir.SymbolTable(module_op)
    inlined, callees = 0, {}
    for call in {hash(call): call for call in calls}.values():
        name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        callee = table[name] if name in table else None
        if callee is not None and _inline(call, as_op(callee)):
            inlined += 1
            callees[name] = as_op(callee)
    _erase_unused_private(module_op, callees)
    return inlined


def _inline(call: ir.Operation, callee: ir.Operation) -> bool:
    """Clone `callee`'s body before `call`, reading the call's operands for its
    arguments, and replace the call's results; False for a callee of several blocks."""
    if callee.name != "func.func" or len(callee.regions[0].blocks) != 1:
        return False
    body = callee.regions[0].blocks[0]
    values = dict(zip(body.arguments, call.operands))
    ops = [as_op(op) for op in body.operations]
    with ir.InsertionPoint(call):
        for op in ops[:-1]:
            clone = op.clone()
            _remap(clone, values)
            values.update(zip(op.results, clone.results))
    for result, value in zip(call.results, ops[-1].operands):
        result.replace_all_uses_with(values.get(value, value))
    call.erase()
    return True


def _remap(op: ir.Operation, values: dict) -> None:
    """Point the operands of `op` and of the ops nested in it at `values`' entries."""

    def visit(inner):
        for i, operand in enumerate(inner.operands):
            if operand in values:
                inner.operands[i] = values[operand]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def _erase_unused_private(module_op: ir.Operation, functions: dict) -> None:
    """Erase those of `functions` (name -> func.func) that are private and that no op
    of the module names any more."""
    private = {name: func for name, func in functions.items()
               if "sym_visibility" in func.attributes
               and ir.StringAttr(func.attributes["sym_visibility"]).value == "private"}
    if not private:
        return
    callers = Callers()

    def visit(op):
        callers.note(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    for name, func in private.items():
        if name not in callers.calls and name not in callers.other:
            func.erase()


def legacy_dots_as_dot_general(module_op: ir.Operation) -> int:
    """Replace each `stablehlo.dot` that reads an all_gather or feeds a reduce_scatter
    (through views) by the equivalent `dot_general`; returns how many."""
    dots: list[ir.Operation] = []

    def visit(op):
        if op.name == "stablehlo.all_gather" and len(op.results) == 1:
            dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
            dots.extend(use.user for use in users_through_views(op.results[0], dim)[0]
                        if use.user.name == "stablehlo.dot")
        elif op.name == "stablehlo.reduce_scatter":
            dim = ir.IntegerAttr(op.attributes["scatter_dimension"]).value
            dots.extend(_summed_legacy_dots(producer(op.operands[0], dim)[0]))
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    unique = list({hash(dot): dot for dot in dots}.values())
    for dot in unique:
        _as_dot_general(dot)
    return len(unique)


def _summed_legacy_dots(top: ir.Operation | None) -> list[ir.Operation]:
    """The legacy dots at the leaves of `top`, a dot or a tree of single-use adds."""
    if top is None or top.name not in ("stablehlo.dot", "stablehlo.add"):
        return []
    if top.name == "stablehlo.dot":
        return [top]
    return [dot for operand in top.operands
            if isinstance(operand, ir.OpResult) and len(list(operand.uses)) == 1
            for dot in _summed_legacy_dots(as_op(operand.owner))]


def _as_dot_general(dot: ir.Operation) -> None:
    """`dot(lhs, rhs)` contracts the last dim of lhs with the first of rhs."""
    lhs, rhs = dot.operands
    numbers = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[], rhs_batching_dimensions=[],
        lhs_contracting_dimensions=[lhs.type.rank - 1], rhs_contracting_dimensions=[0])
    attrs = {"dot_dimension_numbers": numbers}
    if "precision_config" in dot.attributes:
        attrs["precision_config"] = dot.attributes["precision_config"]
    with ir.InsertionPoint(dot), dot.location:
        general = ir.Operation.create("stablehlo.dot_general", results=[dot.results[0].type],
                                      operands=[lhs, rhs], attributes=attrs)
    dot.results[0].replace_all_uses_with(general.results[0])
    dot.erase()


def inline_identical_branches(module_op: ir.Operation) -> int:
    """Inline every if/case of `module_op` whose branches are identical and hold a
    collective or a dot (innermost first); returns how many were inlined."""
    found: list[ir.Operation] = []

    def visit(op):
        if op.name in BRANCHING and _holds_candidate(op) and _identical(op.regions):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit, ir.WalkOrder.POST_ORDER)
    for op in found:
        _inline_first_branch(op)
    return len(found)


def _holds_candidate(op: ir.Operation) -> bool:
    hit = []

    def visit(inner):
        if inner.name in CANDIDATES:
            hit.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return bool(hit)


def _identical(regions) -> bool:
    first = regions[0]
    return all(_same_region(first, other, {}) for other in list(regions)[1:])


def _same_region(a: ir.Region, b: ir.Region, mapping: dict) -> bool:
    """Same blocks, ops, attributes and types, operands matching pairwise (values
    from outside both regions must be the same value)."""
    blocks_a, blocks_b = list(a.blocks), list(b.blocks)
    if len(blocks_a) != len(blocks_b):
        return False
    for block_a, block_b in zip(blocks_a, blocks_b):
        args_a, args_b = list(block_a.arguments), list(block_b.arguments)
        if [x.type for x in args_a] != [y.type for y in args_b]:
            return False
        mapping.update(zip(args_a, args_b))
        ops_a, ops_b = list(block_a.operations), list(block_b.operations)
        if len(ops_a) != len(ops_b):
            return False
        for op_a, op_b in zip(ops_a, ops_b):
            if not _same_op(as_op(op_a), as_op(op_b), mapping):
                return False
    return True


def _same_op(a: ir.Operation, b: ir.Operation, mapping: dict) -> bool:
    if (a.name != b.name or len(a.operands) != len(b.operands)
            or len(a.results) != len(b.results) or len(a.regions) != len(b.regions)):
        return False
    if any(mapping.get(x, x) != y for x, y in zip(a.operands, b.operands)):
        return False
    if [r.type for r in a.results] != [r.type for r in b.results]:
        return False
    if {name: a.attributes[name] for name in a.attributes} != \
            {name: b.attributes[name] for name in b.attributes}:
        return False
    if not all(_same_region(x, y, mapping) for x, y in zip(a.regions, b.regions)):
        return False
    mapping.update(zip(a.results, b.results))
    return True


def _inline_first_branch(op: ir.Operation) -> None:
    """Move the first branch's ops before `op`, which its returned values replace."""
    block = op.regions[0].blocks[0]
    ops = [as_op(inner) for inner in block.operations]
    terminator = ops[-1]
    for inner in ops[:-1]:
        inner.move_before(op)
    for result, value in zip(op.results, terminator.operands):
        result.replace_all_uses_with(value)
    op.erase()
