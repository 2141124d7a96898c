"""Base class of the rewrite passes: options and the driver every pass shares.

A pass is a frozen dataclass whose fields are its options (`threshold_mib` is
spelled `threshold-mib` in pipeline text). It names the op its pattern is rooted at
and implements two phases:

- `match(op, scan, settled)`: a pure description of the site rooted at `op` (a
  `Match`: the ring, the cost model's view of the site, what to build), or `NoMatch`
  (not a candidate), or `Unsupported` (a candidate left unchanged; the reason is logged).
  No IR is touched.
- `emit(match, plan, ring, rewriter, scan)`: build the rings and replace the site.

`settle` runs match -> plan -> decide -> reserve channels -> emit -> replace for every
pass; `run` applies it to each root op with MLIR's greedy driver.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from jaxlib.mlir import ir

from overlap_hlo.ir import compat
from overlap_hlo.ir.dots import tensor_bytes
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.ops import ALLOCATION
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.cost import SiteShape
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.plan.ring_plan import RingPlan
from overlap_hlo.plan.target_form import TargetForm
from overlap_hlo.rewrite import builders
from overlap_hlo.rewrite.module_pass import ModulePass, verification_error
from overlap_hlo.rewrite.scan import ModuleScan
from overlap_hlo.rewrite.site import Decision, Match, Outcome, Site, SiteLog

DEFAULT_THRESHOLD_MIB = 1.0
DEFAULT_PREDICTION_PROFILE = "h100-sxm"


class NoMatch(Exception):
    """The root op is not a site of this pass."""


def mib(tensor_type: ir.RankedTensorType) -> float:
    return tensor_bytes(tensor_type) / 2**20


@dataclass(frozen=True)
class RewritePass(ModulePass):
    """Options shared by the overlap passes. Each field is declared once here: its help,
    and how its command-line flag parses (`metavar`, `minimum`, `choices`; `flag`:
    False when no flag sets it); tools/cli.py makes the flags from these."""

    threshold_mib: float | None = field(default=None, metadata={
        "metavar": "MIB", "minimum": 0, "tried": ((0, "every site"),),
        "help": "leave a site unchanged when its communicated tensor is smaller than "
                f"this many MiB (0: rewrite every legal site); overrides the cost model; "
                f"default {DEFAULT_THRESHOLD_MIB:g} when no hardware is named"})
    hardware: cost.Hardware | None = field(default=None, metadata={
        "metavar": "NAME|FILE.json", "parse": cost.hardware,
        "help": "decide by the cost model for this hardware profile "
                f"({', '.join(cost.PROFILES)}) or .json profile file"})
    bidirectional: bool | None = field(default=None, metadata={
        "tried": ((True, "two streams"), (False, "one stream")),
        "help": "two streams in opposite ring directions, about N/2 rounds "
                "(groups of 2 fall back to one stream); false: one stream. Default: "
                "when the cost model decides (a hardware profile, no threshold-mib), the "
                "form it predicts faster for each site, else one stream"})
    target: str = field(default="", metadata={
        "choices": tuple(p for p in cost.PLATFORMS if p),
        "help": "the backend the module will be compiled for: tpu or gpu (buffers the "
                "ring writes whole are left uninitialised: custom_call @AllocateBuffer), "
                "cpu; default: the hardware profile's, else forms every backend runs"})
    device_coords: Links | None = field(default=None, metadata={
        "flag": False, "parse": Links.parse, "errors_named": True,   # --tpu=SLICE sets it
        "metavar": "EXTENTS:COORDS",
        "help": "where each device sits on the slice, EXTENTS:COORDS (e.g. "
                "2x4:0,0;1,0;0,1;...; an extent ending in t wraps around): rings then "
                "visit their group in an order of physical neighbours. overlap-report "
                "sets it from --tpu; overlap_hlo.targets.tpu.topology(SLICE).links gives it"})

    keep_sites: str = field(default="", metadata={
        "metavar": "FILE:LINE:COL,...",
        "help": "leave the sites whose collective is at these source positions unchanged: "
                "FILE:LINE:COL, comma-separated, a path's trailing part enough "
                "(model.py:130:8); overlap-report sets it for sites its compiled schedules "
                "found slower"})

    # The profile predictions use: `hardware`, else the default one.
    profile: cost.Hardware = field(init=False, repr=False, compare=False)

    name: ClassVar[str] = ""
    root: ClassVar[type] = object
    summary: ClassVar[str] = ""
    composite_note: ClassVar[str] = ""   # ends the detail of a site settled first

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "profile",
                           self.hardware or cost.hardware(DEFAULT_PREDICTION_PROFILE))
        if self.threshold_mib is not None and not self.threshold_mib >= 0:  # rejects nan
            raise ValueError(f"pass '{self.name}': threshold-mib must be >= 0, "
                             f"got {self.threshold_mib}")
        if self.target not in cost.PLATFORMS:
            raise ValueError(f"pass '{self.name}': target must be one of tpu, gpu, cpu, got "
                             f"'{self.target}'")
    def ring_orders(self, ring) -> Callable[[int], object]:
        """`ring` in the order it visits its groups with 1 or 2 streams
        (`Ring.in_physical_order`), each order searched for once per site."""
        found: dict[int, object] = {}

        def ordered(streams: int):
            if streams not in found:
                found[streams] = ring.in_physical_order(self.device_coords, streams)
            return found[streams]

        return ordered

    def planned(self, site: SiteShape, ordered: Callable[[int], object],
                plan: RingPlan) -> SiteShape:
        """`site` with ring plan `plan`, the link load of that ring's step in the
        order `ordered` (from `ring_orders`) gives it, and the link directions the
        original collective uses."""
        ring = ordered(plan.streams)
        return dataclasses.replace(site, plan=plan,
                                   link_load=ring.step_load(self.device_coords, plan.streams),
                                   collective_directions=ring.collective_directions(self.device_coords))

    @property
    def platform(self) -> str:
        """The backend the forms are for: `target`, else the named profile's, else ""."""
        return self.target or (self.hardware.platform if self.hardware else "")

    @property
    def form(self) -> TargetForm:
        """What the platform changes in the rings' plans and IR (`TargetForm`)."""
        return TargetForm.of(self.platform)

    def created(self) -> frozenset[str]:
        return self.creates | ({ALLOCATION} if self.form.allocates else frozenset())

    @property
    def single_trip_loop(self) -> bool:
        """Whether a ring's loop that runs once is built (RingPlan.single_trip_loop):
        only the TPU forms keep it, as their compiler schedules that form better."""
        return self.form.single_trip_loop

    @property
    def views_in_loop(self) -> bool:
        """Whether a ring's loop slices its invariant operands itself (RingPlan.
        views_in_loop): the TPU compiler then fuses the slice into each dot instead of
        copying a scanned layer's weight out of the stack before the loop."""
        return self.form.views_in_loop

    def settles_first(self, op, scan: ModuleScan) -> list[tuple[object, ir.Operation]]:
        """The sites a composite site at `op` settles before it is matched, each with
        the pass that settles it (None: left as it is): none by default."""
        return []

    def match(self, op, scan: ModuleScan, settled: list[Outcome] | None = None) -> Match:
        """The site rooted at `op`, or NoMatch / Unsupported. `settled`: the outcomes of
        the sites `settles_first` listed, in that order (None when it listed none)."""
        raise NotImplementedError

    def emit(self, match: Match, plan: RingPlan, ring, rewriter, scan: ModuleScan) -> None:
        """Build `match.build` as `plan` with `ring` (visited in its chosen order) and
        replace the site's ops through `rewriter`; new channels from `scan`."""
        raise NotImplementedError

    def refusal(self, shape: SiteShape) -> Unsupported | None:
        """Why a matched site is left unchanged whatever the cost model says (a form
        the target is not trusted with), decided here, not by the matcher; None: no
        reason."""
        return None

    def dots_beside(self, op) -> list[ir.Operation]:
        """The dots beside the collective `op` (named in a site left unchanged)."""
        return []

    def settle(self, op, rewriter, scan: ModuleScan, settled_first: list[Site]
               ) -> tuple[Match, Decision]:
        """match -> plan -> decide -> reserve channels -> emit for the site at `op`;
        raises NoMatch or Unsupported before any IR is touched (unless sites it settles
        first were built: their records go to `settled_first`). An Unsupported names
        the site's dots."""
        try:
            return self._settle(op, rewriter, scan, settled_first)
        except Unsupported as reason:
            if not reason.dots:
                reason.dots = [dot.location for dot in self.dots_beside(op.operation)]
            raise

    def _settle(self, op, rewriter, scan: ModuleScan, settled_first: list[Site]
                ) -> tuple[Match, Decision]:
        refuse_zero_size(op.operation)
        if self.keep_sites and names_position(self.keep_sites, op.location, scan.input_name):
            raise Unsupported("its position is named by keep-sites", kind=Kind.NAMED_KEPT)
        first = self.settles_first(op, scan)
        outcomes = [self._settle_first(owner, root, rewriter, scan, settled_first)
                    for owner, root in first]
        match = self.match(op, scan, outcomes if first else None)
        ordered = self.ring_orders(match.ring)
        match, decision = self._chosen_form(match, ordered)
        try:
            plan = decision.estimate.plan
            ring = ordered(plan.streams)
            ring.require_pairs(match.loops * plan.permutes)
            if ring.uses_channel:
                scan.require_channels(match.loops * plan.permutes)
        except Unsupported as reason:   # no pairs or channels left
            reason.dots = match.dots
            raise
        self.emit(match, plan, ring, rewriter, scan)
        return match, dataclasses.replace(decision, rings=match.loops)

    def _chosen_form(self, match: Match, ordered) -> tuple[Match, Decision]:
        """The form of the site to build and its decision: the matched form, or,
        where the cost model decides, its alternative when that is predicted to save
        more; raises the matched form's Unsupported when neither is built."""
        forms = [match]
        if match.alternative is not None and self.decided_by_model:
            forms.append(match.alternative)
        decided, refusal = [], None
        for form in forms:
            try:
                decided.append((form, self._decision(form, ordered)))
            except Unsupported as reason:   # refused or not worth it
                reason.dots = form.dots
                refusal = refusal or reason
        if not decided:
            raise refusal
        return max(decided, key=lambda fd: fd[1].estimate.before_us - fd[1].estimate.after_us)

    @property
    def decided_by_model(self) -> bool:
        """The cost model decides each site: a hardware profile and no threshold."""
        return self.threshold_mib is None and self.hardware is not None

    def _decision(self, match: Match, ordered) -> Decision:
        def shape_of(bidirectional: bool) -> SiteShape:
            return self.planned(match.shape, ordered, match.plan_for(bidirectional))

        refusal = self.refusal(match.shape)
        if refusal is not None:
            raise Unsupported(str(refusal), kind=refusal.kind, detail=match.detail,
                              estimate=self.estimate(shape_of(bool(self.bidirectional)),
                                                     self.profile))
        return self.decide(match.communicated, shape_of, match.detail)

    def _settle_first(self, owner, root, rewriter, scan, records: list[Site]) -> Outcome:
        """Settle `root` with pass `owner` (None: leave it) before this composite site;
        its record's detail ends with this pass's `composite_note`."""
        location = root.location   # read before the rewrite erases `root`
        if owner is None:
            return Outcome(location, skipped=True)
        try:
            with location, builders.shared_scalars():   # its constants stay its own
                match, decision = owner.settle(root, rewriter, scan, records)
        except NoMatch:
            return Outcome(location)
        except Unsupported as reason:
            return Outcome(location, reason=reason)
        records.append(Site.of(location, scan.input_name, owner.name, True,
                               detail=match.detail + self.composite_note,
                               estimate=decision.estimate, rule=decision.rule,
                               rings=decision.rings, dots=match.dots))
        records.extend(match.others)
        return Outcome(location, built=True)

    def prepare(self, module_op: ir.Operation, log: SiteLog) -> None:
        log.normalized_once(module_op)   # identical branches inlined, dots as dot_general

    def apply(self, module_op: ir.Operation, records: list, broken: dict[int, str],
              careful: bool, log: SiteLog) -> tuple[int, str] | None:
        """One greedy run, recording each site's fate in `records`; returns (site number,
        error) for the first site whose rewrite raised (or, when `careful`, left the
        module invalid), after which the run stops rewriting. `broken` sites are skipped."""
        scan = self.module_scan(module_op, log)
        # Root ops already decided in this run: the greedy driver revisits an op whose
        # neighbours changed (an all_gather kept for other readers, a site left
        # unchanged), and each site gets one decision and one record. Keys are the
        # ops' identities: roots are never created by a rewrite, so a key is not reused.
        decided: set[int] = set()
        named = self.hardware is not None
        failure: list[tuple[int, str]] = []

        def note(location, applied: bool, pattern: str = self.name, **facts) -> None:
            records.append(Site.of(location, log.input_name, pattern, applied,
                                   profile_named=named, **facts))

        def pattern(op, rewriter):
            key = hash(op.operation)
            if failure or key in decided:
                return True
            decided.add(key)
            location = op.location  # read before the rewrite erases `op`
            number = scan.numbers.get(key, -1)
            if number in broken:
                note(location, False, kind=Kind.INTERNAL_ERROR, reason=(
                    f"internal error: its rewrite failed ({broken[number]}); the site is "
                    "valid input, left as it was (please report it)"))
                return True
            first: list[Site] = []   # sites settled before this one: logged after it
            try:
                try:
                    with location, builders.shared_scalars():
                        match, decision = self.settle(op, rewriter, scan, first)
                except NoMatch:
                    return True
                except Unsupported as reason:
                    note(location, False, reason=str(reason), kind=reason.kind,
                        detail=reason.detail, estimate=reason.estimate, dots=reason.dots)
                    return True
                except Exception as err:   # noqa: BLE001 - any failure leaves the site as it was
                    failure.append((number, f"{type(err).__name__}: {err}"))
                    return False
                error = verification_error(module_op) if careful else None
                if error is not None:
                    failure.append((number, f"the rewritten module does not verify: {error}"))
                    return False
                note(location, True, detail=match.detail, estimate=decision.estimate,
                    rule=decision.rule, rings=decision.rings, dots=match.dots)
                first.extend(match.others)
                return False  # the bindings read a falsy result as "matched and rewrote"
            finally:
                records.extend(dataclasses.replace(site, profile_named=named) for site in first)

        patterns = compat.RewritePatternSet()
        patterns.add(self.root, pattern)
        config = compat.GreedyRewriteConfig()
        config.enable_folding = False
        config.enable_constant_cse = False
        config.region_simplification_level = compat.GreedySimplifyRegionLevel.DISABLED
        config.use_top_down_traversal = True  # sites numbered in program order
        compat.apply_patterns_and_fold_greedily(module_op, patterns.freeze(), config)
        return failure[0] if failure else None

    def estimate(self, shape: SiteShape, profile: cost.Hardware) -> cost.Estimate:
        """The cost model's prediction for the site (a pass whose site is more than
        its ring adds the rest to both sides)."""
        return cost.estimate(shape, profile)

    def decide(self, communicated: ir.RankedTensorType, shape_of: Callable[[bool], SiteShape],
               detail: str) -> Decision:
        """The site's form, predicted times and the rule that decided to rewrite it;
        raises Unsupported (naming the rule) when it is not worth it. The ring to build
        is the estimate's plan.

        `shape_of(bidirectional)` is the site with one stream (False) or two. An
        explicit threshold-mib decides by size (it overrides the cost model); without
        one, a hardware profile decides by the cost model, and with neither the default
        threshold applies. The form is `bidirectional` when given; else the one the cost
        model predicts faster when it decides; else one stream. Predictions use the
        default profile when no hardware is named (and are then not shown).
        """
        profile = self.profile
        by_model = self.decided_by_model
        forms = ([self.bidirectional] if self.bidirectional is not None
                 else [False, True] if by_model else [False])
        estimates = [self.estimate(shape_of(form), profile) for form in forms]
        estimate = min(estimates, key=lambda e: e.after_us)   # a tie: one stream
        if not by_model:
            threshold = DEFAULT_THRESHOLD_MIB if self.threshold_mib is None else self.threshold_mib
            rule = f"threshold-mib={threshold:g} " + (
                "(the default: neither threshold-mib nor hardware given)"
                if self.threshold_mib is None else
                f"(explicit, over the cost model for {profile.name})" if self.hardware
                else "(explicit)")
            size = mib(communicated)
            if size < threshold:
                raise Unsupported(f"communicated tensor is {size:.3g} MiB, below {rule}",
                                  kind=Kind.BELOW_THRESHOLD, detail=detail, estimate=estimate)
            return Decision(estimate, f"{rule}: {size:.3g} MiB communicated")
        if not estimate.pays():
            raise Unsupported(f"not profitable on {profile.name} (the cost model: less than "
                              f"{cost.MARGIN:.0%} faster)", kind=Kind.NOT_PROFITABLE,
                              detail=detail, estimate=estimate)
        chosen = ""
        if len({e.plan.streams for e in estimates}) > 1:
            chosen = (f", {'two streams' if estimate.plan.streams == 2 else 'one stream'} "
                      "(the faster form)")
        return Decision(estimate, f"the cost model for {profile.name}{chosen}")


def names_position(listed: str, location: ir.Location, input_name: str | None = None) -> bool:
    """Whether `listed` (keep-sites: FILE:LINE:COL entries, comma-separated) names
    `location` (its file "-" read as `input_name`, as remarks name it): an entry equal
    to its position or to a trailing part of its path."""
    where = str(Where.of(location, input_name))
    return any(where == entry or where.endswith("/" + entry)
               for entry in (part.strip() for part in listed.split(",")) if entry)


def refuse_zero_size(op: ir.Operation) -> None:
    """Unsupported when an operand or result of `op` holds no element: there is
    nothing to communicate or multiply, so a ring would only add steps."""
    for value in [*op.operands, *op.results]:
        t = value.type
        if isinstance(t, ir.RankedTensorType) and t.has_static_shape and 0 in t.shape:
            raise Unsupported(f"{op.name} of a zero-size tensor {t}: nothing to "
                              "communicate", kind=Kind.ZERO_SIZE)


def require_supported_types(*types: ir.Type) -> None:
    """Static-shaped tensors of float or integer elements, or Unsupported."""
    for t in types:
        if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
            raise Unsupported(f"dynamic or unranked shape {t}")
        if not isinstance(t.element_type, (ir.FloatType, ir.IntegerType)):
            raise Unsupported(f"element type {t.element_type} is not a float or integer type")
