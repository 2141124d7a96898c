"""The plan of overlap-sequence-parallel in one block: which ops after its all_gathers
move onto the shard, grouped into components that are kept or dropped as a whole, and
the remarks for those that stay. No IR is touched here."""
from __future__ import annotations

from dataclasses import dataclass, field

from jaxlib.mlir import ir

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import tensor_bytes
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.lookthrough import DOTS, VIEWS, users_through_views
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.scan import ModuleScan

from .carried_shard import Carried, can_carry_shard, loop_of_body
from .row_rules import (ELEMENTWISE, SHAPE_OPS, carried_by_loop, groups_key, reaches_dot,
                        row_rule)
from .same_everywhere import ValueFacts


@dataclass
class Gathered:
    """A value that is the all_gather (along `dim`, like `seed`) of a shard."""

    dim: int
    seed: ir.Operation            # the all_gather whose groups it is gathered over
    component: int                # the group of moved ops it belongs to
    shard: ir.Value | None = None  # the seed's operand; a moved op's, once it is built


@dataclass
class Move:
    """An op to rebuild on the shard: per operand, its gathered dim (None: sliced
    along `slice_dims[i]`, or kept as it is when that is None too)."""

    op: ir.Operation
    result_dims: list[int]
    slice_dims: list[int | None]
    component: int


@dataclass
class Component:
    seeds: list[ir.Operation] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)


class BlockPlan(ValueFacts):
    """The moves in one block: planned from its all_gathers, then kept or dropped per
    component (no IR is touched here)."""

    def __init__(self, block: ir.Block, scan: ModuleScan, records: list, halves: set,
                 carried: dict[int, Carried] | None = None):
        self.block, self.scan, self.records = block, scan, records
        self.halves = halves   # where all_reduce rings left their all_gather half
        self.carried = carried or {}   # the loop's carried shards, by index
        self.carry_candidates: list[Carried] = []   # values the loop could carry so
        self.carry_remarks: list = []   # their remarks, if it cannot
        self.gathered: dict[ir.Value, Gathered] = {}
        self.parent: list[int] = []              # union-find over components
        self.moved: set[ir.Operation] = set()
        self.moves: list[Move] = []
        self.same: dict[tuple[ir.Value, tuple], bool] = {}
        self.rings: dict[int, Ring | None] = {}
        self.stops: dict[int, tuple[ir.Operation, str]] = {}   # component -> (op, why)
        self.reported: set[int] = set()   # components with a remark

    def plan(self) -> list[Component]:
        """The components worth building (no IR touched)."""
        for index, carried in self.carried.items():   # the loop's argument is the shard
            argument = self.block.arguments[index]
            self.gathered[argument] = Gathered(carried.dim, carried.seed,
                                               self._new_component(), shard=argument)
        for op in self.block.operations:
            op = op.operation
            if op.name == "stablehlo.all_gather":
                if self._seed(op):
                    continue
            self._plan(op)
        if not self.moves:
            self.unmoved_remarks([])
            return []
        components: dict[int, Component] = {}
        for value, g in self.gathered.items():
            if isinstance(value, ir.OpResult) and g.seed == as_op(value.owner) \
                    and self._ring(g.seed) is not None:
                components.setdefault(self._find(g.component), Component()).seeds.append(g.seed)
        for move in self.moves:
            components.setdefault(self._find(move.component), Component()).moves.append(move)
        kept = [c for c in components.values() if c.moves and c.seeds and self._worth_it(c)]
        self.unmoved_remarks(kept)
        return kept

    def _seed(self, op: ir.Operation) -> bool:
        result = op.results[0].type
        if (len(op.operands) != 1 or len(op.results) != 1
                or not isinstance(result, ir.RankedTensorType) or not result.has_static_shape):
            return False
        dim = ir.IntegerAttr(op.attributes["all_gather_dim"]).value
        self.gathered[op.results[0]] = Gathered(dim, op, self._new_component(),
                                                shard=op.operands[0])
        return True

    def _plan(self, op: ir.Operation) -> None:
        inputs = [self.gathered.get(v) for v in op.operands]
        if not any(inputs) or op.name in DOTS:
            return
        stop = self._stop(op, inputs)
        if stop is not None:
            for g in inputs:
                if g:
                    self.stops.setdefault(g.component, (op, stop))
            return
        seed = next(g for g in inputs if g).seed
        result_dims, slice_dims = row_rule(op, [g.dim if g else None for g in inputs])
        component = self._new_component()
        for g in inputs:
            if g:
                self._union(component, g.component)
        self.moves.append(Move(op, result_dims, slice_dims, component))
        self.moved.add(op)
        for value, dim in zip(op.results, result_dims):
            self.gathered[value] = Gathered(dim, seed, component)

    def _stop(self, op: ir.Operation, inputs: list) -> str | None:
        """Why `op`, which reads a gathered value, cannot move onto the shard (None:
        it can)."""
        if op.name not in ELEMENTWISE | SHAPE_OPS | {"sdy.sharding_constraint"}:
            return f"{op.name} is not an op that keeps the rows of the gathered dim apart"
        if len({groups_key(g.seed) for g in inputs if g}) != 1:
            return f"{op.name} reads values gathered over different groups"
        seed = next(g for g in inputs if g).seed
        if self._ring(seed) is None:
            return "the all_gather's groups do not form a ring"
        if row_rule(op, [g.dim if g else None for g in inputs]) is None:
            return f"{op.name} mixes the rows of the gathered dim"
        # an operand read whole (a reduce's init) or sliced must be the same everywhere
        for i, (v, g) in enumerate(zip(op.operands, inputs)):
            if not g and not self._same_everywhere(v, seed):
                source = v.owner
                made = ("a block argument" if isinstance(source, ir.Block)
                        else as_op(source).name)
                return (f"operand {i} of {op.name} ({made}) is not proved the same on "
                        "every device of the group")
        return None

    def _after_a_ring(self, seed: ir.Operation) -> bool:
        """`seed` is the all_gather half an all_reduce ring left (what this pass is
        for: other all_gathers' sites are the gather pass's to report)."""
        return Where.of(seed.location, self.scan.input_name) in self.halves

    def unmoved_remarks(self, kept: list[Component]) -> None:
        """A remark for each component after an all_reduce ring left where it is
        although its values reach a dot: the op that stopped it and why."""
        kept_roots = {self._find(m.component) for c in kept for m in c.moves}
        for component, (op, why) in self.stops.items():
            root = self._find(component)
            if (root in kept_roots or root in self.reported
                    or not reaches_dot(op, self.scan.callers)):
                continue
            self.reported.add(root)
            seed = next(g.seed for g in self.gathered.values()
                        if self._find(g.component) == root)
            if not self._after_a_ring(seed):
                continue
            self.records.append((seed.location, False, dict(
                kind=Kind.NOT_MOVED, reason=(
                    f"the ops after the all_gather stay on the gathered rows: {why}, so "
                    "the all_gather does not reach the next dot"))))

    def _worth_it(self, component: Component) -> bool:
        """One of the new all_gathers feeds a dot, they move at most the bytes of the
        all_gathers that go, and not only views move (the gather pass sees through
        those). A component that would feed a dot but gathers more is reported."""
        added, feeds_dot = 0.0, False
        for move in component.moves:
            for value, dim in zip(move.op.results, move.result_dims):
                if self._read_elsewhere(value):
                    added += tensor_bytes(value.type)
                    feeds_dot |= any(use.user.name in DOTS
                                     for use in users_through_views(value, dim)[0])
        for index, carried in self.carried.items():   # the shard the loop carries
            argument = self.block.arguments[index]
            if self._find(self.gathered[argument].component) == \
                    self._find(component.moves[0].component) and self._read_elsewhere(argument):
                added += tensor_bytes(carried.loop.results[index].type)
                feeds_dot |= any(use.user.name in DOTS for use in
                                 users_through_views(argument, carried.dim)[0])
        removed = sum(tensor_bytes(seed.results[0].type) for seed in component.seeds
                      if not self._read_elsewhere(seed.results[0]))
        if all(move.op.name in VIEWS for move in component.moves):
            return False
        if not feeds_dot:
            callers = self.scan.callers
            carried = [m.op for m in component.moves for v in m.op.results
                       if carried_by_loop(v, callers)]
            if carried and reaches_dot(carried[0], callers) and \
                    self._after_a_ring(component.seeds[0]):
                self._carry_candidate(component)
                self.carry_remarks.append((component.seeds[0].location, False, dict(
                    kind=Kind.NOT_MOVED, reason=(
                        "the ops after the all_gather make a value the loop carries to "
                        "its next iteration (a scanned layer's residual), where a dot "
                        "reads it: moving them would need the loop to carry the shard, "
                        "which this pass does not do"))))
                self.reported.add(self._find(component.moves[0].component))
            return False
        if added > removed:
            self.reported.add(self._find(component.moves[0].component))
            self.records.append((component.seeds[0].location, False, dict(
                kind=Kind.MORE_BYTES, reason=(
                    f"moving the {len(component.moves)} ops after the all_gather onto the "
                    f"shard would gather {(added - removed) / 2**20:.3g} MiB more than now "
                    "(values read whole elsewhere: the block's output, a reduction over "
                    "the gathered dim, a backward pass)"))))
            return False
        return True

    def _carry_candidate(self, component: Component) -> None:
        """Note the value of `component` that the loop around this block could carry
        as its shard: yielded as it is, whole when it enters the loop (the same on
        every device of the group), unread by the condition."""
        loop = loop_of_body(self.block)
        if loop is None or self.carried:
            return
        seed = component.seeds[0]
        terminator = as_op(list(self.block.operations)[-1])
        for move in component.moves:
            for value, dim in zip(move.op.results, move.result_dims):
                for use in value.uses:
                    index = use.operand_number
                    if (as_op(use.owner) == terminator and self._ring(seed) is not None
                            and can_carry_shard(loop, index, self._ring(seed).size, dim)
                            and self._same_everywhere(loop.operands[index], seed)):
                        self.carry_candidates.append(Carried(loop, index, dim, seed))

    def _read_elsewhere(self, value: ir.Value) -> bool:
        """Read by an op that does not move onto the shard (nor as the shard the loop
        carries)."""
        return any(as_op(use.owner) not in self.moved and not self._carried_yield(use)
                   for use in value.uses)

    def _carried_yield(self, use) -> bool:
        """`use` is the yield of a value the loop carries as its shard."""
        return (use.operand_number in self.carried
                and as_op(use.owner) == as_op(list(self.block.operations)[-1]))

    def _new_component(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def _find(self, c: int) -> int:
        while self.parent[c] != c:
            self.parent[c] = self.parent[self.parent[c]]
            c = self.parent[c]
        return c

    def _union(self, a: int, b_: int) -> None:
        self.parent[self._find(b_)] = self._find(a)
