"""Elementwise epilogues of an all_gather ring's dots, and elementwise prologues of a
reduce_scatter ring's dots, computed block by block.

A gated MLP combines the products of two dots that read one all_gather:
`silu(g @ w_gate) * (g @ w_up)`. As the ring builds each product block by block
(free or batch dim), the elementwise ops that combine them can run on each block
too: the ring then keeps one buffer, the combination's, instead of one per dot
(the TPU temporaries of a SwiGLU layer drop by a product's size). One dot's
activation (`gelu(g @ w1)`) runs on each block too: the TPU compiler fuses it into the
block's dot as its output, as it did into the whole dot, where replayed on the next
dot's blocks (a prologue, below) it is recomputed for every tile of that dot
(benchmarks/RESULTS.md). Elementwise ops compute each element
from the same elements of their operands, so the blocks give exactly the values the
whole tensors would.

An epilogue is found only when it is safe: one or more of the ring's dots
with the same result block layout, whose results nothing but the epilogue reads; ops
that are elementwise over that shape (or calls of private functions made only of
such ops, like JAX's `silu`), reading those results, each other, and constants
(splat constants, scalars broadcast); and exactly one value that anything outside
the epilogue reads.

A prologue is the other way round: the elementwise ops that make a reduce_scatter
dot's sliced operand from tensors of the same shape (the gelu between an MLP's two
dots). The ring slices those tensors and replays the ops on each block, so they fuse
into the block's dot as they fused into the whole dot before the rewrite.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir.dominance import callee
from overlap_hlo.ir.ops import ELEMENTWISE, as_op, defining_op
from overlap_hlo.rewrite import builders as b

# Ops whose result may hold one value in every element (a splat constant, a broadcast
# scalar): `uniform` checks that it does.
SPLAT_OPS = frozenset({"stablehlo.constant", "stablehlo.broadcast_in_dim"})


def _shape(value: ir.Value) -> list[int] | None:
    return list(value.type.shape) if isinstance(value.type, ir.RankedTensorType) else None


def _scalar_constant(value: ir.Value) -> ir.Operation | None:
    """The constant a scalar is, directly or converted (JAX writes a Python float in a
    bf16 expression as convert(f32 constant)); None otherwise."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.convert" and _shape(value) == []:
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.constant" or _shape(op.results[0]) != []:
        return None
    return op


def uniform(value: ir.Value, shape: list[int]) -> bool:
    """A value of `shape` that is the same constant everywhere: a splat constant, or a
    scalar constant (maybe converted) broadcast."""
    op = defining_op(value)
    if op is None or _shape(value) != shape:
        return False
    if op.name == "stablehlo.constant":
        return ir.DenseElementsAttr(op.attributes["value"]).is_splat
    if op.name == "stablehlo.broadcast_in_dim":
        return _shape(op.operands[0]) == [] and _scalar_constant(op.operands[0]) is not None
    return False


def elementwise_call(call: ir.Operation, shape: list[int]) -> bool:
    """A func.call of one function whose body is elementwise over `shape`: every
    argument and result has that shape, every op is elementwise or uniform."""
    func = callee(call)
    if func is None or len(call.results) != 1:
        return False
    body = func.regions[0].blocks[0]
    if any(_shape(arg) != shape for arg in body.arguments):
        return False
    for op in body.operations:
        op = op.operation
        if op.name == "func.return":
            continue
        if op.name in SPLAT_OPS:
            if not uniform(op.results[0], shape) and _shape(op.results[0]) != []:
                return False
        elif op.name not in ELEMENTWISE or any(_shape(r) != shape for r in op.results):
            return False
    return _shape(call.results[0]) == shape


def is_elementwise(op: ir.Operation, shape: list[int]) -> bool:
    if op.name == "func.call":
        return elementwise_call(op, shape)
    return (op.name in ELEMENTWISE and len(op.results) == 1
            and _shape(op.results[0]) == shape
            and all(_shape(v) == shape for v in op.operands))


@dataclass(frozen=True)
class Epilogue:
    """Elementwise ops over the results of `sources` (in program order) with one
    value, `output`, read outside them."""

    sources: tuple[ir.Value, ...]
    ops: tuple[ir.Operation, ...]
    output: ir.Value

    def replay(self, blocks: Sequence[ir.Value], block_type: Callable[[ir.Type], ir.Type]
               ) -> ir.Value:
        """The output's block from the sources' blocks, built at the current insertion
        point; `block_type(t)` is a whole-tensor type's block type."""
        values = dict(zip(self.sources, blocks))
        for op in self.ops:
            values[op.results[0]] = _replay(op, values, block_type)
        return values[self.output]


def find_epilogue(sources: Sequence[ir.Value]) -> Epilogue | None:
    """The elementwise epilogue of `sources` (results of one shape), or None."""
    if not sources or len({tuple(_shape(v)) for v in sources}) != 1:
        return None
    shape = _shape(sources[0])
    block = as_op(sources[0].owner).block
    known = set(sources)
    ops: list[ir.Operation] = []
    grew = True
    while grew:
        grew = False
        for value in list(known):
            for use in value.uses:
                user = as_op(use.owner)
                if (user in ops or user.block != block or not is_elementwise(user, shape)
                        or not all(v in known or uniform(v, shape) for v in user.operands)):
                    continue
                ops.append(user)
                known.add(user.results[0])
                grew = True
    if not ops:
        return None
    inside = set(ops)
    read_outside = [v for v in known if any(as_op(u.owner) not in inside for u in v.uses)]
    if len(read_outside) != 1 or read_outside[0] in sources:
        return None
    _in_block_order(ops)
    return Epilogue(tuple(sources), tuple(ops), read_outside[0])


# Ops a prologue may hold: enough for gelu, silu and their kin.
MAX_PROLOGUE_OPS = 64


def find_prologue(output: ir.Value) -> Epilogue | None:
    """The elementwise ops that compute `output` from tensors of its shape (its
    sources) and uniform constants, when each of their results but `output` is read
    only by the next of them: a reduce_scatter ring slices the sources and replays the
    ops on each block, so the ops run fused into the block's dot (a gelu between an
    MLP's two dots). None when `output` is not made that way."""
    shape = _shape(output)
    producer = defining_op(output)
    if shape is None or producer is None or not is_elementwise(producer, shape):
        return None
    ops: list[ir.Operation] = []
    sources: list[ir.Value] = []
    pending = [output]
    while pending:
        value = pending.pop()
        op = defining_op(value)
        inner = value is output or len(list(value.uses)) == 1
        if op is None or not inner or not is_elementwise(op, shape) or \
                len(ops) >= MAX_PROLOGUE_OPS or op.block != producer.block:
            if value not in sources:
                sources.append(value)
            continue
        if op not in ops:
            ops.append(op)
            pending += [v for v in op.operands if not uniform(v, shape)]
    if output in sources:
        return None
    _in_block_order(ops)
    return Epilogue(tuple(sources), tuple(ops), output)


def _in_block_order(ops: list[ir.Operation]) -> None:
    """Sort `ops` (of one block) by their position in it. MLIR keeps the block's order
    numbered, so this costs no walk over the whole block for each site (an index of
    the block did: quadratic in a module's sites)."""
    ops.sort(key=functools.cmp_to_key(
        lambda a, b: 0 if a == b else -1 if a.operation.is_before_in_block(b.operation) else 1))


def _uniform_block(value: ir.Value, new_type: ir.Type) -> ir.Value:
    op = defining_op(value)
    if op.name == "stablehlo.constant":
        attr = ir.DenseElementsAttr(op.attributes["value"])
        return stablehlo.constant(ir.DenseElementsAttr.get_splat(new_type, attr.get_splat_value()))
    scalar = op.operands[0]
    value = stablehlo.constant(_scalar_constant(scalar).attributes["value"])
    if defining_op(scalar).name == "stablehlo.convert":
        value = stablehlo.convert(scalar.type, value)
    return stablehlo.broadcast_in_dim(new_type, value, ir.DenseI64ArrayAttr.get([]))


def _operand(value: ir.Value, values: dict, block_type) -> ir.Value:
    if value in values:
        return values[value]
    return _uniform_block(value, block_type(value.type))


def _replay(op: ir.Operation, values: dict, block_type) -> ir.Value:
    """`op` on blocks: same name and attributes, block-shaped operands and result; a
    call's body is inlined."""
    operands = [_operand(v, values, block_type) for v in op.operands]
    if op.name == "func.call":
        body = callee(op).regions[0].blocks[0]
        inner = dict(zip(body.arguments, operands))
        for inner_op in body.operations:
            inner_op = inner_op.operation
            if inner_op.name == "func.return":
                return inner[inner_op.operands[0]]
            if inner_op.name in SPLAT_OPS and _shape(inner_op.results[0]) == []:
                inner[inner_op.results[0]] = _rebuilt(   # a scalar: as is
                    inner_op, [inner.get(v, v) for v in inner_op.operands],
                    inner_op.results[0].type)
                continue
            inner[inner_op.results[0]] = _replay_inner(inner_op, inner, block_type)
        raise AssertionError("a func.func body ends with func.return")
    return _rebuilt(op, operands, block_type(op.results[0].type))


def _rebuilt(op: ir.Operation, operands: list[ir.Value], result_type: ir.Type) -> ir.Value:
    """`op`, with its attributes, created at the insertion point on `operands`."""
    return ir.Operation.create(op.name, results=[result_type], operands=operands,
                               attributes={name: op.attributes[name]
                                           for name in op.attributes}).result


def _replay_inner(op: ir.Operation, values: dict, block_type) -> ir.Value:
    """An op of an inlined body: uniform values rebuilt on the block shape."""
    if op.name in SPLAT_OPS:
        return _uniform_block(op.results[0], block_type(op.results[0].type))
    return _replay(op, values, block_type)


def block_type_for(result_dim: int, size: int) -> Callable[[ir.Type], ir.Type]:
    """Whole-tensor type -> the type of one block of `size` along `result_dim`."""
    return lambda t: b.with_dim(ir.RankedTensorType(t), result_dim, size)
