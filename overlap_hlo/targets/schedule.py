"""Read a compiled, scheduled HLO module: what overlaps what, and how long it takes.

The schedule comes from jaxlib's typed HLO bindings (`HloModule.schedule().sequence`,
instruction opcodes, operands and users); shapes, source locations, cycle estimates and
loop constants come from the module's proto (`hlo_proto`). The module is walked in
schedule order on one compute stream and one lane per link direction:

- an instruction with a cycle estimate (`estimated_cycles` in its backend config, the
  TPU compiler's own figure) occupies the compute stream for cycles / clock (a
  `Timing` subclass may price instructions otherwise: `gpu_timing`);
- a `collective-permute-start` puts its operand on the link lane of its
  source->target pairs (latency + bytes x the pairs sharing its busiest link, its own
  and those of permutes already in flight / (one-direction link bandwidth x
  efficiency): the cost model's shift time when no link is shared, `Timing.links`);
  its `collective-permute-done` waits for it: the wait
  is exposed communication, the compute scheduled in between is its window;
- a synchronous collective (all-gather, reduce-scatter, all-reduce, all-to-all) holds
  the compute stream for a ring over both link directions, as the cost model credits
  the library collective; asynchronous ones (`*-start`/`*-done`, `async-start`) are
  timed like permutes; a fusion wrapping a collective is that collective, and one that
  also holds a matmul (libtpu's async collective fusion) computes for its cycle
  estimate while the collective's own operand travels, exposing only the excess;
- a `while` runs its body `trip_count` times (found by `trip_count`, below).

Copies between memories (`copy-start`, `slice-start`) and instructions without a
cycle estimate take no time. Every figure is a model of the schedule, not a
measurement.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_order import Links
from overlap_hlo.targets.hlo_proto import Instruction, ModuleProto, parse_module

MATMUL_OPCODES = frozenset({"convolution", "dot", "ragged-dot"})
SYNC_COLLECTIVES = frozenset({"all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                              "collective-permute", "ragged-all-to-all",
                              "collective-broadcast"})
# What a fusion wrapping a collective may do besides it and still be that collective.
DATA_MOVEMENT = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                           "reshape", "copy", "slice", "dynamic-slice", "transpose",
                           "broadcast", "convert", "concatenate", "pad"})
ASYNC_STARTS = frozenset({"collective-permute-start", "all-gather-start",
                          "all-reduce-start", "async-start"})
ASYNC_DONES = frozenset({"collective-permute-done", "all-gather-done", "all-reduce-done",
                         "async-done"})
COLLECTIVES = SYNC_COLLECTIVES | {"all-gather", "all-reduce", "collective-permute"}
# libtpu's decomposed async collective: a fusion wrapping the collective whose root is the
# first custom call starts it, one whose root is the second waits for it; the fusions
# between them reading the start's results (an all-gather's continuation fused with a
# weight gradient's dot) compute meanwhile. Each of the three wraps the collective.
ASYNC_COLLECTIVE_START = "AsyncCollectiveStart"
ASYNC_COLLECTIVE_DONE = "AsyncCollectiveDone"


@dataclass(frozen=True)
class Timing:
    """How instructions become microseconds: the compiler's cycles at `clock_ghz`,
    transfers on `hardware`'s links."""

    hardware: cost.Hardware
    clock_ghz: float
    partitions: int = 1
    links: Links | None = None     # where partition i sits: a permute pays its busiest link

    def compute_us(self, instr: Instruction, proto: ModuleProto | None = None) -> float:
        """One execution of `instr` (`proto`: its module, for timings that look into
        fusions)."""
        cycles = instr.estimated_cycles()
        return cycles / (self.clock_ghz * 1e3) if cycles else 0.0

    def permute_us(self, nbytes: int, pairs: tuple = (), alongside: tuple = ()) -> float:
        """One permute: its bytes times the pairs crossing its busiest link, its own and
        those of the permutes in flight `alongside` (one when no link is shared, or
        without `links`)."""
        load = self.links.max_link_load(pairs, alongside) if self.links and pairs else 1
        return self.hardware.shift_us(nbytes * max(load, 1))

    def collective_us(self, opcode: str, in_bytes: int, out_bytes: int, n: int,
                      group: tuple[int, ...] = ()) -> float:
        """A library collective among n devices, over the link directions its `group`
        (partition ids) can use at once (the cost model's `Hardware.collective_us`
        and `Links.collective_directions`; 2 without links or a group; an all-reduce
        is a reduce-scatter then an all-gather)."""
        if n <= 1:
            return 0.0
        directions = 2     # an all-to-all's blocks cross several hops: a ring's two
        if self.links is not None and len(group) == n and "all-to-all" not in opcode and \
                all(0 <= d < len(self.links.coords) for d in group):
            directions = self.links.collective_directions(group)

        def ring(nbytes: float, size: int) -> float:
            return self.hardware.collective_us(nbytes, size, directions)

        if opcode == "all-gather":
            return ring(out_bytes / n, n)
        if opcode in ("reduce-scatter", "all-to-all", "ragged-all-to-all"):
            return ring(in_bytes / n, n)
        if opcode == "all-reduce":
            return 2 * ring(in_bytes / n, n)
        return self.hardware.shift_us(in_bytes)   # collective-permute, collective-broadcast


@dataclass(frozen=True)
class Span:
    """One interval of the modelled timeline."""

    lane: str           # "compute", "link -1" (a permute's shift), "collectives"
    start_us: float
    end_us: float
    name: str
    kind: str           # "matmul", "compute", "copy", "permute", "collective", "wait"
    location: str


@dataclass
class Permute:
    """One collective-permute start..done pair of the schedule (a static instruction;
    `executions` counts how often the loops around it run it)."""

    name: str
    computation: str
    location: str
    bytes: int
    transfer_us: float
    window: tuple[str, ...]          # compute instructions scheduled between start and done
    window_cycles: int               # the compiler's estimate for them
    window_matmul: bool              # a matmul among them: the permute overlaps a matmul
    lane: str = ""                   # its link direction ("link -1")
    synchronous: bool = False        # scheduled as one synchronous instruction
    executions: int = 0
    exposed_us: float = 0.0          # waited at the done, all executions together

    @property
    def overlapped(self) -> bool:
        return self.window_matmul


@dataclass
class Collective:
    """A collective other than a permute, left in the schedule."""

    name: str
    opcode: str
    location: str
    bytes: int
    time_us: float                   # one execution
    executions: int = 0
    exposed_us: float = 0.0


@dataclass(frozen=True)
class Loop:
    name: str
    location: str
    body: str
    trip_count: int | None           # None: not recognised (the body is counted once)


@dataclass(frozen=True)
class LoopCopy:
    """A copy of a loop-carried buffer inside a loop body."""

    name: str
    body: str
    location: str
    bytes: int
    cycles: int


@dataclass
class Analysis:
    """The schedule of one compiled module, modelled (see the module docstring)."""

    total_us: float = 0.0
    compute_us: float = 0.0
    exposed_us: float = 0.0
    matmul_us: float = 0.0   # the compiler's estimates of every matmul run, summed apart
    temp_bytes: int = 0
    permutes: list[Permute] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    loop_copies: list[LoopCopy] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    # name -> compute microseconds over all executions; location -> those names
    compute_by_name: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    names_by_location: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    hlo_module: object = field(default=None, repr=False)
    proto: ModuleProto | None = field(default=None, repr=False)
    _typed: dict | None = field(default=None, repr=False)

    def permutes_at(self, location: str) -> list[Permute]:
        return [p for p in self.permutes if p.location == location]

    def compute_by_category(self, names: set[str] | None = None) -> dict[str, float]:
        """Compute microseconds (over every execution) by what the instruction does:
        "dots" (a matmul, with what is fused into it), "accumulation" (an add of its
        own), "copies" (of a buffer), "initialisation" (a broadcast filling a buffer),
        "other". Only the instructions in `names`, when given."""
        totals: dict[str, float] = defaultdict(float)
        for name, us in self.compute_by_name.items():
            if names is None or name in names:
                totals[instruction_category(self.proto, self.proto.by_name[name])] += us
        return dict(totals)

    def collectives_at(self, location: str) -> list[Collective]:
        return [c for c in self.collectives if c.location == location]

    def matmuls_beside(self, collective: Collective) -> list[Instruction]:
        """The matmuls reading a gather's result or producing a scatter's operand."""
        instr = self.proto.by_name.get(collective.name)
        if instr is None:
            return []
        if self._typed is None:
            self._typed = typed_instructions(self.hlo_module)
        return neighbour_matmuls(self.hlo_module, self.proto, instr, typed=self._typed)


TripCounts = Callable[[ModuleProto, Instruction], "int | None"]


def trip_count(module: ModuleProto, loop: Instruction) -> int | None:
    """Iterations of a counted `while`, read from the loop itself.

    The condition's root compares tuple element i of its parameter with a constant;
    the loop's init tuple holds a constant at i and the body's root tuple holds
    element i plus a constant. (The TPU compiler records no known trip count on these
    loops; this is the one place that reads it, so a ring plan can replace it.) XLA's
    GPU compiler records it (`known_trip_count` in the loop's backend config): that
    comes first.
    """
    known = loop.config().get("known_trip_count")
    if isinstance(known, dict) and str(known.get("n", "")).isdigit():
        return int(known["n"])
    called = module.called(loop)
    if len(called) != 2:
        return None
    cond, body = sorted(called, key=lambda c: c.root.shape.dims == ()
                        and c.root.shape.element_type == 1, reverse=True)
    compare = cond.root
    if compare.opcode != "compare" or len(compare.operand_ids) != 2:
        return None
    a, b = (_through(module, o) for o in module.operands(compare))
    direction = compare.comparison
    if _constant(module, a) is not None and b.opcode == "get-tuple-element":
        a, b = b, a
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    limit = _constant(module, b)
    if a.opcode != "get-tuple-element" or limit is None:
        return None
    index = a.tuple_index
    init_tuple = module.operands(loop)[0] if loop.operand_ids else None
    if init_tuple is None or init_tuple.opcode != "tuple" or index >= len(init_tuple.operand_ids):
        return None
    start = _constant(module, module.operands(init_tuple)[index])
    step = _increment(module, body, index)
    if start is None or not step:
        return None
    if direction in ("LT", "LE") and step > 0:
        span = limit - start + (direction == "LE")
    elif direction in ("GT", "GE") and step < 0:
        span = start - limit + (direction == "GE")
        step = -step
    else:
        return None
    return max(0, math.ceil(span / step))


def _through(module: ModuleProto, instr: Instruction) -> Instruction:
    """`instr` with copies, converts and bitcasts looked through."""
    for _ in range(4):
        if instr.opcode not in ("copy", "convert", "bitcast") or not instr.operand_ids:
            break
        instr = module.operands(instr)[0]
    return instr


def _constant(module: ModuleProto, instr: Instruction) -> int | None:
    """The integer a scalar constant holds, through copies and converts."""
    instr = _through(module, instr)
    if instr.opcode == "constant" and len(instr.literal) == 1:
        return instr.literal[0]
    return None


def _increment(module: ModuleProto, body, index: int) -> int | None:
    """The constant the body adds to element `index` of its carried tuple."""
    root = body.root
    if root.opcode != "tuple" or index >= len(root.operand_ids):
        return None
    update = _through(module, module.operands(root)[index])   # a copy when a barrier reads k
    if update.opcode not in ("add", "subtract"):
        return None
    x, y = (_through(module, o) for o in module.operands(update))
    for carried, amount in ((x, y), (y, x)):
        value = _constant(module, amount)
        if (value is not None and carried.opcode == "get-tuple-element"
                and carried.tuple_index == index):
            return value if update.opcode == "add" else -value
    return None


def analyze(hlo_module, timing: Timing, *, trip_counts: TripCounts = trip_count,
            temp_bytes: int = 0, timeline: bool = True) -> Analysis:
    """Model the schedule of `hlo_module` (a typed jaxlib `HloModule` that is
    scheduled, as `executable.hlo_modules()[0]` is after compilation)."""
    proto = parse_module(hlo_module.as_serialized_hlo_module_proto())
    walker = _Walker(hlo_module, proto, timing, trip_counts, timeline)
    entry = proto.computations[proto.entry_id]
    end = walker.run(entry.name, 0.0)
    result = walker.result
    result.hlo_module, result.proto = hlo_module, proto
    result.total_us = end
    result.temp_bytes = temp_bytes
    result.matmul_us = walker.matmuls(entry.name)
    walker.find_loop_copies()
    return result


@dataclass(frozen=True)
class _InFlight:
    computation: str
    index: int
    end: float
    op: str
    nbytes: int
    duration: float
    lane: str


class _Walker:
    """Walks computations in schedule order and fills an Analysis."""

    def __init__(self, hlo_module, proto: ModuleProto, timing: Timing,
                 trip_counts: TripCounts, timeline: bool):
        self.proto = proto
        self.timing = timing
        self.trip_counts = trip_counts
        self.timeline = timeline
        self.sequences = scheduled_sequences(hlo_module, proto)
        self.result = Analysis()
        self.lanes: dict[tuple, str] = {}       # pairs -> lane name
        self.fused: dict[str, Instruction | None] = {}   # fusion -> the collective it wraps
        self.lane_free: dict[str, float] = defaultdict(float)
        self.permutes: dict[str, Permute] = {}
        self.in_flight: dict[str, _InFlight] = {}
        self.collectives: dict[str, Collective] = {}
        self.loops: dict[str, Loop] = {}
        self._matmul_cache: dict[int, bool] = {}
        self.async_reads: dict[str, str] = {}   # instruction -> the async start it reads

    # -- classification ---------------------------------------------------------------

    def is_matmul(self, instr: Instruction) -> bool:
        if instr.id not in self._matmul_cache:
            self._matmul_cache[instr.id] = contains_matmul(self.proto, instr)
        return self._matmul_cache[instr.id]

    def loop_has_matmul(self, instr: Instruction) -> bool:
        """A while or call whose computations schedule a matmul."""
        if instr.opcode not in ("while", "call", "conditional"):
            return False
        return any(self.is_matmul(i) or self.loop_has_matmul(i)
                   for comp in self.proto.called(instr)
                   for i in self.sequences.get(comp.name, []))

    def location(self, instr: Instruction) -> str:
        return instr.location.format() if instr.location else ""

    def span(self, lane: str, start: float, end: float, instr: Instruction, kind: str):
        if self.timeline and end > start:
            self.result.spans.append(Span(lane, start, end, instr.name, kind,
                                          self.location(instr)))

    def lane(self, pairs: tuple) -> str:
        """The link lane of a permute's source->target pairs (permutes with the same
        pairs share their links), named by its most common shift ("link -1": to the
        previous device); library collectives share the lane "collectives"."""
        key = tuple(sorted(pairs))
        if key not in self.lanes:
            if key == ("*",):
                name = "collectives"
            else:
                shifts = Counter(t - s for s, t in key)
                name = f"link {shifts.most_common(1)[0][0]:+d}" if shifts else "link"
            taken = set(self.lanes.values())
            self.lanes[key] = name if name not in taken else f"{name} ({len(taken)})"
        return self.lanes[key]

    # -- the walk ---------------------------------------------------------------------

    def run(self, computation: str, t: float) -> float:
        sequence = self.sequences.get(computation, [])
        for index, instr in enumerate(sequence):
            op = instr.opcode
            if op == "while":
                t = self.run_loop(instr, t)
            elif op in ("call", "conditional"):
                branches = [c.name for c in self.proto.called(instr)]
                if op == "call":
                    for name in branches:
                        t = self.run(name, t)
                elif branches:
                    t = max(self.run(name, t) for name in branches)
            elif op in ASYNC_STARTS and self.collective_kind(instr) in COLLECTIVES:
                self.start_transfer(instr, computation, index, t)
            elif op in ASYNC_DONES:
                t = self.finish_transfer(instr, computation, index, t)
            elif op in SYNC_COLLECTIVES:
                t = self.sync_collective(instr, computation, t)
            elif self.async_reads and (started := self.reads_async_start(instr)) is not None:
                if self.async_collective_role(instr) == ASYNC_COLLECTIVE_DONE:
                    t = self.finish_fused_transfer(instr, started, t)
                else:   # what computes while it travels (get-tuple-elements, continuations)
                    self.async_reads[instr.name] = started
                    t = self.compute(instr, t)
            elif op == "fusion" and (inner := self.fused_collective(instr)) is not None:
                if self.async_collective_role(instr) == ASYNC_COLLECTIVE_START:
                    self.start_fused_transfer(instr, inner, computation, index, t)
                    t = self.compute(instr, t)
                elif self.is_matmul(instr) or self.computes_besides(instr):
                    t = self.collective_matmul(instr, t, inner)
                else:
                    t = self.sync_collective(instr, computation, t, inner)
            else:
                t = self.compute(instr, t)
        return t

    def compute(self, instr: Instruction, t: float) -> float:
        duration = self.timing.compute_us(instr, self.proto)
        if duration:
            kind = ("matmul" if self.is_matmul(instr) else
                    "copy" if instr.opcode == "copy" else "compute")
            self.span("compute", t, t + duration, instr, kind)
            self.result.compute_us += duration
            self.result.compute_by_name[instr.name] += duration
            self.result.names_by_location[self.location(instr)].add(instr.name)
        return t + duration

    def run_loop(self, loop: Instruction, t: float) -> float:
        trips = self.trip_counts(self.proto, loop)
        called = self.proto.called(loop)
        body = next((c for c in called if c.root.shape.element_type != 1 or c.root.shape.dims),
                    None)
        if body is None:
            return t
        self.loops.setdefault(loop.name, Loop(loop.name, self.location(loop), body.name, trips))
        for _ in range(1 if trips is None else trips):
            t = self.run(body.name, t)
        return t

    def collective_kind(self, instr: Instruction) -> str:
        """The collective a start stands for ("slice" for an async slice: no transfer)."""
        if instr.opcode == "async-start":
            wrapped = [c.root for c in self.proto.called(instr)]
            root = wrapped[0] if wrapped else None
            if root is not None and root.opcode == "fusion":   # XLA:GPU fuses a collective
                inner = [i for c in self.proto.called(root) for i in c.instructions
                         if i.opcode in COLLECTIVES]
                return inner[0].opcode if inner else root.opcode
            return root.opcode if root is not None else ""
        return instr.opcode.removesuffix("-start")

    def transfer_bytes(self, instr: Instruction) -> tuple[str, int, int]:
        """(collective opcode, bytes in, bytes out) of a start or sync collective."""
        operands = self.proto.operands(instr)
        in_bytes = sum(o.shape.nbytes for o in operands)
        op = self.collective_kind(instr)
        if instr.opcode == "async-start":
            wrapped = [c.root for c in self.proto.called(instr)]
            return op, in_bytes, wrapped[0].shape.nbytes
        shape = instr.shape
        if shape.tuple_shapes and op == "all-gather":
            out = shape.tuple_shapes[-1].nbytes
        elif shape.tuple_shapes:
            out = in_bytes
        else:
            out = shape.nbytes
        return op, in_bytes, out

    def transfer_us(self, instr: Instruction, op: str, in_bytes: int, out_bytes: int,
                    alongside: tuple = ()) -> float:
        if op == "collective-permute":
            return self.timing.permute_us(in_bytes, instr.pairs, alongside)
        n = instr.group_size
        if not n and op == "all-gather" and in_bytes:
            n = round(out_bytes / in_bytes)
        elif not n and op == "reduce-scatter" and out_bytes:
            n = round(in_bytes / out_bytes)
        return self.timing.collective_us(op, in_bytes, out_bytes, n or self.timing.partitions,
                                         instr.group)

    def start_transfer(self, instr: Instruction, computation: str, index: int, t: float):
        op, in_bytes, out_bytes = self.transfer_bytes(instr)
        lane = self.lane(instr.pairs) if op == "collective-permute" else self.lane(("*",))
        begin = max(t, self.lane_free[lane])
        alongside = () if op != "collective-permute" else tuple(   # permutes in flight
            pair for key, name in self.lanes.items()
            if name != lane and key != ("*",) and self.lane_free[name] > begin
            for pair in key)
        duration = self.transfer_us(instr, op, in_bytes, out_bytes, alongside)
        self.send(instr, lane, begin, duration, op, in_bytes, computation, index)

    def send(self, instr: Instruction, lane: str, begin: float, duration: float, op: str,
             nbytes: int, computation: str, index: int) -> None:
        """A transfer started by `instr` at `begin` on `lane`: in flight until its done."""
        end = begin + duration
        self.lane_free[lane] = end
        self.span(lane, begin, end, instr,
                  "permute" if op == "collective-permute" else "collective")
        self.in_flight[instr.name] = _InFlight(computation, index, end, op, nbytes, duration,
                                               lane)

    def wait_for(self, done: Instruction, flight: _InFlight, t: float) -> float:
        """The time `done`, at `t`, waits for `flight` (a span, and exposed)."""
        wait = max(0.0, flight.end - t)
        if wait:
            self.span("compute", t, flight.end, done, "wait")
        self.result.exposed_us += wait
        return wait

    def window(self, flight: _InFlight, computation: str, done_index: int) -> list[Instruction]:
        """The instructions scheduled between a start and its done (a done in a later
        iteration or computation: the rest of the start's sequence, then the done's)."""
        sequence = self.sequences[computation]
        if flight.computation == computation and flight.index < done_index:
            return sequence[flight.index + 1:done_index]
        return self.sequences[flight.computation][flight.index + 1:] + sequence[:done_index]

    def finish_transfer(self, done: Instruction, computation: str, done_index: int,
                        t: float) -> float:
        starts = [o for o in self.proto.operands(done) if o.name in self.in_flight]
        if not starts:
            return t
        start = starts[0]
        flight = self.in_flight.pop(start.name)
        end, op, nbytes, duration = flight.end, flight.op, flight.nbytes, flight.duration
        wait = self.wait_for(done, flight, t)
        location = self.location(start)
        if op == "collective-permute":
            between = ([] if start.name in self.permutes
                       else self.window(flight, computation, done_index))
            self.note_permute(start, flight.computation, location, nbytes, duration, between,
                              flight.lane).exposed_us += wait
        else:
            self.note_collective(start, op, nbytes, duration, wait)
        return max(t, end)

    def async_collective_role(self, fusion: Instruction) -> str:
        """ASYNC_COLLECTIVE_START or _DONE for libtpu's fusions that start or wait for
        an async collective (their root's custom-call target), else ""."""
        roots = [c.root for c in self.proto.called(fusion)] if fusion.opcode == "fusion" \
            else []
        target = roots[0].custom_call_target if roots and roots[0].opcode == "custom-call" \
            else ""
        return target if target in (ASYNC_COLLECTIVE_START, ASYNC_COLLECTIVE_DONE) else ""

    def reads_async_start(self, instr: Instruction) -> str | None:
        """The async collective start in flight that `instr` reads, directly or through
        what read it before (get-tuple-elements, continuation fusions), if any."""
        for operand in self.proto.operands(instr):
            started = self.async_reads.get(operand.name)
            if started is not None and started in self.in_flight:
                return started
        return None

    def start_fused_transfer(self, fusion: Instruction, inner: Instruction, computation: str,
                             index: int, t: float) -> None:
        """libtpu's async collective start: the collective it wraps leaves now."""
        in_bytes = sum(o.shape.nbytes for o in self.proto.operands(inner))
        out_bytes = inner.shape.nbytes
        lane = self.lane(("*",))
        duration = self.transfer_us(inner, inner.opcode, in_bytes, out_bytes)
        self.send(fusion, lane, max(t, self.lane_free[lane]), duration, inner.opcode,
                  max(in_bytes, out_bytes), computation, index)
        self.async_reads[fusion.name] = fusion.name

    def finish_fused_transfer(self, done: Instruction, started: str, t: float) -> float:
        """libtpu's async collective done: waits for the transfer `started` began; the
        collective is noted at the done's location (the start has none)."""
        flight = self.in_flight.pop(started)
        self.async_reads = {k: v for k, v in self.async_reads.items() if v != started}
        wait = self.wait_for(done, flight, t)
        self.note_collective(done, flight.op, flight.nbytes, flight.duration, wait)
        return self.compute(done, max(t, flight.end))

    def fused_collective(self, fusion: Instruction) -> Instruction | None:
        """The collective a fusion wraps, if any: libtpu fuses a reduce-scatter that
        XLA's partitioner writes as an all-reduce and a dynamic-slice into one fusion
        (`calls=%all-reduce-scatter`), a synchronous collective all the same."""
        if fusion.name not in self.fused:
            inner = [i for c in self.proto.called(fusion) for i in c.instructions
                     if i.opcode in SYNC_COLLECTIVES]
            self.fused[fusion.name] = inner[0] if inner else None
        return self.fused[fusion.name]

    def computes_besides(self, fusion: Instruction) -> bool:
        """Whether a fusion wrapping a collective also computes (libtpu fuses an FSDP
        weight's all-gather with an attention softmax): more than moving, slicing or
        converting data and the scalar arithmetic of its offsets (a reduce-scatter's
        `partition-id * rows`)."""
        return any(i.opcode not in DATA_MOVEMENT and i.opcode not in SYNC_COLLECTIVES
                   and (i.shape.dims or i.shape.tuple_shapes)
                   for c in self.proto.called(fusion) for i in c.instructions)

    def sync_collective(self, instr: Instruction, computation: str, t: float,
                        inner: Instruction | None = None) -> float:
        """A synchronous collective (or a fusion wrapping one, `inner`: an all-reduce
        whose result the fusion slices is priced as the reduce-scatter it is)."""
        if inner is None:
            op, in_bytes, out_bytes = self.transfer_bytes(instr)
            duration = self.transfer_us(instr, op, in_bytes, out_bytes)
        else:
            in_bytes = sum(o.shape.nbytes for o in self.proto.operands(instr))
            out_bytes = instr.shape.nbytes
            op = inner.opcode
            if op == "all-reduce" and out_bytes < inner.shape.nbytes:
                op, in_bytes = "reduce-scatter", inner.shape.nbytes
            duration = self.transfer_us(inner, op, in_bytes, out_bytes)
        self.span("compute", t, t + duration, instr, "wait")
        self.span(self.lane(("*",)), t, t + duration, instr, "collective")
        self.result.exposed_us += duration
        if op == "collective-permute":   # synchronous: a permute that overlaps nothing
            self.note_permute(instr, computation, self.location(instr), in_bytes, duration,
                              [], synchronous=True).exposed_us += duration
        else:
            self.note_collective(instr, op, max(in_bytes, out_bytes), duration, duration)
        return t + duration

    def collective_matmul(self, fusion: Instruction, t: float, inner: Instruction) -> float:
        """libtpu's async collective fusion: a collective fused with compute (an
        all-gather with a weight gradient's dot, or with a softmax). The collective's own
        operand crosses the links while the fusion computes (its cycle estimate); only
        the transfer's excess over that compute is exposed."""
        in_bytes = sum(o.shape.nbytes for o in self.proto.operands(inner))
        out_bytes = inner.shape.nbytes
        transfer = self.transfer_us(inner, inner.opcode, in_bytes, out_bytes)
        compute = self.timing.compute_us(fusion, self.proto)
        wait = max(0.0, transfer - compute)
        self.span("compute", t, t + compute, fusion, "matmul")
        self.span("compute", t + compute, t + compute + wait, fusion, "wait")
        self.span(self.lane(("*",)), t, t + transfer, fusion, "collective")
        self.result.compute_us += compute
        self.result.compute_by_name[fusion.name] += compute
        self.result.names_by_location[self.location(fusion)].add(fusion.name)
        self.result.exposed_us += wait
        self.note_collective(fusion, inner.opcode, max(in_bytes, out_bytes), transfer, wait)
        return t + compute + wait

    def matmuls(self, computation: str) -> float:
        """The matmuls' compute in `computation`, loops by their trip counts, summed
        apart from the walk: the walk's compute is at least this, or it lost one."""
        total = 0.0
        for instr in self.sequences.get(computation, []):
            if instr.opcode == "while":
                loop = self.loops.get(instr.name)
                if loop is not None:
                    total += self.matmuls(loop.body) * (loop.trip_count or 1)
            elif instr.opcode in ("call", "conditional"):
                total += sum(self.matmuls(c.name) for c in self.proto.called(instr))
            elif self.is_matmul(instr):
                total += self.timing.compute_us(instr, self.proto)
        return total

    def note_permute(self, start: Instruction, computation: str, location: str, nbytes: int,
                     duration: float, between: list[Instruction], lane: str = "",
                     synchronous: bool = False) -> Permute:
        """The Permute of `start` (made at its first execution), one execution more."""
        permute = self.permutes.get(start.name)
        if permute is None:
            window = [i for i in between if self.timing.compute_us(i, self.proto)]
            permute = self.permutes[start.name] = Permute(
                start.name, computation, location, nbytes,
                duration, tuple(i.name for i in window),
                sum(i.estimated_cycles() or 0 for i in window),
                any(self.is_matmul(i) or self.loop_has_matmul(i) for i in between), lane,
                synchronous)
            self.result.permutes.append(permute)
        permute.executions += 1
        return permute

    def note_collective(self, instr, op, nbytes, duration, exposed):
        entry = self.collectives.get(instr.name)
        if entry is None:
            entry = self.collectives[instr.name] = Collective(
                instr.name, op, self.location(instr), nbytes, duration)
            self.result.collectives.append(entry)
        entry.executions += 1
        entry.exposed_us += exposed

    # -- after the walk ---------------------------------------------------------------

    def find_loop_copies(self) -> None:
        """Copies in loop bodies whose operand is a carried value (a parameter element)."""
        self.result.loops = list(self.loops.values())
        for loop in self.result.loops:
            for instr in self.sequences.get(loop.body, []):
                if instr.opcode != "copy":
                    continue
                source = self.proto.operands(instr)[0]
                if source.opcode == "get-tuple-element" and \
                        self.proto.operands(source)[0].opcode == "parameter":
                    self.result.loop_copies.append(LoopCopy(
                        instr.name, loop.body, self.location(instr), instr.shape.nbytes,
                        instr.estimated_cycles() or 0))


def scheduled_sequences(hlo_module, proto: ModuleProto) -> dict[str, list[Instruction]]:
    """Computation name -> its instructions in schedule order (typed bindings), decoded."""
    schedule = hlo_module.schedule()
    sequences = {}
    for comp in hlo_module.computations():
        try:
            sequence = schedule.sequence(comp)
        except IndexError:  # fusion computations have no sequence of their own
            continue
        sequences[comp.name] = [proto.by_name[i.name] for i in sequence]
    return sequences


def neighbour_matmuls(hlo_module, proto: ModuleProto, collective: Instruction,
                      depth: int = 3, typed: dict | None = None) -> list[Instruction]:
    """The matmul instructions that read a gather's result or produce a scatter's
    operand, through up to `depth` instructions (bitcasts, copies, dones), found with
    the typed bindings' users() and operands(). `typed`: name -> typed instruction."""
    if typed is None:
        typed = typed_instructions(hlo_module)
    gathers = collective.opcode in ("all-gather", "all-gather-start") or (
        collective.opcode == "async-start" and any(
            c.root.opcode == "all-gather" for c in proto.called(collective)))
    found, frontier, seen = [], [collective.name], set()
    for _ in range(depth):
        nxt = []
        for name in frontier:
            instr = typed.get(name)
            if instr is None:
                continue
            neighbours = instr.users() if gathers else instr.operands()
            for other in neighbours:
                if other.name in seen:
                    continue
                seen.add(other.name)
                decoded = proto.by_name.get(other.name)
                if decoded is None:
                    continue
                if contains_matmul(proto, decoded):
                    found.append(decoded)
                else:
                    nxt.append(other.name)
        frontier = nxt
    return found


def typed_instructions(hlo_module) -> dict[str, object]:
    return {i.name: i for comp in hlo_module.computations() for i in comp.instructions()}


CATEGORY_OF_ROOT = {"add": "accumulation", "copy": "copies", "broadcast": "initialisation"}
CATEGORIES = ("dots", "accumulation", "copies", "initialisation", "other")


def instruction_category(proto: ModuleProto, instr: Instruction) -> str:
    """What a computing instruction does, for compute breakdowns (Analysis)."""
    if contains_matmul(proto, instr):
        return "dots"
    called = proto.called(instr) if instr.opcode == "fusion" else []
    root = called[0].root.opcode if called else instr.opcode
    return CATEGORY_OF_ROOT.get(root, "other")


def contains_matmul(proto: ModuleProto, instr: Instruction) -> bool:
    """A dot or convolution, or a fusion with one inside."""
    if instr.opcode in MATMUL_OPCODES:
        return True
    return instr.opcode == "fusion" and any(
        contains_matmul(proto, inner) for comp in proto.called(instr)
        for inner in comp.instructions)
