"""Every collective next to a dot ends the run rewritten or named in a remark.

Before the passes run, `Coverage.begin` normalizes the module (as each pass does) and
lists the collectives of the input that a dot reaches within a few ops: forward from
an all_gather's or all_to_all's result through views, calls and if/case results; back
from what a reduce_scatter, all_reduce or all_to_all reduces through elementwise ops
and broadcasts too. Each is a site of the pass that handles its kind. After the passes, `Coverage.end` gives each such collective that no pass
recorded a site for a remark of its own, naming the op between it and its dot (or the
ring that computes that dot), so that no site is left unchanged without a word.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from jaxlib.mlir import ir

from overlap_hlo.ir.dominance import callee
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.lookthrough import COVERAGE_VIEWS, DOTS
from overlap_hlo.ir.ops import ELEMENTWISE, as_op
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.site import Site, SiteLog

PASS_OF = {
    "stablehlo.all_gather": "overlap-all-gather-matmul",
    "stablehlo.reduce_scatter": "overlap-matmul-reduce-scatter",
    "stablehlo.all_reduce": "overlap-matmul-all-reduce",
    "stablehlo.all_to_all": "overlap-all-to-all-matmul",
}
FORWARD = ("stablehlo.all_gather", "stablehlo.all_to_all")
BACKWARD = ("stablehlo.reduce_scatter", "stablehlo.all_reduce", "stablehlo.all_to_all")
# Ops followed from a gathered value to its dot: COVERAGE_VIEWS, not elementwise ops (a
# value gathered, then combined with others elementwise, is no site: a bias vector's).
# Ops followed from a dot to the collective that reduces it: those, elementwise ops and
# broadcasts (a sum's terms).
NEAR = COVERAGE_VIEWS | ELEMENTWISE | frozenset({"stablehlo.broadcast_in_dim"})
MAX_HOPS = 4        # ops between a collective and its dot
MAX_VISITED = 256   # values looked at from one collective


@dataclass(frozen=True)
class Candidate:
    """A collective of the input that a dot reaches: `via` names the ops between them
    (empty: none), `dot` is that dot's position."""

    where: Where
    location: ir.Location
    name: str
    dot: Where
    via: tuple[str, ...]

    @property
    def pattern(self) -> str:
        return PASS_OF[self.name]


@dataclass
class Coverage:
    """The collectives next to dots, listed before the passes and checked after."""

    patterns: frozenset[str]            # the passes in the pipeline
    log: SiteLog
    candidates: list[Candidate] = field(default_factory=list)

    def begin(self, module_op: ir.Operation) -> None:
        self.log.normalized_once(module_op)   # as the passes see it: one copy of
                                              # per-platform branches
        self.candidates = [c for c in candidates(module_op, self.log.input_name)
                           if c.pattern in self.patterns]

    def end(self, module_op: ir.Operation) -> None:
        for candidate in unreported(self.candidates, self.log.sites):
            self.log.sites.append(remark(candidate, self.log.sites))


def candidates(module_op: ir.Operation, input_name: str | None = None) -> list[Candidate]:
    """The collectives of `module_op` that a dot reaches, in walk order."""
    found: list[Candidate] = []

    def visit(op):
        if op.name in PASS_OF:
            near = _nearest_dot(op)
            if near is not None:
                dot, via = near
                found.append(Candidate(Where.of(op.location, input_name), op.location,
                                       op.name, Where.of(dot.location, input_name), via))
        return ir.WalkResult.ADVANCE

    module_op.walk(visit)
    return found


def unreported(found: list[Candidate], sites) -> list[Candidate]:
    """Those of `found` that have no site record: per position, the ones past the
    number of records there (the last in program order)."""
    recorded = Counter(site.where for site in sites)
    seen: Counter = Counter()
    left = []
    for candidate in found:
        seen[candidate.where] += 1
        if seen[candidate.where] > recorded[candidate.where]:
            left.append(candidate)
    return left


def remark(candidate: Candidate, sites) -> Site:
    """The record of a collective no pass reported."""
    kind = candidate.name.removeprefix("stablehlo.")
    ring = next((s for s in sites if s.applied and candidate.dot in s.dots), None)
    if ring is not None:
        reason = (f"its dot at {candidate.dot} is computed by the ring at {ring.location} "
                  f"({ring.pattern}); this {kind} stays as it is")
    elif candidate.via:
        between = ", ".join(candidate.via)
        reason = (f"{between} between the {kind} and its dot at {candidate.dot}: no "
                  f"pattern of {candidate.pattern} looks through "
                  f"{'it' if len(candidate.via) == 1 else 'them'}")
    else:
        reason = (f"no pattern of {candidate.pattern} matches the {kind} and its dot at "
                  f"{candidate.dot}")
    return Site(candidate.where, candidate.pattern, False, reason=reason, kind=Kind.NOT_HANDLED,
                dots=(candidate.dot,))


def _nearest_dot(op: ir.Operation) -> tuple[ir.Operation, tuple[str, ...]] | None:
    """The first dot reached from `op` (breadth first, at most MAX_HOPS ops between),
    and the names of the ops between."""
    pending: list[tuple[ir.Value, tuple[str, ...], bool]] = []
    if op.name in FORWARD:
        pending += [(r, (), True) for r in op.results]
    if op.name in BACKWARD:
        pending += [(v, (), False) for v in op.operands]
    seen: set = set()
    while pending and len(seen) < MAX_VISITED:
        value, via, forward = pending.pop(0)
        if value in seen:
            continue
        seen.add(value)
        for nxt, name in (_after(value) if forward else _before(value)):
            if name in DOTS:
                return nxt, via
            passing = COVERAGE_VIEWS if forward else NEAR
            if len(via) < MAX_HOPS and (name in passing or name in ("func.call", "case")):
                shown = via if name == "case" else (*via, name)
                pending += [(v, shown, forward) for v in
                            (_outputs(nxt, value) if forward else _inputs(nxt, value))]
    return None


def _before(value: ir.Value):
    """(op, name) producing `value`: its defining op; a call's callee's or an if/case's
    branches' returned values stand for the call's or if/case's result."""
    if not isinstance(value, ir.OpResult):
        return []
    owner = as_op(value.owner)
    if owner.name in ("stablehlo.case", "stablehlo.if"):
        return [(owner, "case")]
    return [(owner, owner.name)]


def _inputs(op: ir.Operation, result: ir.Value) -> list[ir.Value]:
    """The values `op`'s result `result` is made from."""
    if op.name == "func.call":
        func = callee(op)
        if func is None:
            return []
        terminator = as_op(list(func.regions[0].blocks[0].operations)[-1])
        return [terminator.operands[result.result_number]]
    if op.name in ("stablehlo.case", "stablehlo.if"):
        return [as_op(list(region.blocks[0].operations)[-1]).operands[result.result_number]
                for region in op.regions if len(region.blocks)]
    return list(op.operands)


def _after(value: ir.Value):
    """(op, name) reading `value`; a value an if/case branch returns is read as the
    if/case's result."""
    found = []
    for use in value.uses:
        user = as_op(use.owner)
        parent = user.parent if user.name == "stablehlo.return" else None
        if parent is not None and parent.name in ("stablehlo.case", "stablehlo.if"):
            found.append((as_op(parent), "case"))
        else:
            found.append((user, user.name))
    return found


def _outputs(op: ir.Operation, operand: ir.Value) -> list[ir.Value]:
    """The values `op` makes from `operand` (a call: its callee's argument)."""
    if op.name == "func.call":
        func = callee(op)
        if func is None:
            return []
        arguments = func.regions[0].blocks[0].arguments
        return [arguments[i] for i, v in enumerate(op.operands) if v == operand]
    if op.name in ("stablehlo.case", "stablehlo.if"):
        return [op.results[use.operand_number] for use in operand.uses
                if as_op(use.owner).name == "stablehlo.return"
                and as_op(use.owner).parent == op]
    return list(op.results)
