"""The site data model: a `Match` (what a pass found, before any IR is touched), the
`Decision` taken on it, and the `Site` record a pass run logs for every candidate."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from jaxlib.mlir import ir

from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.normalize import normalize
from overlap_hlo.ir.ops import TRACKED, names_in
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.plan.cost import Estimate, SiteShape
from overlap_hlo.plan.ring_plan import RingPlan


@dataclass(frozen=True)
class Site:
    """One candidate site and what the pass decided about it."""

    where: Where                     # the collective's position
    pattern: str
    applied: bool
    detail: str = ""                 # the site: dots, dims, shapes, group size
    reason: str = ""                 # why it was left unchanged
    kind: Kind = Kind.NONE           # the reason's group (NONE: the reason itself)
    estimate: Estimate | None = None
    rule: str = ""                   # what decided a rewrite (threshold, cost model)
    profile_named: bool = True       # the estimate's profile was named (else not shown)
    rings: int = 0                   # loops built with `plan` (a gather's dots may need 2)
    dots: tuple[Where, ...] = ()     # the dots its ring computes (when it was matched)

    def __post_init__(self):
        if not isinstance(self.kind, Kind):
            raise TypeError(f"a Site's kind is a Kind, got {self.kind!r}")

    @classmethod
    def of(cls, location: ir.Location, input_name: str | None, pattern: str, applied: bool,
           *, dots=(), **facts) -> Site:
        """The site of the collective at `location` and its `dots` (MLIR locations), the
        parser's file "-" named `input_name`."""
        return cls(Where.of(location, input_name), pattern, applied,
                   dots=tuple(Where.of(dot, input_name) for dot in dots), **facts)

    @property
    def counted_as(self) -> str:
        """What statistics and summaries count it under: its kind, else its reason."""
        return self.kind or self.reason

    @property
    def location(self) -> str:
        """`file:line:col` of the collective, as remarks name it."""
        return str(self.where)

    @property
    def plan(self) -> RingPlan | None:
        """The ring's schedule: rounds, blocks, shifts, loop range and trip count (built
        as planned when `applied`; what the prediction assumed otherwise). None when
        the site was left unchanged before a ring was planned."""
        return self.estimate.plan if self.estimate is not None else None

    def format(self) -> str:
        """The remark: `file:line:col: remark: ` and `message()`."""
        return f"{self.location}: remark: {self.message()}"

    def message(self) -> str:
        """The pass, the verdict and the facts: dots, dims, reason, rule, prediction."""
        facts = [self.detail]
        if self.applied and self.rule:
            facts.append(f"decided by {self.rule}")
        if self.estimate is not None and self.profile_named:
            facts.append(self.prediction())
        if not self.applied:
            facts.insert(0, self.reason)
        verdict = "rewritten" if self.applied else "left unchanged"
        return f"{self.pattern}: {verdict}: " + "; ".join(fact for fact in facts if fact)

    def prediction(self) -> str:
        """The predicted times, labelled with the profile that made them; a rewritten
        site predicted slower than the original says so. The remark shows it only when
        the profile was named: no run presents an unchosen profile's figures."""
        e = self.estimate
        text = (f"predicted {e.before_us:.1f} us -> {e.after_us:.1f} us ({e.speedup:.2f}x) "
                f"on {e.hardware}")
        if self.applied and e.after_us > e.before_us:
            text += ": predicted slower than the original"
        return text


@dataclass
class SiteLog:
    """Sites seen by every pass of one pipeline run, in order: one record per site
    (per root op and pass run), even when two sites share a line and shapes."""

    sites: list[Site] = field(default_factory=list)
    input_name: str | None = None
    # The passes leave verification to the pipeline's end (`pipeline.run_pipeline`),
    # which reruns them verifying each should anything fail.
    deferred: bool = False
    # What is known of the module until a pass changes it (`changed`): it is as
    # `normalize` left it; the tracked ops (ops.TRACKED: collectives, uninitialised
    # buffers) it may hold (None: not looked at yet).
    normalized: bool = False
    holds: frozenset[str] | None = None
    # The ModuleScan of the module as it is (the last one a pass made), which the
    # next pass with the same root uses instead of walking the module again; None
    # once anything may have changed the module (`changed`, `normalize`, a restore).
    scan: object | None = None

    def add(self, site: Site) -> None:
        self.sites.append(site)

    def changed(self, created: frozenset[str] | None, normal: bool = False) -> None:
        """A pass rewrote the module, creating tracked ops named `created` (None: a
        pass that may have created anything), leaving it `normal` when it was
        (`ModulePass.keeps_normal_form`)."""
        self.normalized = self.normalized and normal
        self.scan = None
        self.holds = (None if created is None or self.holds is None
                      else self.holds | created)

    def normalized_once(self, module_op: ir.Operation) -> None:
        """`normalize(module_op)`, unless nothing changed it since the last time."""
        if not self.normalized:
            normalize(module_op)
            self.normalized = True
            self.scan = None

    def may_hold(self, module_op: ir.Operation, name: str) -> bool:
        """False when no op named `name`, a tracked one, can be in the module (one walk
        until a pass that may create anything changes it); True is a maybe."""
        if name not in TRACKED:
            return True
        if self.holds is None:
            self.holds = frozenset(names_in(module_op, TRACKED))
        return name in self.holds


@dataclass(frozen=True)
class Decision:
    """Why a site is rewritten: its predicted times and the rule that decided."""

    estimate: Estimate
    rule: str
    rings: int = 1                   # loops the site builds with the estimate's plan


def statistics(sites: list[Site]) -> dict[str, dict[str, int]]:
    """Per pass: sites seen, rewritten, and left unchanged by reason."""
    table: dict[str, dict[str, int]] = {}
    for site in sites:
        row = table.setdefault(site.pattern, {"seen": 0, "rewritten": 0})
        row["seen"] += 1
        key = "rewritten" if site.applied else f"skipped: {site.counted_as}"
        row[key] = row.get(key, 0) + 1
    return table


@dataclass
class Match:
    """A site as a pass's matcher describes it, before any IR is touched: what the
    shared driver needs to plan, decide and reserve channels, and what the pass's
    emitter builds (`build`, the pass's own description).

    A pass made of several patterns names in `pattern` the one that matched, which
    builds the site (the pass's `emit` hands it on)."""

    detail: str = ""                              # the site, for its remark
    communicated: ir.RankedTensorType | None = None   # what threshold-mib measures
    ring: object = None                           # groups.collectives.Ring
    shape: SiteShape | None = None                # the cost model's view of the site
    plan_for: Callable[[bool], RingPlan] | None = None  # the plan, one stream or two
    loops: int = 1                                # rings built with the chosen plan
    dots: list[ir.Location] = field(default_factory=list)   # the dots the rings compute
    build: object = None                          # the emitter's description
    others: list[Site] = field(default_factory=list)  # logged after this site, if built
    pattern: object = None                        # of a pass with several: the one matched
    # Another form of the same site; where the cost model decides, the one predicted
    # to save more is built.
    alternative: Match | None = None


@dataclass(frozen=True)
class Outcome:
    """What became of a site settled before a composite site: `built`, or left
    unchanged for `reason`; `skipped` when its pass was None (not to be settled);
    none of them when it did not match."""

    location: ir.Location
    built: bool = False
    reason: Unsupported | None = None
    skipped: bool = False
