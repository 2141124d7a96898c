"""What the passes' rings share: the cost model's view of a ring's site (`site_shape`),
a ring's plan in the form the pass's options give (`options_plan`), and a shift along
the ring (`shift`)."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from jaxlib.mlir import ir

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dots import flops, tensor_bytes, traffic
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_plan import RingPlan
from overlap_hlo.rewrite import builders as b
from overlap_hlo.rewrite.rewrite_pass import RewritePass


def site_shape(ring: Ring, dots: Sequence[tuple[ir.Operation, set[int]]],
               element_type: ir.Type, block: ir.RankedTensorType, plan: RingPlan,
               **more) -> cost.SiteShape:
    """What the cost model weighs of a ring over `ring`'s groups: its `dots`, each with
    the operands it slices, multiplied in `element_type`, the `block` each shift moves,
    its `plan`; `more`: the other fields of cost.SiteShape."""
    traffics = [traffic(dot, sliced) for dot, sliced in dots]
    return cost.SiteShape(ring.size, sum(flops(dot) for dot, _ in dots),
                          cost.element_name(element_type), tensor_bytes(block), plan,
                          whole_bytes=sum(w for w, _ in traffics),
                          sliced_bytes=sum(c for _, c in traffics),
                          spans_all_devices=ring.spans_all_devices, **more)


def options_plan(kind: str, n: int, options: RewritePass, bidirectional: bool | None,
                 **schedule) -> RingPlan:
    """A `kind` ring's plan for a group of `n` in the form of the target `options` name;
    two streams when `bidirectional` says (None: when the options do); `schedule`: the
    ring's own fields of RingPlan."""
    if bidirectional is None:
        bidirectional = bool(options.bidirectional)
    return _plan(kind, n, bidirectional, options.single_trip_loop, options.views_in_loop,
                 tuple(sorted(schedule.items())))


@functools.lru_cache(maxsize=256)
def _plan(kind: str, n: int, bidirectional: bool, single_trip_loop: bool,
          views_in_loop: bool, schedule: tuple) -> RingPlan:
    """A RingPlan, made once per distinct set of fields (its schedule is computed)."""
    return RingPlan(kind, n, bidirectional, single_trip_loop=single_trip_loop,
                    views_in_loop=views_in_loop, **dict(schedule))


def shift(value: ir.Value, ring: Ring, sign: int, channels: Callable[[], int]) -> ir.Value:
    """`value` shifted along `ring` (`Ring.shift_pairs(sign)`), on a fresh channel from
    `channels` where the ring's ids need one."""
    return b.collective_permute(value, ring.shift_pairs(sign),
                                channels() if ring.uses_channel else None)
