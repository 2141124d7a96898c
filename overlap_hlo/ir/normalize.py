"""Input put in the form the passes match, by rewrites that keep its meaning.

- An if/case whose branches are all the same computation is that computation. A
  multi-platform `jax.export` (`platforms=("cpu", "tpu")`) lowers each primitive
  once per platform and picks one with a `stablehlo.case` on the platform index: an
  all_gather and the dot that reads it sit in branches of two different cases,
  joined only through the cases' results. Where every branch is the same (the usual
  case for collectives and dots), the case is its first branch, inlined.
- A func.call next to a collective is its callee's body: the call is inlined there
  (XLA inlines every call before it schedules), so the dot inside is seen. Next to
  means: it reads an all_gather's or all_to_all's result through views, or an
  all_gather's or all_reduce's result through row-wise ops (`jnp.where`, `jnp.clip`,
  `jax.nn.silu` lower to calls after a psum: overlap-sequence-parallel moves them), or
  its result is what a reduce_scatter, all_reduce or all_to_all reduces through views
  (a nested `jax.jit` layer).
- A private function that a while loop's body calls once and that holds an all_reduce
  (jax 0.10.2 calls a scan's body so) is inlined into the loop's body: the residual it
  updates is then the loop's own carried value, which overlap-sequence-parallel can
  carry as its shard.
- A legacy `stablehlo.dot` (older exporters, hand-written modules) next to a
  collective is the `dot_general` it abbreviates.
- The sum a reduce_scatter or all_reduce reduces is made a sum of dots where it is a
  linear form of one: a difference is a sum with the term negated, and the negation of
  a dot (or of a sum) is carried into the dot's left operand (exact: negation is).
  Over an all_reduce, a negation, a scale by a value that is the same on every device,
  a reshape and a transpose of its operand (single-use) are applied to its result
  instead (`psum(2 * (x @ w))` is `2 * psum(x @ w)`; a reshape and a transpose of the
  sum are the sum of the reshapes).
- A reduce_scatter of a dot's result reshaped so that the scattered dim is the leading
  part of a dim it splits (MaxText's MoE combine: tokens split into (experts,
  capacity)), or a dim that dims of the result merge into (the first divisible by the
  group), is the reshape of a reduce_scatter of that dim of the result: each device's
  block is the same contiguous rows either way.

Only if/case ops that hold a collective or a dot, and calls and legacy dots next to a
collective, are touched (and nothing in a module without an all_gather, reduce_scatter,
all_reduce or all_to_all); the rest of a module stays as it was.
"""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dominance import Callers, callee, is_uniform
from overlap_hlo.ir.lookthrough import (DOTS, add_leaves, merged_dim, producer,
                                        users_through_views)
from overlap_hlo.ir.ops import ELEMENTWISE, as_op, defining_op

BRANCHING = ("stablehlo.case", "stablehlo.if")
COLLECTIVES = ("stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_reduce",
               "stablehlo.all_to_all")
# Ops a collective's result passes through, row by row, on its way to the next dot
# (the ops overlap-sequence-parallel moves): a call among them is inlined too.
ROW_WISE = ELEMENTWISE | frozenset({"stablehlo.broadcast_in_dim", "stablehlo.transpose",
                                    "stablehlo.reshape", "stablehlo.reduce",
                                    "sdy.sharding_constraint"})
MAX_ROW_WISE_OPS = 256   # ops followed from one collective's result
# Rounds of call inlining (a layer's call of a call receives the value one round later).
MAX_INLINE_ROUNDS = 16


def normalize(module_op: ir.Operation) -> None:
    """Every rewrite above, in place."""
    collectives, branching, callers = _scan(module_op)
    if not collectives:
        return
    if inline_identical_branches(branching):   # the other branches' ops are gone
        collectives, _, callers = _scan(module_op)
    bodies: dict[str, ir.Operation] = {}
    if inline_loop_bodies(collectives, callers, bodies):   # its collectives are new ops
        _erase_unused_private(module_op, bodies)
        collectives, _, callers = _scan(module_op)
    inlined: dict[str, ir.Operation] = {}
    for _ in range(MAX_INLINE_ROUNDS):
        near = _near(collectives)   # read again only after a rewrite
        if not inline_calls(near, inlined):
            break
    if inlined:   # `near` was read before the last inlining
        _erase_unused_private(module_op, inlined)
        near = _near(collectives)
    dots = [op for op in near if op.name == "stablehlo.dot"]
    for dot in dots:
        _as_dot_general(dot)
    if dots:
        near = _near(collectives)
    for dot in [op for op in near if op.name == "stablehlo.dot_general"]:
        _fold_transpose(dot)
    for collective in collectives:
        if collective.name == "stablehlo.all_reduce":
            collective = _hoist_out_of_all_reduce(collective)
        if collective.name in ("stablehlo.all_reduce", "stablehlo.reduce_scatter"):
            _sum_of_dots(collective)
        if collective.name == "stablehlo.reduce_scatter":
            _scatter_before_split(collective)


# Ops that commute with an all_reduce's sum, applied to its result instead.
HOISTED = ("stablehlo.negate", "stablehlo.multiply", "stablehlo.reshape",
           "stablehlo.transpose")
MAX_LINEAR_OPS = 64   # linear ops rewritten in one collective's sum


def _single_use_op(value: ir.Value) -> ir.Operation | None:
    op = defining_op(value)
    if op is None or len(op.results) != 1 or len(list(value.uses)) != 1:
        return None
    return op


def _reaches_dot(value: ir.Value, limit: int = MAX_LINEAR_OPS) -> bool:
    """A dot's result is summed into `value` through linear ops (single-use)."""
    pending = [value]
    while pending and limit > 0:
        limit -= 1
        op = _single_use_op(pending.pop())
        if op is None:
            continue
        if op.name in DOTS:
            return True
        if op.name in ("stablehlo.add", "stablehlo.subtract", *HOISTED):
            pending.extend(op.operands)
    return False


def _uniform_factor(op: ir.Operation) -> int | None:
    """The operand index of a multiply's factor that is the same on every device, when
    the other one is not (None otherwise)."""
    uniform = [is_uniform(v, set()) for v in op.operands]
    if uniform.count(True) != 1:
        return None
    return uniform.index(True)


def _hoist_out_of_all_reduce(reduce: ir.Operation) -> ir.Operation:
    """all_reduce(f(y)) -> f(all_reduce(y)) for f a negation, a scale by a uniform
    value, a reshape or a transpose (single-use), while y still sums a dot; returns
    the all_reduce (a new op when one moved)."""
    if len(reduce.operands) != 1 or len(reduce.results) != 1:
        return reduce
    for _ in range(MAX_LINEAR_OPS):
        op = _single_use_op(reduce.operands[0])
        if op is None or op.name not in HOISTED:
            return reduce
        index = 0
        if op.name == "stablehlo.multiply":
            factor = _uniform_factor(op)
            if factor is None:
                return reduce
            index = 1 - factor
        inner = op.operands[index]
        if not _reaches_dot(inner):
            return reduce
        with reduce.location, ir.InsertionPoint(reduce):
            moved = reduce.clone(ip=ir.InsertionPoint(reduce))
            moved.operands[0] = inner
            moved.results[0].set_type(inner.type)
        with op.location, ir.InsertionPoint(reduce):
            applied = op.clone(ip=ir.InsertionPoint(reduce))
            applied.operands[index] = moved.results[0]
        reduce.results[0].replace_all_uses_with(applied.results[0])
        # keep the one root op: the clone takes over, the originals go
        reduce.erase()
        op.erase()
        reduce = moved
    return reduce


def _sum_of_dots(collective: ir.Operation) -> None:
    """The single-use subtract / negate tree under the collective's operand made a
    tree of adds: a - b -> a + (-b); -(a + b) -> -a + -b; -(-a) -> a;
    -dot(x, w) -> dot(-x, w)."""
    if len(collective.operands) != 1 or not _reaches_dot(collective.operands[0]):
        return
    pending = [collective.operands[0]]
    for _ in range(MAX_LINEAR_OPS):
        if not pending:
            return
        op = _single_use_op(pending.pop())
        if op is None:
            continue
        if op.name == "stablehlo.add":
            pending.extend(op.operands)
        elif op.name == "stablehlo.subtract":
            with op.location, ir.InsertionPoint(op):
                negated = stablehlo.NegOp(op.operands[1]).result
                total = stablehlo.AddOp(op.operands[0], negated).result
            op.results[0].replace_all_uses_with(total)
            op.erase()
            pending.append(total)
        elif op.name == "stablehlo.negate":
            inner = _single_use_op(op.operands[0])
            replaced = _negated(op.operands[0], op)
            if replaced is not None:
                op.results[0].replace_all_uses_with(replaced)
                op.erase()
                if inner is not None and not list(inner.results[0].uses):
                    inner.erase()   # the add or dot now built negated
                pending.append(replaced)


def _negated(value: ir.Value, anchor: ir.Operation) -> ir.Value | None:
    """-value built before `anchor` without a negate of a dot or of a sum: None when
    `value` is none of a dot, an add or a negate (single-use)."""
    op = _single_use_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.negate":
        return op.operands[0]
    with anchor.location, ir.InsertionPoint(anchor):
        if op.name == "stablehlo.add":
            return stablehlo.AddOp(stablehlo.NegOp(op.operands[0]).result,
                                   stablehlo.NegOp(op.operands[1]).result).result
        if op.name == "stablehlo.dot_general":
            lhs = stablehlo.NegOp(op.operands[0]).result
            dot = op.clone(ip=ir.InsertionPoint(anchor))
            dot.operands[0] = lhs
            return dot.results[0]
    return None


def _scattered_source_dim(shape_in, shape_out, dim: int, parts: int) -> int | None:
    """The dim of `shape_in` whose `parts` contiguous blocks are those of dim `dim` of
    the reshape to `shape_out`, when the reshape splits or merges it (None if neither:
    a reshape that keeps the dim is a view the passes see through)."""
    split = merged_dim(shape_out, shape_in, dim)   # dim and those after it make one dim
    if split is not None and split[1] > 1:
        return split[0]
    for source in range(len(shape_in)):            # one dim and those after it make dim
        merged = merged_dim(shape_in, shape_out, source)
        if merged is not None and merged[0] == dim and merged[1] > 1:
            return source if shape_in[source] % parts == 0 else None
    return None


def _scatter_before_split(scatter: ir.Operation) -> None:
    """reduce_scatter(reshape(y)) on a dim that is the leading part of a dim of y the
    reshape splits, or that dims of y merge into with the first divisible by the
    group, y made by dots -> reshape(reduce_scatter(y)) on that dim of y."""
    if len(scatter.operands) != 1:
        return
    value = scatter.operands[0]
    reshape = defining_op(value)
    if reshape is None or reshape.name != "stablehlo.reshape":
        return
    dim = ir.IntegerAttr(scatter.attributes["scatter_dimension"]).value
    source = reshape.operands[0]
    parts = value.type.shape[dim] // scatter.results[0].type.shape[dim]
    split = _scattered_source_dim(source.type.shape, value.type.shape, dim, parts)
    if split is None or not any(op.name in DOTS
                                for op in add_leaves(producer(source, split)[0])):
        return
    shape = list(source.type.shape)
    shape[split] //= parts
    with scatter.location:
        moved = scatter.clone(ip=ir.InsertionPoint(scatter))
        moved.operands[0] = source
        moved.results[0].set_type(ir.RankedTensorType.get(shape, source.type.element_type))
        moved.attributes["scatter_dimension"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), split)
        back = stablehlo.ReshapeOp(scatter.results[0].type, moved.results[0],
                                   ip=ir.InsertionPoint(scatter))
    scatter.results[0].replace_all_uses_with(back.result)
    scatter.erase()
    if not list(reshape.results[0].uses):
        reshape.erase()


def _scan(module_op: ir.Operation
          ) -> tuple[list[ir.Operation], list[ir.Operation], Callers]:
    """The all_gathers and reduce_scatters of the module, the if/case ops that hold
    one of them or a dot (innermost first), and who calls each function."""
    collectives: list[ir.Operation] = []
    branching: dict[int, tuple[int, ir.Operation]] = {}   # by identity: (depth, op)
    callers = Callers()

    def visit(op):
        name = op.name
        callers.note(op, name)
        if name in COLLECTIVES or name in DOTS:
            if name in COLLECTIVES:
                collectives.append(op)
            chain, parent = [], op.parent
            while parent is not None and parent.name != "builtin.module":
                chain.append(parent)
                parent = parent.parent
            for depth, ancestor in enumerate(reversed(chain)):
                if ancestor.name in BRANCHING:
                    branching[hash(ancestor)] = (depth, ancestor)
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    ordered = sorted(branching.values(), key=lambda item: -item[0])
    return collectives, [op for _, op in ordered], callers


def _neighbours(collective: ir.Operation) -> list[ir.Operation]:
    """The ops a collective's result reaches through views (an all_gather's, an
    all_to_all's) or through row-wise ops (an all_gather's, an all_reduce's), and the
    ops whose sum (of single-use adds) it reduces through views (a reduce_scatter's, an
    all_reduce's, an all_to_all's operand)."""
    if len(collective.results) != 1 or len(collective.operands) != 1:
        return []
    attrs = collective.attributes
    found = []
    name = collective.name
    result = collective.results[0]
    if name in ("stablehlo.all_gather", "stablehlo.all_to_all"):
        key = "all_gather_dim" if name == "stablehlo.all_gather" else "concat_dimension"
        dim = ir.IntegerAttr(attrs[key]).value
        found += [use.user for use in users_through_views(result, dim)[0]]
    if name in ("stablehlo.all_gather", "stablehlo.all_reduce"):
        found += _row_wise_users(result)
    if name != "stablehlo.all_gather":
        key = {"stablehlo.reduce_scatter": "scatter_dimension",
               "stablehlo.all_to_all": "split_dimension"}.get(name)
        dim = ir.IntegerAttr(attrs[key]).value if key else 0
        operand = collective.operands[0]
        if isinstance(operand.type, ir.RankedTensorType) and dim < operand.type.rank:
            found += add_leaves(producer(operand, dim)[0])
    return found


def _row_wise_users(root: ir.Value) -> list[ir.Operation]:
    """The ops `root` reaches through ROW_WISE ops (those and the first others), at most
    MAX_ROW_WISE_OPS of them, in the block that defines it."""
    found, seen, pending = [], set(), [root]
    while pending and len(found) < MAX_ROW_WISE_OPS:
        for use in pending.pop().uses:
            user = as_op(use.owner)
            if hash(user) in seen:
                continue
            seen.add(hash(user))
            found.append(user)
            if user.name in ROW_WISE:
                pending.extend(user.results)
    return found


def _unique(ops) -> list[ir.Operation]:
    return list({hash(op): op for op in ops}.values())


def _near(collectives: list[ir.Operation]) -> list[ir.Operation]:
    """The collectives' `_neighbours`, each once, in order."""
    return _unique(op for c in collectives for op in _neighbours(c))


def inline_calls(near: list[ir.Operation], inlined: dict[str, ir.Operation]) -> int:
    """Inline each func.call among the collectives' neighbours `near` (one that reads
    an all_gather's result through views, or whose result a reduce_scatter scatters);
    returns how many, and notes each callee in `inlined`."""
    calls = [op for op in near if op.name == "func.call"]
    count = 0
    for call in calls:
        func = callee(call)
        if func is not None:
            inlined[ir.StringAttr(func.attributes["sym_name"]).value] = func
            _inline(call, func)
            count += 1
    return count


def inline_loop_bodies(collectives: list[ir.Operation], callers: Callers,
                       inlined: dict[str, ir.Operation]) -> int:
    """Inline the call that is a while loop's body (jax 0.10.2 calls a scan's body as
    a private function) where that function, called once, holds a collective: the
    residual it updates is then a value of the loop's own body, and a layer's weights
    are slices of the stacked ones there, as jax 0.12 emits them. Returns how many."""
    count = 0
    for collective in collectives:
        func = collective.parent
        while func is not None and func.name != "func.func":
            func = func.parent
        if func is None or "sym_visibility" not in func.attributes:
            continue
        name = ir.StringAttr(func.attributes["sym_name"]).value
        calls = callers.calls.get(name, [])
        if name in inlined or name in callers.other or len(calls) != 1:
            continue
        call = calls[0]
        if call.parent is None or call.parent.name != "stablehlo.while":
            continue
        inlined[name] = as_op(func)
        _inline(call, as_op(func))
        count += 1
    return count


def _inline(call: ir.Operation, func: ir.Operation) -> None:
    """Clone `func`'s body before `call`, reading the call's operands for its
    arguments, and replace the call's results."""
    body = func.regions[0].blocks[0]
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


def _fold_transpose(dot: ir.Operation) -> None:
    """`transpose(dot_general(a, b), [1, 0])`, the dot's only use, as `dot_general(b, a)`
    (two matrices, no batch dims): JAX's weight gradients come transposed, and a ring
    would otherwise sum the product and the compiler transpose the sum afterwards."""
    users = list(dot.results[0].uses)
    if len(users) != 1 or "algorithm" in dot.attributes:
        return
    transpose = users[0].owner
    lhs, rhs = dot.operands
    if (transpose.name != "stablehlo.transpose"
            or list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"])) != [1, 0]
            or lhs.type.rank != 2 or rhs.type.rank != 2):
        return
    numbers = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    if numbers.lhs_batching_dimensions or len(numbers.lhs_contracting_dimensions) != 1:
        return
    attrs = {"dot_dimension_numbers": stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[], rhs_batching_dimensions=[],
        lhs_contracting_dimensions=list(numbers.rhs_contracting_dimensions),
        rhs_contracting_dimensions=list(numbers.lhs_contracting_dimensions))}
    if "precision_config" in dot.attributes:
        attrs["precision_config"] = ir.ArrayAttr.get(
            list(ir.ArrayAttr(dot.attributes["precision_config"]))[::-1])
    with ir.InsertionPoint(dot), dot.location:
        swapped = ir.Operation.create(
            "stablehlo.dot_general", results=[transpose.results[0].type],
            operands=[rhs, lhs], attributes=attrs)
    transpose.results[0].replace_all_uses_with(swapped.results[0])
    transpose.erase()
    dot.erase()


def inline_identical_branches(branching: list[ir.Operation]) -> int:
    """Inline those of `branching` (if/case ops, innermost first) whose branches are
    identical; returns how many."""
    count = 0
    for op in branching:
        if _identical(op.regions):
            _inline_first_branch(op)
            count += 1
    return count


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
