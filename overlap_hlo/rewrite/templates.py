"""Rings built once per signature in a pass run and cloned for every later site with the
same one (the layers of an unrolled model): cloning a ring's ops costs a fraction of
building them one by one through the bindings.

`Templates.build(parts, inputs, make)` builds with `make()` at the current insertion
point the first time a signature is seen (`signature(parts)`: what the builder reads,
values by type and producing op), and keeps a copy of the ops built in a function of a
scratch module whose arguments stand for `inputs`. A later site with the same signature
gets a clone of that copy: its arguments replaced by the site's own `inputs`, its ops
moved to the insertion point, its locations the current one where the first site's
were its current one, and fresh channel handles in the order the first site took
theirs. No copy is kept when the built ops read a value `inputs` does not list.

With OVERLAP_HLO_CHECK_TEMPLATES=1 (the test suite sets it) every clone is compared with
a fresh build of the same site, op by op (names, attributes but channel handles, types,
locations, operands): a signature that misses something a builder reads fails there.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.ops import as_op
from overlap_hlo.plan.ring_plan import RingPlan
from overlap_hlo.plan.target_form import TargetForm
from overlap_hlo.rewrite import builders

CHANNEL = "channel_handle"
MAX_TEMPLATES = 64   # signatures kept in one pass run


def checking() -> bool:
    return os.environ.get("OVERLAP_HLO_CHECK_TEMPLATES") == "1"


def signature(value) -> object:
    """A hashable description of `value` as a builder reads it: values by type and
    producing op, ops by name, attributes and types, dataclasses field by field (plain
    data ones as they are); TypeError for anything else. Types and attributes are
    uniqued in their context: they stand for themselves."""
    ops: dict[int, tuple] = {}   # each op read once (a ring's dot is also its anchor)

    def of_op(op: ir.Operation) -> tuple:
        key = hash(op)
        if key not in ops:
            ops[key] = op_signature(op)
        return ops[key]

    def of(value) -> object:
        kind = type(value)
        if kind in _PLAIN:
            return value
        if kind is list or kind is tuple:
            return tuple([of(v) for v in value])
        if isinstance(value, ir.Value):
            owner = value.owner
            producer = (of_op(as_op(owner)) if isinstance(owner, (ir.Operation, ir.OpView))
                        else "argument")
            return ("value", value.type, producer)
        if isinstance(value, (ir.Operation, ir.OpView)):
            return of_op(as_op(value))
        if isinstance(value, (ir.Type, ir.Attribute)):
            return value
        if kind is dict:
            return tuple(sorted((repr(k), of(v)) for k, v in value.items()))
        names = _field_names(kind)
        if names is None:
            raise TypeError(f"no signature for a {kind.__name__}")
        return (kind.__name__,) + tuple([of(getattr(value, name)) for name in names])

    return of(value)


@functools.lru_cache(maxsize=None)
def _field_names(kind: type) -> tuple[str, ...] | None:
    """The fields of dataclass `kind`, None for any other type."""
    if not dataclasses.is_dataclass(kind):
        return None
    return tuple(f.name for f in dataclasses.fields(kind))


# Compared by value as they are: hashable, no IR inside.
_PLAIN = frozenset({type(None), bool, int, float, str, RingPlan, TargetForm, Ring})


def op_signature(op: ir.Operation) -> tuple:
    """Name, attributes (in the op's own order: the same for equal ops) and types."""
    attributes = op.attributes
    return (op.name, tuple([(name, attributes[name]) for name in attributes]),
            tuple([v.type for v in op.operands]), tuple([r.type for r in op.results]))


@dataclasses.dataclass
class _Template:
    holder: ir.Operation            # a func.func of the scratch module
    results: list[tuple[int, int]]  # (top-level op index, result number) of each result
    here: list[ir.Operation]        # its ops at the builder's location
    channels: list[tuple[ir.Operation, int, int]]  # (permute, rank in handle order,
                                                   # channel type)
    location: ir.Location           # the one `here` ops have now


class Templates:
    """The templates of one pass run (see the module's doc); `scan` (a ModuleScan) gives
    fresh channel handles."""

    def __init__(self, scan):
        self.scan = scan
        self.channels = scan.new_channel
        self._kept: dict = {}
        self._scratch: ir.Module | None = None
        self._checking = checking()   # read once a pass run

    def build(self, parts, inputs: Sequence[ir.Value],
              make: Callable[[], list[ir.Value]]) -> list[ir.Value]:
        """`make()`'s results, built or cloned at the current insertion point; `parts`
        None: built."""
        anchor = ir.InsertionPoint.current.ref_operation
        try:
            key = None if parts is None else (signature(parts),
                                              tuple(v.type for v in inputs))
        except TypeError:
            key = None
        if key is None or anchor is None:
            return make()
        template = self._kept.get(key)
        if template is not None:
            marker = _marker(anchor) if self._checking else None
            results = self._clone(template, list(inputs), anchor)
            if marker is not None:
                self._check(_built(results, marker), anchor, make)
                marker.erase()
            return results
        marker = _marker(anchor)
        results = make()
        if len(self._kept) < MAX_TEMPLATES:
            kept = self._record(_built(results, marker), list(inputs), results)
            if kept is not None:
                self._kept[key] = kept
        marker.erase()
        return results

    def _record(self, built: list[ir.Operation], inputs: list[ir.Value],
                results: list[ir.Value]) -> _Template | None:
        if self._scratch is None:
            self._scratch = ir.Module.create()
        with ir.InsertionPoint(self._scratch.body):
            holder = func.FuncOp("template", ([v.type for v in inputs], []))
        block = holder.add_entry_block()
        index = {_key(v): i for i, v in enumerate(inputs)}
        clones = [op.clone(ip=ir.InsertionPoint(block)) for op in built]
        inside = {_key(r): c.results[j] for op, c in zip(built, clones)
                  for j, r in enumerate(op.results)}
        copies = _preorder(clones)   # in the order of `_preorder(built)`
        for op in copies:
            for i, operand in enumerate(op.operands):
                k = _key(operand)
                if k in inside:
                    op.operands[i] = inside[k]
                elif k in index:
                    op.operands[i] = block.arguments[index[k]]
                elif not _defined_within(operand, clones):
                    holder.operation.erase()   # reads a value `inputs` does not list
                    return None
        positions = {_key(r): (i, j) for i, op in enumerate(built)
                     for j, r in enumerate(op.results)}
        if any(_key(r) not in positions for r in results):
            holder.operation.erase()
            return None
        here = str(ir.Location.current)
        nested = _preorder(built)
        permutes = [(i, _handle(op)) for i, op in enumerate(nested)
                    if _handle(op) is not None]
        order = sorted(range(len(permutes)), key=lambda k: permutes[k][1])
        return _Template(holder.operation, [positions[_key(r)] for r in results],
                         [copies[i] for i, op in enumerate(nested)
                          if str(op.location) == here],
                         [(copies[permutes[k][0]], order.index(k),
                           stablehlo.ChannelHandle(nested[permutes[k][0]].attributes[CHANNEL])
                           .channel_type) for k in range(len(permutes))],
                         ir.Location.current)

    def _clone(self, template: _Template, inputs: list[ir.Value],
               anchor: ir.Operation) -> list[ir.Value]:
        location = ir.Location.current   # set on the template, then cloned with it
        if location != template.location:   # (layers of one source line share theirs)
            for op in template.here:
                op.location = location
            template.location = location
        fresh = [self.channels() for _ in template.channels]
        for op, rank, channel_type in template.channels:
            op.attributes[CHANNEL] = stablehlo.ChannelHandle.get(fresh[rank], channel_type)
        copy = template.holder.clone(ip=ir.InsertionPoint(self._scratch.body))
        for argument, value in zip(copy.regions[0].blocks[0].arguments, inputs):
            argument.replace_all_uses_with(value)
        ops = _top_level(copy)
        for op in ops:
            op.move_before(anchor)
        copy.erase()
        return [ops[i].results[j] for i, j in template.results]

    def _check(self, cloned: list[ir.Operation], anchor: ir.Operation, make) -> None:
        """AssertionError unless a fresh build at `anchor` is the `cloned` ops again;
        the fresh build leaves no trace (its ops, handles and shared constants)."""
        channel, scalars = self.scan.last_channel, builders.saved_scalars()
        marker = _marker(anchor)
        fresh = _built(make(), marker)
        marker.erase()
        difference = _difference(cloned, fresh)
        for op in reversed(fresh):
            op.erase()
        self.scan.last_channel = channel
        builders.restore_scalars(scalars)
        if difference:
            raise AssertionError(f"a cloned ring differs from a fresh build: {difference}")


def _difference(cloned: list[ir.Operation], fresh: list[ir.Operation]) -> str:
    """Where two op lists differ (names, attributes but channel handles, types,
    locations, regions, and operands: the same value outside, or paired values
    inside), or ""."""
    if len(cloned) != len(fresh):
        return f"{len(cloned)} ops against {len(fresh)}"
    pairs: dict = {}
    ours, theirs = _preorder(cloned), _preorder(fresh)
    if len(ours) != len(theirs):
        return f"{len(ours)} nested ops against {len(theirs)}"
    for a, b in zip(ours, theirs):
        described = f"{a.name} at {a.location} against {b.name} at {b.location}"
        if (a.name, str(a.location), [str(r.type) for r in a.results]) != (
                b.name, str(b.location), [str(r.type) for r in b.results]):
            return described
        if _attributes(a) != _attributes(b):
            return f"attributes of {described}"
        if [len(r.blocks) for r in a.regions] != [len(r.blocks) for r in b.regions]:
            return f"regions of {described}"
        for ra, rb in zip(a.regions, b.regions):
            for ba, bb in zip(ra.blocks, rb.blocks):
                if len(ba.arguments) != len(bb.arguments):
                    return f"block arguments of {described}"
                for x, y in zip(ba.arguments, bb.arguments):
                    pairs[_key(x)] = y
        if len(a.operands) != len(b.operands):
            return f"operands of {described}"
        for x, y in zip(a.operands, b.operands):
            if pairs.get(_key(x), x) != y:
                return f"operands of {described}"
        for x, y in zip(a.results, b.results):
            pairs[_key(x)] = y
    return ""


def _attributes(op: ir.Operation) -> list[tuple[str, str]]:
    attributes = op.attributes
    return [(attributes[i].name, "channel" if attributes[i].name == CHANNEL
             else str(attributes[i].attr)) for i in range(len(attributes))]


def _marker(anchor: ir.Operation) -> ir.Operation:
    """An op just before `anchor`: what is built after it is the builder's."""
    return ir.Operation.create("stablehlo.optimization_barrier", results=[], operands=[],
                               ip=ir.InsertionPoint(anchor))


def _built(results: list[ir.Value], marker: ir.Operation) -> list[ir.Operation]:
    """The ops of the results' block after `marker` that they depend on, directly or
    through ops nested in them, in block order."""
    block = as_op(results[0].owner).block if results else None
    found: dict = {}
    stack = [as_op(r.owner) for r in results]
    while stack:
        op = stack.pop()
        if _key(op) in found:
            continue
        found[_key(op)] = op
        for inner in _preorder([op]):
            for operand in inner.operands:
                owner = operand.owner
                if not isinstance(owner, (ir.Operation, ir.OpView)):
                    continue
                top = _top(as_op(owner), block)
                if top is not None and _key(top) not in found and \
                        marker.is_before_in_block(top):
                    stack.append(top)
    ops = list(found.values())
    return sorted(ops, key=functools.cmp_to_key(
        lambda a, b: 0 if a == b else -1 if a.is_before_in_block(b) else 1))


def _top(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The op of `block` that is `op` or holds it, or None."""
    while op is not None and op.block != block:
        parent = op.parent
        op = as_op(parent) if parent is not None else None
    return op


def _defined_within(value: ir.Value, ops: list[ir.Operation]) -> bool:
    """Whether `value` is a result or block argument of something nested in `ops`."""
    owner = value.owner
    op = as_op(owner) if isinstance(owner, (ir.Operation, ir.OpView)) else as_op(
        owner.owner)
    keys = {_key(o) for o in ops}
    while op is not None:
        if _key(op) in keys:
            return True
        parent = op.parent
        op = as_op(parent) if parent is not None else None
    return False


def _top_level(holder: ir.Operation) -> list[ir.Operation]:
    """The ops of `holder`'s body (a walk hands them over without making op views)."""
    found = []

    def visit(op):
        if op == holder:
            return ir.WalkResult.ADVANCE
        found.append(op)
        return ir.WalkResult.SKIP

    holder.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _preorder(ops: list[ir.Operation]) -> list[ir.Operation]:
    found = []

    def visit(op):
        found.append(op)
        return ir.WalkResult.ADVANCE

    for op in ops:
        as_op(op).walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _handle(op: ir.Operation) -> int | None:
    if op.name != "stablehlo.collective_permute" or CHANNEL not in op.attributes:
        return None
    return stablehlo.ChannelHandle(op.attributes[CHANNEL]).handle


def _key(x) -> int:
    return hash(x)
