"""A site's row of the report: its time in the original and the rewritten compiled
module, found by the source location its remark names (or the positions of its dots),
and what no site's row holds (`outside_sites`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Collection

from overlap_hlo.ir.locations import Where
from overlap_hlo.targets import schedule
from overlap_hlo.targets.schedule import Analysis


class BeforeAfter:
    """The verdict on a time before and after (`before_us`, `after_us`): a row's or a
    group's."""

    before_us: float
    after_us: float

    @property
    def speedup(self) -> float:
        return self.before_us / self.after_us if self.after_us else 1.0

    @property
    def got_slower(self) -> bool:
        """The time grew by more than rounding, rewritten or not (a site left unchanged
        moves only with the compiler's choices around the rewritten ones)."""
        return self.after_us > self.before_us * (1 + SLOWER_TOLERANCE)


@dataclass
class RowGroup(BeforeAfter):
    """Rows whose sites name a dot in common (an FSDP weight's gather and the sequence
    gather beside the same dot): a ring moves the dot's compute from one row to another,
    so they are judged together, by their sums."""

    locations: list[str]
    rewritten: bool                 # any of its rows' sites rewritten
    before_us: float
    after_us: float
    original_exposed_us: float
    exposed_us: float
    compute_breakdown: dict[str, list[float]]


@dataclass
class SiteRow(BeforeAfter):
    location: str
    pattern: str
    applied: bool
    sites: int                      # remarks at this location (e.g. a layer called twice)
    permutes: int                   # collective-permute instructions in the schedule
    overlapped: int                 # of them, with a matmul between start and done
    permute_executions: int         # times the loops run them
    exposed_us: float               # communication waited for, after
    original_exposed_us: float      # the same in the original (its collective)
    before_us: float
    after_us: float
    compute_bound_us: float         # the smaller compute of the two: neither runs faster
    left_because: str = ""          # why a site was left unchanged (the remarks' kind)
    original_compute_us: float = 0.0
    rewritten_compute_us: float = 0.0
    # category (dots, accumulation, copies, initialisation, other) -> [before, after] us
    compute_breakdown: dict[str, list[float]] = field(default_factory=dict)
    collectives_left: list[str] = field(default_factory=list)
    original_collectives: list[str] = field(default_factory=list)
    trip_counts: list[int | None] = field(default_factory=list)
    loop_copies: int = 0
    loop_copy_bytes: int = 0
    model_before_us: float | None = None   # the analytic cost model (overlap_hlo.plan.cost)
    model_after_us: float | None = None
    permute_details: list[dict] = field(default_factory=list)
    synchronous: int = 0            # permutes scheduled as one synchronous instruction
    rewritten: int = 0              # of its records, those rewritten (`applied`: all)
    group: RowGroup | None = None   # the rows it shares a dot with, itself included

    @property
    def moved_here(self) -> bool:
        """A rewritten site with nothing at its location in the original: its collective
        was moved here by another pass (overlap-sequence-parallel carries an
        all_reduce's all_gather to the next dot), so what it saves shows at the site it
        came from, and its own before/after is no verdict."""
        return (self.applied and not self.original_collectives
                and self.before_us == 0.0 and self.original_exposed_us == 0.0)

    @property
    def judged_slower(self) -> bool:
        """Its time, or its group's, grew by more than rounding."""
        return (self.group or self).got_slower

    @property
    def slower(self) -> bool:
        """Rewritten and predicted slower than the original (in a group: the group)."""
        return self.applied and self.judged_slower and not self.moved_here

    @property
    def moved_slower(self) -> bool:
        """Left unchanged and slower around the rewritten sites; in a group, only when
        none of the group was rewritten (else the time moved within the group)."""
        return self.judged_slower and not (self.group and self.group.rewritten)

    def why_slower(self) -> str:
        """The compute categories that grew, largest first, and exposed communication
        (of its group, when it has one)."""
        judged = self.group or self
        grew = sorted(((after - before, name) for name, (before, after)
                       in judged.compute_breakdown.items() if after > before), reverse=True)
        parts = [f"{name} +{extra:.1f} us" for extra, name in grew if extra >= 0.05]
        waited = judged.exposed_us - judged.original_exposed_us
        if waited > 0:
            parts.append(f"exposed communication +{waited:.1f} us")
        return ", ".join(parts)


SLOWER_TOLERANCE = 0.005   # a site within 0.5% of the original is not called slower


def _at(hlo_location: str, wheres: Collection[Where], input_name: str | None) -> bool:
    """Whether an HLO location ("file:line:col"; HLO metadata spells the parsed input
    "-" or "") is one of the source positions `wheres` of sites or dots."""
    where = _parsed(hlo_location, input_name)
    return where.line is not None and where in wheres


@functools.lru_cache(maxsize=1 << 16)
def _parsed(hlo_location: str, input_name: str | None) -> Where:
    return Where.parse(hlo_location, input_name)


def _where(instr) -> str:
    return instr.location.format() if instr.location else ""


@dataclass(frozen=True)
class _SiteTime:
    time_us: float
    compute_us: float
    exposed_us: float
    collectives: tuple
    compute_by_category: dict


class Claims:
    """What the rows have taken of one compiled module (one Claims each for the original
    and the rewritten: they may be the same module), so that no instruction counts in
    two rows. The instructions at a site's own position or own dots (`positions`: named
    by one site only) are reserved for that site's row; the rest goes to the first row
    that reaches it (a matmul beside its collective, a copy in its loop)."""

    def __init__(self, positions: frozenset = frozenset(), input_name: str | None = None):
        self.positions, self.input_name = positions, input_name
        self.reserved: set[str] | None = None   # found at the first `take`
        self.taken: set[str] = set()

    def take(self, analysis: Analysis, own: set[str], reached: set[str]) -> set[str]:
        """`own` and what of `reached` is not reserved, less what was taken before;
        marked taken."""
        if self.reserved is None:
            def reserved(hlo: str) -> bool:
                return _at(hlo, self.positions, self.input_name)
            self.reserved = {name for hlo, names in analysis.names_by_location.items()
                             if reserved(hlo) for name in names}
            self.reserved |= {_collective(c) for c in analysis.collectives
                              if reserved(c.location)}
        names = (own | (reached - self.reserved)) - self.taken
        self.taken |= names
        return names


def _collective(c) -> str:
    """A collective's key in `Claims` (a fusion is both a collective and compute)."""
    return f"collective {c.name}"


def _site_time(analysis: Analysis, location: str, at_a_dot: Callable[[str], bool],
               at_its_dot: Callable[[str], bool], claims: Claims,
               also: tuple = ()) -> _SiteTime:
    """The site's time in one compiled module: its collectives' and permutes' waits,
    the compute at its location and at its own dots' positions (`at_its_dot`: the
    ring takes the dots there to the site's location), the matmuls beside its
    collectives and the instructions named in `also` (copies the compiler put in its
    loops, which carry no location). A collective without a location belongs to the
    site when a matmul beside it sits at one of the site's dots (`at_a_dot`). What
    another row took first (`claims`) is not counted again."""
    at_location = [c for c in analysis.collectives if c.location == location]
    reached = [c for c in analysis.collectives if not c.location and any(
        at_a_dot(_where(m)) for m in analysis.matmuls_beside(c))]
    kept = claims.take(analysis, {_collective(c) for c in at_location},
                       {_collective(c) for c in reached})
    collectives = [c for c in at_location + reached if _collective(c) in kept]
    permutes = [p for p in analysis.permutes_at(location)
                if claims.take(analysis, {f"permute {p.name}"}, set())]
    exposed = sum(c.exposed_us for c in collectives) + sum(p.exposed_us for p in permutes)
    own = {name for hlo, at in analysis.names_by_location.items()
           if hlo == location or at_its_dot(hlo) for name in at}
    reached = set(also) | {dot.name for collective in collectives
                           for dot in analysis.matmuls_beside(collective)}
    names = claims.take(analysis, own, reached)
    compute = sum(analysis.compute_by_name.get(name, 0.0) for name in names)
    return _SiteTime(compute + exposed, compute, exposed, tuple(collectives),
                     analysis.compute_by_category(names))


def _hlo_location(location: str, where: Where, analyses, input_name: str | None) -> str:
    """How the compiled modules spell a site's location (`location` if they do not)."""
    spellings = {loc for analysis in analyses
                 for loc in (*analysis.names_by_location,
                             *(p.location for p in analysis.permutes),
                             *(c.location for c in analysis.collectives))}
    return next((loc for loc in sorted(spellings) if _at(loc, {where}, input_name)), location)


def _row(location, sites, original, rewritten, input_name,
         shared: frozenset = frozenset(), claims: tuple[Claims, Claims] | None = None
         ) -> SiteRow:
    """One site's row; `sites` are its records (one per pass run that met it), which
    name its dots and carry the analytic model's estimates. Positions in `shared`
    (named by other sites too) do not count as its own dots' (`site_rows`); `claims`
    (the original's, the rewritten's) hold what earlier rows took."""
    where = sites[0].where
    dots = {dot for site in sites for dot in site.dots}
    own = dots - shared - {where}
    hlo_location = _hlo_location(location, where, (rewritten, original), input_name)

    def at_a_dot(hlo: str) -> bool:
        return _at(hlo, dots, input_name)

    def at_its_dot(hlo: str) -> bool:
        return _at(hlo, own, input_name)

    if claims is None:
        claims = tuple(Claims(frozenset({where, *own}), input_name) for _ in range(2))

    permutes = rewritten.permutes_at(hlo_location)
    loops = [loop for loop in rewritten.loops if loop.location == hlo_location]
    copies = [c for c in rewritten.loop_copies
              if any(loop.body == c.body for loop in loops)]
    before = _site_time(original, hlo_location, at_a_dot, at_its_dot, claims[0])
    after = _site_time(rewritten, hlo_location, at_a_dot, at_its_dot, claims[1],
                       also=tuple(c.name for c in copies if c.location != hlo_location))
    breakdown = {name: [before.compute_by_category.get(name, 0.0),
                        after.compute_by_category.get(name, 0.0)]
                 for name in schedule.CATEGORIES
                 if name in before.compute_by_category or name in after.compute_by_category}
    estimates = [site.estimate for site in sites if site.estimate is not None]
    return SiteRow(
        location=location, pattern=sites[0].pattern, applied=all(s.applied for s in sites),
        rewritten=sum(s.applied for s in sites),
        left_because=", ".join(dict.fromkeys(s.counted_as for s in sites
                                             if not s.applied)),
        sites=len(sites), permutes=len(permutes),
        overlapped=sum(p.overlapped for p in permutes),
        synchronous=sum(p.synchronous for p in permutes),
        permute_executions=sum(p.executions for p in permutes),
        exposed_us=after.exposed_us, original_exposed_us=before.exposed_us,
        before_us=before.time_us, after_us=after.time_us,
        compute_bound_us=min(before.compute_us, after.compute_us),
        original_compute_us=before.compute_us, rewritten_compute_us=after.compute_us,
        compute_breakdown=breakdown,
        collectives_left=[c.opcode for c in after.collectives],
        original_collectives=[c.opcode for c in before.collectives],
        trip_counts=[loop.trip_count for loop in loops],
        loop_copies=len(copies), loop_copy_bytes=sum(c.bytes for c in copies),
        model_before_us=sum(e.before_us for e in estimates) if estimates else None,
        model_after_us=sum(e.after_us for e in estimates) if estimates else None,
        permute_details=[{"name": p.name, "computation": p.computation, "bytes": p.bytes,
                          "transfer_us": p.transfer_us, "window": list(p.window),
                          "window_cycles": p.window_cycles, "overlapped": p.overlapped,
                          "lane": p.lane, "executions": p.executions,
                          "exposed_us": p.exposed_us}
                         for p in permutes])


def site_rows(sites: list, original: Analysis, rewritten: Analysis,
              input_name: str | None, row_of: Callable = _row) -> list[SiteRow]:
    """One row per site location (`row_of`), in the sites' order; a
    dot position some other site names too (as a dot or as its own position) is
    counted by no row's `own dots`, and no instruction counts in two rows (`Claims`)."""
    by_location: dict[str, list] = {}
    for site in sites:
        by_location.setdefault(site.location, []).append(site)
    named: dict = {}   # position -> how many locations name it
    for group in by_location.values():
        for where in {group[0].where, *(dot for site in group for dot in site.dots)}:
            named[where] = named.get(where, 0) + 1
    shared = frozenset(where for where, count in named.items() if count > 1)
    owned = frozenset(where for where, count in named.items() if count == 1)
    claims = (Claims(owned, input_name), Claims(owned, input_name))
    rows = [row_of(location, group, original, rewritten, input_name, shared=shared,
                   claims=claims)
            for location, group in by_location.items()]
    for members in _sharing_dots(by_location, shared):
        group = _group([row for row in rows if row.location in members])
        for row in rows:
            if row.location in members:
                row.group = group
    return rows


def _sharing_dots(by_location: dict[str, list], shared: frozenset) -> list[set[str]]:
    """The sets of two or more locations linked by positions in `shared` (a site's own
    position or its dots), directly or through another location."""
    positions = {location: {group[0].where, *(dot for site in group for dot in site.dots)}
                 & shared for location, group in by_location.items()}
    groups: list[set[str]] = []
    for location, mine in positions.items():
        linked = [g for g in groups if any(positions[other] & mine for other in g)]
        merged = {location}.union(*linked)
        groups = [g for g in groups if g not in linked] + [merged]
    return [g for g in groups if len(g) > 1]


def _group(rows: list[SiteRow]) -> RowGroup:
    breakdown: dict[str, list[float]] = {}
    for row in rows:
        for name, (before, after) in row.compute_breakdown.items():
            total = breakdown.setdefault(name, [0.0, 0.0])
            total[0] += before
            total[1] += after
    return RowGroup([row.location for row in rows],
                    any(r.applied or r.rewritten for r in rows),
                    sum(r.before_us for r in rows), sum(r.after_us for r in rows),
                    sum(r.original_exposed_us for r in rows),
                    sum(r.exposed_us for r in rows), breakdown)


def outside_sites(rows: list[SiteRow], original: Analysis,
                  rewritten: Analysis) -> dict[str, list[float]]:
    """What no site's row holds, before and after: the totals less the rows' sums
    (exposed communication, compute, time), so that rows and this add up to the
    module."""
    def rest(total: float, parts) -> float:
        left = total - sum(parts)
        return 0.0 if abs(left) < 0.05 else left   # rounding: no "-0.0"

    return {
        "exposed_us": [rest(original.exposed_us, (r.original_exposed_us for r in rows)),
                       rest(rewritten.exposed_us, (r.exposed_us for r in rows))],
        "compute_us": [rest(original.compute_us, (r.original_compute_us for r in rows)),
                       rest(rewritten.compute_us, (r.rewritten_compute_us for r in rows))],
        "us": [rest(original.total_us, (r.before_us for r in rows)),
               rest(rewritten.total_us, (r.after_us for r in rows))],
    }
