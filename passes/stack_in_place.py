"""overlap-stack-in-place: a ring's buffer that a scanned loop then stacks is assembled
in the stack itself.

A scanned layer saves what its backward pass reads by writing each value whole into a
stacked buffer, one slice per iteration: `S' = dynamic_update_slice(S, broadcast(R),
i, 0, ..)`, written out or as a call of a function that is only that (JAX's
`dynamic_update_index_in_dim`). When R is a buffer our rings assemble (uninitialised
storage, a `custom_call @AllocateBuffer`, written block by block through the ring's
loops), the copy into the stack is one more pass over R that the compiler cannot fuse:
a loop's result is not written in place into another buffer. Here the blocks are
written into slice i of the stack instead, and the stack's initial value becomes
uninitialised storage too (each iteration of the scan writes its whole slice).

Rewritten only when all of this is proved: the stack is carried by the loop whose body
holds the update (read by nothing else, yielded as updated), i is that loop's counter
from 0 to the stack's leading size in steps of 1, the update's other starts are 0, R
is read by nothing but the update, and each buffer on the way from the allocation to R
is read once (by the next update, a loop's carried value or an optimization_barrier).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dominance import callee
from overlap_hlo.ir.ops import ALLOCATION, as_op, defining_op, is_allocation
from overlap_hlo.rewrite import builders as b
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.module_pass import ModulePass, verification_error
from overlap_hlo.rewrite.site import Site, SiteLog


class Step(enum.Enum):
    """How the buffer passes an op on its way from the allocation to R."""

    UPDATE = "a dynamic_update_slice writes a block into it"
    ARGUMENT = "it enters a loop as argument `index`"
    RESULT = "it leaves a loop as result `index`"
    BARRIER = "it passes an optimization_barrier as result `index`"


@dataclass(frozen=True)
class Link:
    """One step from the allocation to R."""

    step: Step
    op: ir.Operation
    index: int = 0


@dataclass(frozen=True)
class Stacked:
    """`update` (a dynamic_update_slice, or a func.call of one) writes R (the end of
    `chain`) into slice `counter` of the stack carried as argument `slot` of `loop`."""

    update: ir.Operation
    loop: ir.Operation
    slot: int
    counter: ir.Value
    chain: tuple[Link, ...]


@dataclass(frozen=True)
class OverlapStackInPlace(ModulePass):
    """Assemble a ring's buffer in the scanned loop's stack that it is copied into."""

    name: ClassVar[str] = "overlap-stack-in-place"
    root: ClassVar[type] = stablehlo.DynamicUpdateSliceOp
    requires: ClassVar[str] = ALLOCATION
    creates: ClassVar[frozenset[str]] = frozenset({ALLOCATION})
    logs_sites: ClassVar[bool] = False
    summary: ClassVar[str] = (
        "a ring's buffer copied whole into a scanned loop's stacked residuals: the ring "
        "writes its blocks into the stack")

    def apply(self, module_op: ir.Operation, records: list[Site], broken: dict[int, str],
              careful: bool, log: SiteLog) -> tuple[int, str] | None:
        """Rewrite every stacked ring buffer found (nothing is recorded: these are not
        user sites, and the rings' own sites are already logged)."""
        found: list[Stacked] = []

        def visit(op):
            if op.name in UPDATES:
                stacked = stacked_buffer(as_op(op))
                if stacked is not None:
                    found.append(stacked)
            return ir.WalkResult.ADVANCE

        module_op.walk(visit)
        for number, stacked in enumerate(found):
            if number in broken:   # reported, left as it was
                records.append(Site.of(stacked.update.location, log.input_name, self.name,
                                       False, kind=Kind.INTERNAL_ERROR, reason=(
                                           "internal error: assembling a ring's buffer in its "
                                           f"stack failed ({broken[number]}); left as it was "
                                           "(please report it)")))
                continue
            try:
                assemble_in_stack(stacked)
            except Exception as err:   # noqa: BLE001 - the base restores and retries
                return number, f"{type(err).__name__}: {err}"
            error = verification_error(module_op) if careful else None
            if error is not None:
                return number, error
        if len(found) > len(broken):
            log.changed(self.created(), False)
        return None


UPDATES = ("stablehlo.dynamic_update_slice", "func.call")


def stacked_buffer(update: ir.Operation) -> Stacked | None:
    """The Stacked that `update` is, or None."""
    parts = _whole_slice_update(update)
    if parts is None:
        return None
    stack, source, counter = parts
    if not (isinstance(counter, ir.BlockArgument) and isinstance(stack, ir.BlockArgument)):
        return None
    if not (_used_once(stack) and _used_once(source)):
        return None
    body = stack.owner
    if counter.owner != body or update.block != body:
        return None
    loop = as_op(body.owner)
    if loop.name != "stablehlo.while" or loop.regions[1].blocks[0] != body:
        return None
    slot = stack.arg_number
    yielded = _terminator(body).operands
    if yielded[slot] != update.results[0] or \
            list(loop.regions[0].blocks[0].arguments[slot].uses):
        return None
    if not _counts_over(loop, counter.arg_number, stack.type.shape[0]):
        return None
    chain = _chain(source, body)
    if chain is None:
        return None
    return Stacked(update, loop, slot, counter, chain)


def _whole_slice_update(op: ir.Operation) -> tuple[ir.Value, ir.Value, ir.Value] | None:
    """(S, R, i) when `op` is `S' = dynamic_update_slice(S, broadcast(R), i, 0, ..)` or a
    call of a function whose body is only that, of its arguments (S, R, i); else None."""
    if op.name == "func.call":
        function = callee(op)
        if function is None or len(op.operands) != 3 or len(op.results) != 1:
            return None
        body = function.regions[0].blocks[0]
        returned = _terminator(body).operands
        inner = defining_op(returned[0]) if len(returned) == 1 else None
        if inner is None or inner.name != "stablehlo.dynamic_update_slice" or \
                not all(o.operation.name in _WRAPPER_OPS for o in body.operations):
            return None
        parts = _whole_slice_update(inner)
        if parts is None or list(parts) != list(body.arguments):
            return None
        return op.operands[0], op.operands[1], op.operands[2]
    if len(op.operands) < 3:   # a scalar: no start index, no slice
        return None
    stack, value, counter, *starts = op.operands
    if not isinstance(counter, ir.BlockArgument):   # a ring's updates: at computed offsets
        return None
    source = _whole_slice_source(value, stack.type)
    if source is None or not all(_is_zero(start) for start in starts) or \
            not _used_once(value):
        return None
    return stack, source, counter


# What a function that is only a whole-slice update holds.
_WRAPPER_OPS = frozenset({"stablehlo.constant", "stablehlo.broadcast_in_dim",
                          "stablehlo.reshape", "stablehlo.dynamic_update_slice",
                          "func.return"})


def assemble_in_stack(stacked: Stacked) -> None:
    """Write the chain's blocks into the stack's slice, drop the copy, and start the
    stack uninitialised."""
    update, counter = stacked.update, stacked.counter
    stack = update.operands[0]
    stack_type = stack.type
    allocation = defining_op(stacked.chain[0].op.operands[0])
    stacked.chain[0].op.operands[0] = stack
    if not list(allocation.results[0].uses):
        allocation.erase()
    last = stack
    for link in stacked.chain:
        if link.step is Step.UPDATE:
            last = _update_in_slice(link.op, counter)
        elif link.step is Step.ARGUMENT:
            link.op.regions[0].blocks[0].arguments[link.index].set_type(stack_type)
            link.op.regions[1].blocks[0].arguments[link.index].set_type(stack_type)
        else:   # a loop's or a barrier's result
            link.op.results[link.index].set_type(stack_type)
            last = link.op.results[link.index]
    copied = defining_op(update.operands[1]) if update.name != "func.call" else None
    update.results[0].replace_all_uses_with(last)
    update.erase()
    if copied is not None:   # the broadcast of R
        copied.erase()
    loop = stacked.loop
    with loop.location, ir.InsertionPoint(loop):
        loop.operands[stacked.slot] = b.buffer(stack_type, allocate=True)


def _update_in_slice(op: ir.Operation, counter: ir.Value) -> ir.Value:
    """`op` (an update of R) as the same update of slice `counter` of the stack."""
    buffer, block, *starts = op.operands
    with op.location, ir.InsertionPoint(op):
        shape = [1, *ir.RankedTensorType(block.type).shape]
        block = stablehlo.reshape(ir.RankedTensorType.get(
            shape, ir.RankedTensorType(block.type).element_type), block)
        new = stablehlo.DynamicUpdateSliceOp(buffer, block, [counter, *starts])
    op.results[0].replace_all_uses_with(new.result)
    op.erase()
    return new.result


def _chain(value: ir.Value, body: ir.Block) -> tuple[Link, ...] | None:
    """The links from an allocation in `body` to `value` (R), each buffer on the way
    read once and leaving each loop in the slot it entered; None when `value` is not so
    assembled."""
    links: list[Link] = []
    entered: list[Link] = []   # the loops whose result the chain came in by
    while True:
        op = defining_op(value)
        if op is None:   # a loop body's argument: continue at the loop's operand
            loop = as_op(value.owner.owner)
            if loop.name != "stablehlo.while" or loop.regions[1].blocks[0] != value.owner \
                    or list(loop.regions[0].blocks[0].arguments[value.arg_number].uses):
                return None
            if not entered or (entered[-1].op, entered[-1].index) != (loop, value.arg_number):
                return None
            entered.pop()
            links.append(Link(Step.ARGUMENT, loop, value.arg_number))
            value = loop.operands[value.arg_number]
        elif op.name == "stablehlo.dynamic_update_slice":
            links.append(Link(Step.UPDATE, op))
            value = op.operands[0]
            if is_allocation(defining_op(value)):
                return tuple(reversed(links)) if op.block == body else None
        elif op.name == "stablehlo.optimization_barrier":
            links.append(Link(Step.BARRIER, op, value.result_number))
            value = op.operands[value.result_number]
        elif op.name == "stablehlo.while":
            links.append(Link(Step.RESULT, op, value.result_number))
            entered.append(links[-1])
            value = _terminator(op.regions[1].blocks[0]).operands[value.result_number]
        else:
            return None
        if not _used_once(value):
            return None


def _whole_slice_source(value: ir.Value, stack_type) -> ir.Value | None:
    """R when `value` is R with a leading dim of 1 added (broadcast_in_dim or reshape)
    and the stack's slices have R's shape."""
    op = defining_op(value)
    if op is None or op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        return None
    source = op.operands[0]
    if list(ir.RankedTensorType(stack_type).shape[1:]) != list(source.type.shape):
        return None
    if op.name == "stablehlo.broadcast_in_dim" and list(ir.DenseI64ArrayAttr(
            op.attributes["broadcast_dimensions"])) != list(range(1, source.type.rank + 1)):
        return None
    return source


def _counts_over(loop: ir.Operation, index: int, size: int) -> bool:
    """Loop argument `index` starts at 0, steps by 1 and ends the loop at `size`."""
    if _constant(loop.operands[index]) != 0:
        return False
    body, cond = loop.regions[1].blocks[0], loop.regions[0].blocks[0]
    step = defining_op(_terminator(body).operands[index])
    if step is None or step.name != "stablehlo.add":
        return False
    counter = body.arguments[index]
    if not any(step.operands[k] == counter and _constant(step.operands[1 - k]) == 1
               for k in (0, 1)):
        return False
    test = defining_op(_terminator(cond).operands[0])
    return (test is not None and test.name == "stablehlo.compare"
            and str(test.attributes["comparison_direction"]).endswith("LT>")
            and test.operands[0] == cond.arguments[index]
            and _constant(test.operands[1]) == size)


def _constant(value: ir.Value) -> int | None:
    """The integer scalar constant `value` is, or None."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.constant" or value.type.rank != 0:
        return None
    attr = ir.DenseElementsAttr(op.attributes["value"])
    return int(ir.DenseIntElementsAttr(attr)[0]) if isinstance(
        value.type.element_type, ir.IntegerType) else None


def _is_zero(value: ir.Value) -> bool:
    return _constant(value) == 0


def _used_once(value: ir.Value) -> bool:
    uses = iter(value.uses)
    return next(uses, None) is not None and next(uses, None) is None


def _terminator(block: ir.Block) -> ir.Operation:
    return as_op(block.operations[len(block.operations) - 1])
