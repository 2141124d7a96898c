"""Base class of the rewrite passes: options, site log, channel handles, the driver.

A pass is a frozen dataclass whose fields are its options (`threshold_mib` is
spelled `threshold-mib` in pipeline text). Subclasses name the op their pattern is
rooted at and implement `rewrite_site`, which either rewrites through the
`PatternRewriter` and returns a description, raises `NoMatch` (not a candidate), or
raises `Unsupported` (a candidate left unchanged; the reason is logged).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.ir import compat
from overlap_hlo.ir.dominance import Callers
from overlap_hlo.ir.dots import tensor_bytes
from overlap_hlo.ir.locations import describe
from overlap_hlo.ir.normalize import normalize
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.cost import Estimate, SiteShape
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.plan.ring_plan import RingPlan
from overlap_hlo.rewrite import builders

DEFAULT_THRESHOLD_MIB = 1.0
# Ring rounds per loop iteration: rounds that fill no iteration are emitted inline,
# so an unroll near the group size would inline every round.
MAX_UNROLL = 16
DEFAULT_PREDICTION_PROFILE = "h100-sxm"


class NoMatch(Exception):
    """The root op is not a site of this pass."""


@dataclass(frozen=True)
class Site:
    """One candidate site and what the pass decided about it."""

    location: str
    pattern: str
    applied: bool
    detail: str = ""                 # the site: dots, dims, shapes, group size
    reason: str = ""                 # why it was left unchanged
    kind: str = ""                   # the reason, grouped for statistics
    estimate: Estimate | None = None
    rule: str = ""                   # what decided a rewrite (threshold, cost model)
    profile_named: bool = True       # the estimate's profile was named (else not shown)
    rings: int = 0                   # loops built with `plan` (a gather's dots may need 2)

    @property
    def plan(self) -> RingPlan | None:
        """The ring's schedule: rounds, blocks, shifts, loop range and trip count (built
        as planned when `applied`; what the prediction assumed otherwise). None when
        the site was left unchanged before a ring was planned."""
        return self.estimate.plan if self.estimate is not None else None

    def format(self) -> str:
        facts = [self.detail]
        if self.applied and self.rule:
            facts.append(f"decided by {self.rule}")
        if self.estimate is not None and self.profile_named:
            facts.append(self.prediction())
        if not self.applied:
            facts.insert(0, self.reason)
        verdict = "rewritten" if self.applied else "left unchanged"
        return (f"{self.location}: remark: {self.pattern}: {verdict}: "
                + "; ".join(fact for fact in facts if fact))

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

    def add(self, location: ir.Location, pattern: str, applied: bool, **facts) -> None:
        self.sites.append(Site(describe(location, self.input_name), pattern, applied, **facts))


@dataclass(frozen=True)
class Decision:
    """Why a site is rewritten: its predicted times and the rule that decided."""

    estimate: Estimate
    rule: str
    rings: int = 1                   # loops the site builds with the estimate's plan


@dataclass
class Reporter:
    """Handed to `rewrite_site`: records decisions about other sites that a site settles
    (logged after the site's own record), and names locations as the log does."""

    records: list
    pattern: str
    input_name: str | None = None

    def __call__(self, location: ir.Location, applied: bool, pattern: str | None = None,
                 **facts) -> None:
        self.records.append((location, pattern or self.pattern, applied, facts))

    def where(self, location: ir.Location) -> str:
        return describe(location, self.input_name)


def statistics(sites: list[Site]) -> dict[str, dict[str, int]]:
    """Per pass: sites seen, rewritten, and left unchanged by reason."""
    table: dict[str, dict[str, int]] = {}
    for site in sites:
        row = table.setdefault(site.pattern, {"seen": 0, "rewritten": 0})
        row["seen"] += 1
        key = "rewritten" if site.applied else f"skipped: {site.kind}"
        row[key] = row.get(key, 0) + 1
    return table


INT64_MAX = 2**63 - 1


class ModuleScan:
    """What every site of one pass run needs to know of the whole module, gathered in
    one walk: the highest channel handle (new ones go above it), the
    sdy.manual_computation ops, whether GSPMD marks any region partially manual, who
    calls each function, and the number of each op named `root` in program order (by
    identity: a site's number across runs of the pass).

    A `channel_handle` or `mhlo.sharding` attribute of another type (on an op the
    passes do not know) is not a channel or a sharding: it is counted in `ignored`.
    """

    def __init__(self, module_op: ir.Operation, root: str = ""):
        self.last_channel = 0
        self.numbers: dict[int, int] = {}
        self.manual_computations: list[ir.Operation] = []
        self.partially_manual_gspmd = False
        self.ignored: list[str] = []   # "op-name attribute" of attributes not understood
        self.callers = Callers()

        def visit(op):
            attrs = op.attributes
            self.callers.note(op)
            if op.name == root:
                self.numbers[hash(op)] = len(self.numbers)
            if "channel_handle" in attrs:
                attr = attrs["channel_handle"]
                if stablehlo.ChannelHandle.isinstance(attr):
                    handle = stablehlo.ChannelHandle(attr).handle
                    self.last_channel = max(self.last_channel, handle)
                else:
                    self.ignored.append(f"{op.name} channel_handle")
            if op.name == "sdy.manual_computation":
                self.manual_computations.append(op)
            if "mhlo.sharding" in attrs:
                attr = attrs["mhlo.sharding"]
                if isinstance(attr, ir.StringAttr):
                    value = attr.value
                    self.partially_manual_gspmd |= "manual" in value and value != "{manual}"
                else:
                    self.ignored.append(f"{op.name} mhlo.sharding")
            return ir.WalkResult.ADVANCE

        module_op.walk(visit)

    def require_channels(self, count: int) -> None:
        """Unsupported unless `count` new handles fit above the highest one (checked
        before a site builds anything)."""
        if count > INT64_MAX - self.last_channel:
            raise Unsupported(f"no free channel handles: the module already uses handle "
                              f"{self.last_channel} and the ring needs {count} more",
                              kind="channel handles exhausted")

    def new_channel(self) -> int:
        if self.last_channel >= INT64_MAX:
            raise OverflowError("channel handles exhausted")   # require_channels prevents it
        self.last_channel += 1
        return self.last_channel


def verification_error(op: ir.Operation) -> str | None:
    """What the verifier says of `op`, or None when it verifies."""
    try:
        op.verify()
    except ir.MLIRError as err:
        return "; ".join(str(d.message) for d in err.error_diagnostics) or str(err)
    return None


def restore(module_op: ir.Operation, snapshot: ir.Operation) -> None:
    """Replace the body of `module_op` with a copy of `snapshot`'s."""
    body = module_op.regions[0].blocks[0]
    for op in list(body.operations):
        op.erase()
    copy = snapshot.clone()
    for op in list(copy.regions[0].blocks[0].operations):
        op.detach_from_parent()
        ir.InsertionPoint(body).insert(op)


def mib(tensor_type: ir.RankedTensorType) -> float:
    return tensor_bytes(tensor_type) / 2**20


@dataclass(frozen=True)
class RewritePass:
    """Options shared by the overlap passes."""

    threshold_mib: float | None = field(default=None, metadata={
        "help": "leave a site unchanged when its communicated tensor is smaller than "
                f"this many MiB (0: rewrite every legal site); overrides the cost model; "
                f"default {DEFAULT_THRESHOLD_MIB:g} when no hardware is named"})
    hardware: str = field(default="", metadata={
        "help": "decide by the cost model for this hardware profile "
                f"({', '.join(cost.PROFILES)}) or .json profile file"})
    bidirectional: bool | None = field(default=None, metadata={
        "help": "two streams in opposite ring directions, about N/2 rounds "
                "(groups of 2 fall back to one stream); false: one stream. Default: "
                "when the cost model decides (a hardware profile, no threshold-mib), the "
                "form it predicts faster for each site, else one stream"})
    unroll: int | None = field(default=None, metadata={
        "help": "all_gather ring rounds per loop iteration, 1 to 16 (the remainder is "
                "emitted after the loop); default 1, but 2 on TPU (the loop then alternates "
                "two buffers instead of copying the shard it carries). A reduce_scatter "
                "ring runs one round per iteration"})
    f32_sums: bool = field(default=False, metadata={
        "help": "overlap-all-gather-matmul: sum the partial products of a contracting "
                "gathered dim in f32 when the result is a narrower float (default: in the "
                "result's type, as XLA's windowed einsum does, but always in f32 for f16 "
                "and 8-bit floats); costs an f32 buffer of the result's size"})

    target: str = field(default="", metadata={
        "help": "the backend the module will be compiled for: tpu or gpu (buffers the "
                "ring writes whole are left uninitialised: custom_call @AllocateBuffer), "
                "cpu; default: the hardware profile's, else forms every backend runs"})

    device_coords: str = field(default="", metadata={
        "help": "where each device sits on the slice, EXTENTS:COORDS (e.g. "
                "2x4:0,0;1,0;0,1;...; an extent ending in t wraps around): rings then "
                "visit their group in an order of physical neighbours. overlap-report "
                "sets it from --tpu; overlap_hlo.targets.tpu.device_coords(SLICE) gives it"})

    # The profile predictions use, loaded once per pass instance (not per site).
    profile: cost.Hardware = field(init=False, repr=False, compare=False)
    links: Links | None = field(init=False, repr=False, compare=False)

    name: ClassVar[str] = ""
    root: ClassVar[type] = object
    summary: ClassVar[str] = ""
    tpu_unroll: ClassVar[int] = 1    # the unroll of the TPU forms

    def __post_init__(self):
        try:
            profile = cost.hardware(self.hardware or DEFAULT_PREDICTION_PROFILE)
        except (OSError, TypeError, ValueError) as err:
            raise ValueError(f"pass '{self.name}': {err}") from None
        object.__setattr__(self, "profile", profile)
        try:
            links = Links.parse(self.device_coords) if self.device_coords else None
        except ValueError as err:
            raise ValueError(f"pass '{self.name}': device-coords: {err}") from None
        object.__setattr__(self, "links", links)
        if self.threshold_mib is not None and not self.threshold_mib >= 0:  # rejects nan
            raise ValueError(f"pass '{self.name}': threshold-mib must be >= 0, "
                             f"got {self.threshold_mib}")
        if self.target not in cost.PLATFORMS:
            raise ValueError(f"pass '{self.name}': target must be one of tpu, gpu, cpu, got "
                             f"'{self.target}'")
        if self.unroll is None:
            object.__setattr__(self, "unroll", self.tpu_unroll if self.platform == "tpu" else 1)
        if self.unroll < 1:
            raise ValueError(f"pass '{self.name}': unroll must be >= 1, got {self.unroll}")
        if self.unroll > MAX_UNROLL:
            raise ValueError(f"pass '{self.name}': unroll must be at most {MAX_UNROLL}, got "
                             f"{self.unroll}")

    def ring_orders(self, ring) -> Callable[[int], object]:
        """`ring` in the order it visits its groups with 1 or 2 streams
        (`Ring.in_physical_order`), each order searched for once per site."""
        found: dict[int, object] = {}

        def ordered(streams: int):
            if streams not in found:
                found[streams] = ring.in_physical_order(self.links, streams)
            return found[streams]

        return ordered

    def planned(self, site: SiteShape, ordered: Callable[[int], object],
                plan: RingPlan) -> SiteShape:
        """`site` with ring plan `plan`, and the link load of that ring's step in the
        order `ordered` (from `ring_orders`) gives it."""
        return dataclasses.replace(site, plan=plan, link_load=ordered(plan.streams).step_load(
            self.links, plan.streams))

    @property
    def platform(self) -> str:
        """The backend the forms are for: `target`, else the named profile's, else ""."""
        return self.target or (self.profile.platform if self.hardware else "")

    @classmethod
    def options(cls) -> dict[str, dataclasses.Field]:
        return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls) if f.init}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> RewritePass:
        """Build from pipeline-text options; raises ValueError on a bad one."""
        known = cls.options()
        values = {}
        for key, text in options.items():
            if key not in known:
                raise ValueError(f"pass '{cls.name}' has no option '{key}' "
                                 f"(options: {', '.join(known)})")
            values[known[key].name] = _convert(known[key], text, cls.name)
        return cls(**values)

    def rewrite_site(self, op, rewriter, scan: ModuleScan, report=None
                     ) -> tuple[str, Decision]:
        """Rewrite the site rooted at `op`; `report(location, applied, **facts)` records
        a decision about another site of this pass that this one settles."""
        raise NotImplementedError

    def run(self, module_op: ir.Operation, log: SiteLog) -> None:
        """Apply this pass's pattern to `module_op` with MLIR's greedy driver.

        A site whose rewrite raises an error or leaves IR that does not verify is left
        unchanged and reported as an internal error: the pass starts over from a copy
        of the module taken before it ran, without that site (and, after a module that
        did not verify, verifying after every site to find the one to blame)."""
        normalize(module_op)   # identical branches inlined, legacy dots as dot_general
        snapshot = module_op.clone()
        broken: dict[int, str] = {}            # site number -> why its rewrite failed
        careful = False
        while True:
            records: list = []   # (location, pattern, applied, facts), logged on success
            failure = self._apply(module_op, records, broken, careful, log.input_name)
            if failure is None:
                error = verification_error(module_op)
                if error is None:
                    for location, pattern, applied, facts in records:
                        log.add(location, pattern, applied, **facts)
                    return
                if careful:   # every site verified: something else broke the module
                    raise RuntimeError(f"{self.name}: the module does not verify: {error}")
                careful = True
            else:
                broken[failure[0]] = failure[1]
            restore(module_op, snapshot)

    def _apply(self, module_op: ir.Operation, records: list, broken: dict[int, str],
               careful: bool, input_name: str | None) -> tuple[int, str] | None:
        """One greedy run, recording each site's fate in `records`; returns (site number,
        error) for the first site whose rewrite raised (or, when `careful`, left the
        module invalid), after which the run stops rewriting. `broken` sites are skipped."""
        scan = ModuleScan(module_op, self.root.OPERATION_NAME)
        # Root ops already decided in this run: the greedy driver revisits an op whose
        # neighbours changed (an all_gather kept for other readers, a site left
        # unchanged), and each site gets one decision and one record. Keys are the
        # ops' identities: roots are never created by a rewrite, so a key is not reused.
        decided: set[int] = set()
        named = bool(self.hardware)
        failure: list[tuple[int, str]] = []
        log = Reporter(records, self.name)

        def pattern(op, rewriter):
            key = hash(op.operation)
            if failure or key in decided:
                return True
            decided.add(key)
            location = op.location  # read before the rewrite erases `op`
            number = scan.numbers.get(key, -1)
            if number in broken:
                log(location, False, kind="internal error", reason=(
                    f"internal error: its rewrite failed ({broken[number]}); the site is "
                    "valid input, left as it was (please report it)"), profile_named=named)
                return True

            reports = []   # other sites this one settles, recorded after it
            report = Reporter(reports, self.name, input_name)

            try:
                try:
                    with location, builders.shared_scalars():
                        outcome = self.rewrite_site(op, rewriter, scan, report)
                except NoMatch:
                    return True
                except Unsupported as reason:
                    log(location, False, reason=str(reason), kind=reason.kind,
                        detail=reason.detail, estimate=reason.estimate, profile_named=named)
                    return True
                except Exception as err:   # noqa: BLE001 - any failure leaves the site as it was
                    failure.append((number, f"{type(err).__name__}: {err}"))
                    return False
                error = verification_error(module_op) if careful else None
                if error is not None:
                    failure.append((number, f"the rewritten module does not verify: {error}"))
                    return False
                detail, decision = outcome
                log(location, True, detail=detail, estimate=decision.estimate,
                    rule=decision.rule, profile_named=named, rings=decision.rings)
                return False  # the bindings read a falsy result as "matched and rewrote"
            finally:
                for where, pattern_name, applied, facts in reports:
                    log(where, applied, pattern_name, profile_named=named, **facts)

        patterns = compat.RewritePatternSet()
        patterns.add(self.root, pattern)
        config = compat.GreedyRewriteConfig()
        config.enable_folding = False
        config.enable_constant_cse = False
        config.region_simplification_level = compat.GreedySimplifyRegionLevel.DISABLED
        config.use_top_down_traversal = True  # sites numbered in program order
        compat.apply_patterns_and_fold_greedily(module_op, patterns.freeze(), config)
        return failure[0] if failure else None

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
        by_model = self.threshold_mib is None and bool(self.hardware)
        forms = ([self.bidirectional] if self.bidirectional is not None
                 else [False, True] if by_model else [False])
        estimates = [cost.estimate(shape_of(form), profile) for form in forms]
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
                                  kind="below threshold-mib", detail=detail, estimate=estimate)
            return Decision(estimate, f"{rule}: {size:.3g} MiB communicated")
        if not estimate.pays():
            raise Unsupported(f"not profitable on {profile.name} (the cost model: less than "
                              f"{cost.MARGIN:.0%} faster)", kind="not profitable",
                              detail=detail, estimate=estimate)
        chosen = ""
        if len({e.plan.streams for e in estimates}) > 1:
            chosen = (f", {'two streams' if estimate.plan.streams == 2 else 'one stream'} "
                      "(the faster form)")
        return Decision(estimate, f"the cost model for {profile.name}{chosen}")


def _convert(f: dataclasses.Field, text: str, pass_name: str):
    kind = f.type if isinstance(f.type, type) else eval_type_name(f.type)
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return kind(text)
    except ValueError:
        raise ValueError(f"pass '{pass_name}': option '{f.name.replace('_', '-')}' "
                         f"expects {kind.__name__}, got '{text}'") from None


def eval_type_name(name: str) -> type:
    """Field annotations are strings under `from __future__ import annotations`."""
    return {"float": float, "float | None": float, "int": int, "int | None": int,
            "bool": bool, "bool | None": bool, "str": str}[name]


def require_supported_types(*types: ir.Type) -> None:
    """Static-shaped tensors of float or integer elements, or Unsupported."""
    for t in types:
        if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
            raise Unsupported(f"dynamic or unranked shape {t}")
        if not isinstance(t.element_type, (ir.FloatType, ir.IntegerType)):
            raise Unsupported(f"element type {t.element_type} is not a float or integer type")
