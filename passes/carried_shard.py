"""A while loop that carries a shard instead of the whole value (a scanned layer's
residual under overlap-sequence-parallel).

In `h = scan(h + psum(f(norm(h))))` the residual enters each iteration whole, is
normalised before the first dot and updated by the psum's all_gather half. When the
ops reading it move onto the shard, the loop can carry this device's rows instead:
the residual enters as its rows (it is the same on every device of the group), the
body yields the moved update's shard, and whatever reads the loop's result reads an
all_gather of it. The body's own readers that do not move read an all_gather of the
carried shard at its top.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo.ir.ops import as_op
from overlap_hlo.rewrite import builders as b


@dataclass(frozen=True)
class Carried:
    """Carried value `index` of `loop`, gathered along `dim` like `seed`."""

    loop: ir.Operation
    index: int
    dim: int
    seed: ir.Operation


def loop_of_body(block: ir.Block) -> ir.Operation | None:
    """The stablehlo.while whose body `block` is."""
    parent = block.owner
    if parent is None or as_op(parent).name != "stablehlo.while":
        return None
    loop = as_op(parent)
    return loop if loop.regions[1].blocks[0] == block else None


def can_carry_shard(loop: ir.Operation, index: int, parts: int, dim: int) -> bool:
    """The condition does not read the value and its dim splits into `parts`."""
    cond = loop.regions[0].blocks[0]
    value_type = loop.results[index].type
    return (not list(cond.arguments[index].uses)
            and isinstance(value_type, ir.RankedTensorType)
            and value_type.shape[dim] % parts == 0)


def carry_shard(carried: Carried, ring, rows_of, scan) -> None:
    """Retype the loop to carry the shard of value `carried.index`: the entering value
    becomes its rows (`rows_of(value, dim, parts, position)`), the condition's and
    body's arguments and the result the shard's type, and the result's readers read
    an all_gather of it, built after the loop (new channels from `scan`). The body's
    yield is the caller's to set."""
    loop, i, dim = carried.loop, carried.index, carried.dim
    whole = loop.results[i].type
    with loop.location, ir.InsertionPoint(loop):
        shard = b.with_dim(whole, dim, whole.shape[dim] // ring.size)
        position = b.ring_position(ring)
        loop.operands[i] = rows_of(loop.operands[i], dim, ring.size, position)
    loop.regions[0].blocks[0].arguments[i].set_type(shard)
    loop.regions[1].blocks[0].arguments[i].set_type(shard)
    readers = [(as_op(use.owner), use.operand_number) for use in loop.results[i].uses]
    loop.results[i].set_type(shard)
    if readers:
        with loop.location, ir.InsertionPoint(_after(loop)):
            gathered = b.all_gather_like(carried.seed, loop.results[i], dim, whole, scan)
        for reader, number in readers:
            reader.operands[number] = gathered


def gather_at_top(block: ir.Block, argument: ir.Value, readers, seed: ir.Operation,
                  dim: int, whole: ir.Type, scan) -> None:
    """`readers` ((op, operand number)) of the carried shard `argument` read an
    all_gather of it, built at the top of `block`."""
    if not readers:
        return
    first = block.operations[0]
    with first.location, ir.InsertionPoint(first):
        gathered = b.all_gather_like(seed, argument, dim, whole, scan)
    for reader, number in readers:
        reader.operands[number] = gathered


def _after(op: ir.Operation) -> ir.Operation:
    """The op after `op` in its block (a loop is never its block's terminator)."""
    ops = [as_op(o) for o in op.block.operations]
    return ops[[hash(o) for o in ops].index(hash(op)) + 1]
