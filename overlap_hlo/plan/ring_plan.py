"""The schedule of one ring, computed once: the emitters build it, the cost model
prices it, the remarks and the TPU report read it.

    plan = RingPlan("scatter", group_size=8, bidirectional=True, unroll=2)
    plan.blocks, plan.sends, plan.loop_start, plan.trip_count, plan.permutes

A ring of N devices runs rounds 0..R-1. Round k multiplies `blocks[k]` blocks (one
dot, the blocks side by side) while `sends[k]` shifts are in flight (one per
stream); every block moves N-1 times in all. Rounds `loop_start..loop_stop-1` have
one form and run in a `stablehlo.while` of `trip_count` iterations, `unroll` rounds
each; the rounds that do not fill an iteration (`remainder`) and the rounds after
`loop_stop` are emitted after the loop, those before `loop_start` before it.

all_gather ring: round k multiplies the shards of positions p+k (down stream) and
p-k (up stream) and sends them on; round 0 holds only its own shard, the last round
sends nothing. With two streams and even N they meet at p+N/2: the round before the
last sends only the down stream's shard and the last multiplies it alone.
A ring that sums products (`in_loop_sum`: a contracting gathered dim) keeps the sum
in the loop's buffer: a product added outside the loop (but round 0's, which starts
the sum) would need another buffer of the result's size. So every round of the
loop's form sends on every stream, the last one included (shifts nothing reads), and
runs in the loop:
- two streams, even N: both hold p+N/2 in the last round (`shared_rounds`), which
  multiplies both, each weighted by half; it costs one block of compute (1/N of the
  dot) and two unread shifts. Only in groups of 6 or more (in a group of 4 it would
  double the shifts);
- one stream, when the rounds after round 0 do not fill whole iterations but all N
  rounds do: the sum starts from zeros and round 0 runs in the loop too
  (`sums_from_zeros`);
- otherwise the rounds that fill no iteration run before the loop.
Not when fewer than 2 rounds have the loop's form.
The TPU form of a ring that sums (`tied_sums`): each inline round's sum passes
through an optimization_barrier before the next round adds to it; libtpu otherwise
reassociated the sum into independent products added at the end, all of them live at
once.
With two streams it keeps the all_gather layout (the own shard in round 0, beside the
first shifts; p+N/2 alone in the last round), inline unless its uniform rounds fill
two loop iterations or more (libtpu scheduled a one-trip loop's sends bare). Or, even
N >= 4 (`own_last`), every dot contracts two shards: round 0 only sends (its shifts
are exposed), round k of 1..N/2-1 multiplies p+k and p-k, the last round p+N/2
beside the device's own shard: one product of the result's size fewer, each a read
and write of the sum. Neither wins everywhere (libtpu's estimates: benchmarks/
RESULTS.md). A loop holds rounds 2..N/2-1 of the own-last layout
(round 1 starts the sum) when they fill two iterations or more; else every round is
inline.

A loop that would run once is not built (`single_trip_loop` false): its rounds are
emitted inline; XLA's GPU pipeline made the sends before such a loop synchronous. A
ring that sums products then takes the plain layout, since its layout exists for the
loop's buffer. TPU forms keep the loop: the TPU compiler inlines it itself and
schedules that form better.

reduce_scatter ring (two chains skewed by half a round): instead of the data, two
accumulators travel the ring. In each round a chain computes its partial product and
adds the accumulator it received to it, so the add fuses into the dot's output; chain
1 sends its sum at once, chain 0 at the start of the next round, so each transfer runs
beside the other chain's dot and none is in flight across a loop iteration's end. One
stream: the chains are the two halves of each block (`chains` = 2; 1 when a block is
one row, which then cannot overlap), moving the same way; their last sums are the
halves of the device's own block. Two streams (bidirectional): chain 0 is the down
stream, chain 1 the up stream; a = N//2 rounds down, N-1-a up starting in round
2a-N+1, and a last round with the device's own block, to which both arrivals add.
Round 0 adds nothing; the loop holds the rounds where every chain adds and sends.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GATHER, SCATTER = "gather", "scatter"


@dataclass(frozen=True)
class RingPlan:
    """Rounds, blocks, shifts and loop range of one ring (see the module docstring)."""

    kind: str                 # "gather" (all_gather ring) or "scatter" (reduce_scatter)
    group_size: int
    bidirectional: bool = False   # as asked for; groups of 2 use one stream
    unroll: int = 1
    in_loop_sum: bool = False     # gather rings that sum products (module docstring)
    chains: int = 2               # reduce_scatter, one stream: a block's halves (or 1)
    single_trip_loop: bool = False  # build a loop that runs once (the TPU forms)
    tied_sums: bool = False       # rings that sum: the TPU form (module docstring)
    own_last: bool = False        # its two-stream layout: the own shard last (docstring)
    views_in_loop: bool = False   # rebuild invariant views of larger buffers in the loop

    streams: int = field(init=False)
    own_in_last_round: bool = field(init=False)   # own_last applies (docstring)
    blocks: tuple[int, ...] = field(init=False)   # blocks multiplied in each round
    sends: tuple[int, ...] = field(init=False)    # shifts in flight during each round
    loop_start: int = field(init=False)           # first round of the loop
    loop_stop: int = field(init=False)            # rounds of the loop's form end here

    def __post_init__(self):
        n = self.group_size
        if self.kind not in (GATHER, SCATTER):
            raise ValueError(f"ring kind must be '{GATHER}' or '{SCATTER}', got {self.kind!r}")
        if n < 2 or self.unroll < 1:
            raise ValueError(f"a ring needs 2 or more devices and unroll >= 1 "
                             f"(group size {n}, unroll {self.unroll})")
        streams = 2 if self.bidirectional and n > 2 else 1
        if self.chains not in (1, 2):
            raise ValueError(f"a reduce_scatter ring has 1 or 2 chains, got {self.chains}")
        tpu_sum = self.tied_sums and self.kind == GATHER and self.in_loop_sum
        own_last = (tpu_sum and self.own_last and streams == 2 and n % 2 == 0 and n >= 4)
        if self.kind == SCATTER:
            blocks, sends, start, stop = _scatter(n, streams, self.chains)
        elif own_last:
            blocks, sends, start, stop = _own_last_gather(n, self.unroll)
        elif tpu_sum and streams == 2:
            blocks, sends, start, stop = _gather(n, streams)
            if (stop - start) // self.unroll < 2:
                start = stop              # inline (a one-trip loop's sends ran bare)
        elif self.in_loop_sum:
            blocks, sends, start, stop = _summing_gather(n, streams, self.unroll)
        else:
            blocks, sends, start, stop = _gather(n, streams)
        if (stop - start) // self.unroll == 1 and not self.single_trip_loop:
            if self.in_loop_sum and self.kind == GATHER and not tpu_sum:
                blocks, sends, start, stop = _gather(n, streams)
            start = stop
        for name, value in (("streams", streams), ("own_in_last_round", own_last),
                            ("blocks", tuple(blocks)),
                            ("sends", tuple(sends)), ("loop_start", min(start, stop)),
                            ("loop_stop", stop)):
            object.__setattr__(self, name, value)

    @property
    def rounds(self) -> int:
        return len(self.blocks)

    @property
    def trip_count(self) -> int:
        """Iterations of the loop (0: no loop is built)."""
        return (self.loop_stop - self.loop_start) // self.unroll

    @property
    def loop_end(self) -> int:
        """The first round after the loop's iterations."""
        return self.loop_start + self.trip_count * self.unroll

    @property
    def remainder(self) -> int:
        """Rounds of the loop's form emitted after the loop (they fill no iteration)."""
        return self.loop_stop - self.loop_end

    @property
    def shared_rounds(self) -> tuple[int, ...]:
        """all_gather rounds that multiply one block held by both streams, p+k = p-k
        (mod N): the emitter weights each by half (module docstring)."""
        return tuple(k for k, blocks in enumerate(self.blocks) if self.kind == GATHER
                     and blocks == 2 and (2 * k) % self.group_size == 0
                     and not (self.own_in_last_round and k == self.rounds - 1))

    @property
    def sums_from_zeros(self) -> bool:
        """Round 0 runs in the loop: the sum starts from zeros (module docstring)."""
        return self.in_loop_sum and self.trip_count > 0 and self.loop_start == 0

    @property
    def rounds_before_loop(self) -> range:
        return range(0, self.loop_start)

    @property
    def rounds_after_loop(self) -> range:
        return range(self.loop_end, self.rounds)

    @property
    def transfers(self) -> int:
        """Shifts executed (every block moves group_size - 1 times, in `chains` halves
        for a one-stream reduce_scatter; in_loop_sum adds shifts that nothing reads)."""
        return sum(self.sends)

    @property
    def permutes(self) -> int:
        """collective_permute ops built: the rounds outside the loop and one body."""
        outside = sum(self.sends[k] for k in (*self.rounds_before_loop,
                                              *self.rounds_after_loop))
        body = sum(self.sends[self.loop_start:self.loop_start + self.unroll])
        return outside + (body if self.trip_count else 0)

    @property
    def idle_rounds(self) -> tuple[int, ...]:
        """Rounds with no shift in flight: their compute is exposed."""
        return tuple(k for k, s in enumerate(self.sends) if not s)

    def dots(self, k: int) -> int:
        """Dot calls per consumer in round k: an all_gather ring that sums multiplies a
        round's blocks side by side in one, one over a free dim each block on its own
        (each reading the other operand whole); each reduce_scatter chain has its own."""
        if self.kind == GATHER:
            return int(self.blocks[k] > 0) if self.in_loop_sum else self.blocks[k]
        return self.chains if self.streams == 1 else self.blocks[k]

    def sending(self, k: int) -> range:
        """The streams (0: down, 1: up) with a shift in flight in round k."""
        return range(self.sends[k])

    def describe(self) -> str:
        loop = (f"rounds {self.loop_start}..{self.loop_end - 1} in a loop of "
                f"{self.trip_count} x {self.unroll}" if self.trip_count else "no loop")
        return (f"{self.rounds} rounds, {loop}, {self.transfers} shifts "
                f"({self.streams} stream{'s' if self.streams > 1 else ''})")


def _gather(n: int, streams: int):
    """Blocks, sends and loop range of the all_gather ring."""
    if streams == 1:
        return [1] * n, [1] * (n - 1) + [0], 1, n - 1
    last = n // 2                          # rounds 0..last
    even = n % 2 == 0
    blocks = [1] + [2] * (last - 1) + [1 if even else 2]
    sends = [2] * (last - 1) + [1 if even else 2] + [0]
    return blocks, sends, 1, last - 1 if even else last


def _summing_gather(n: int, streams: int, unroll: int):
    """Blocks, sends and loop range of an all_gather ring that sums (in_loop_sum)."""
    blocks, sends, start, stop = _gather(n, streams)
    # Rounds 1..uniform-1 have the loop's form once they send on every stream and
    # multiply a block from each; with two streams and even N the last of them holds
    # p+N/2 on both (a shared round), taken with 2 or more other rounds of that form.
    uniform = n if streams == 1 else n // 2 + 1
    others = uniform - 1 - (streams == 2 and n % 2 == 0)
    if others < 2 or (uniform - 1) // unroll < 1:
        return blocks, sends, start, stop
    for k in range(1, uniform):
        sends[k] = blocks[k] = streams
    if streams == 1 and (n - 1) % unroll and n % unroll == 0:
        return blocks, sends, 0, n        # round 0 too: the sum starts from zeros
    return blocks, sends, 1 + (uniform - 1) % unroll, uniform


def _own_last_gather(n: int, unroll: int):
    """Blocks, sends and loop range of a two-stream summing ring, own shard last."""
    last = n // 2
    blocks = [0] + [2] * last
    sends = [2] * (last - 1) + [1, 0]      # the up stream's last shift is not needed
    uniform = last - 2                      # rounds 2..last-1: add to the sum, send both
    if uniform // unroll < 2:               # inline: libtpu scheduled a one-trip loop's
        return blocks, sends, last, last    # sends bare
    start = 2 + uniform % unroll
    for k in range(start, last):
        sends[k] = 2                        # the loop's last round too (one unread shift)
    return blocks, sends, start, last


def _scatter(n: int, streams: int, chains: int):
    """Blocks, sends and loop range of the reduce_scatter ring (two skewed chains):
    chain 0 sends the sum it kept at the start of the next round, chain 1 at once."""
    a = n - 1 if streams == 1 else n // 2   # rounds before the own block's
    if streams == 1:
        if chains == 1:
            return [1] * n, [1] * a + [0], 1, a
        # Rounds 1..a-1 send on both chains; round 0 only chain 1's, round a chain 0's.
        return [1] * n, [1] + [2] * (a - 1) + [1], 1, a
    up_start = a - (n - 1 - a)  # 1 for even n, 0 for odd: the up stream starts late
    blocks = [1 if k < up_start else 2 for k in range(a)] + [1]
    sends = [int(up_start == 0)] + [2] * (a - 1) + [1]
    # Uniform once both chains have started and received: from round up_start + 1.
    return blocks, sends, up_start + 1, a
