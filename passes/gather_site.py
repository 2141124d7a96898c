"""The parts of an all_gather site: the ring over the shards (one ring for a gather of
a gather), the consumers placed on it and grouped into rings, the gathered tensor's
other readers, and the remark's account of them."""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir

from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.dominance import after, dominates
from overlap_hlo.ir.lookthrough import ViewedUse
from overlap_hlo.ir.ops import as_op
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.passes.gather_consumers import (Assembly, Consumer, Fused, consumer_of,
                                                 in_program_order, place, share_loops)
from overlap_hlo.rewrite.rewrite_pass import require_supported_types


@dataclass(frozen=True)
class GatherSite:
    """What the all_gather ring replaces: the gather (and the gather it gathers, if
    one), the shard each device holds, its loops of consumers, and the buffer that
    assembles the gathered tensor for other readers (with the views they read through)."""

    gather: ir.Operation
    inner: ir.Operation | None
    shard: ir.Value
    dim: int
    groups: list
    assembly: Assembly | None
    values: list[ir.Value]
    moved: list[ir.Operation] | None


def ring_of(gather: ir.Operation, dim: int, scan
            ) -> tuple[Ring, ir.Operation | None, ir.Value]:
    """The ring that replaces `gather`, the all_gather it gathers again in that ring (or
    None) and the shard each device holds."""
    ring = Ring.from_collective(gather, scan)
    inner = chained_gather(gather, scan)
    if inner is not None:   # a gather of a gather: one ring over the combined groups
        combined = combine_rings(inner[1], ring)
        inner, ring = (inner[0], combined) if combined else (None, ring)
    shard = (inner or gather).operands[0]
    require_supported_types(shard.type, gather.results[0].type)
    block = shard.type.shape[dim]
    if block * ring.size != gather.results[0].type.shape[dim]:
        raise Unsupported(f"gathered dim {gather.results[0].type.shape[dim]} is not "
                          f"{ring.size} x {block}")
    return ring, inner, shard


def chained_gather(gather: ir.Operation, scan) -> tuple[ir.Operation, Ring] | None:
    """The all_gather (and its ring) whose result `gather` gathers again along the same
    dim, when nothing else reads it and its groups combine with `gather`'s; else None."""
    value = gather.operands[0]
    if not isinstance(value, ir.OpResult) or len(list(value.uses)) != 1:
        return None
    inner = as_op(value.owner)
    if inner.name != "stablehlo.all_gather" or len(inner.operands) != 1 or (
            ir.IntegerAttr(inner.attributes["all_gather_dim"]).value
            != ir.IntegerAttr(gather.attributes["all_gather_dim"]).value):
        return None
    try:
        return inner, Ring.from_collective(inner, scan)
    except Unsupported:
        return None


def combine_rings(inner: Ring, outer: Ring) -> Ring | None:
    """One ring for all_gather(all_gather(x, inner), outer) along one dim: the group of
    device d lists, for each member e of d's outer group in order, the members of e's
    inner group in order (the order of the blocks in the result). None when these lists
    do not partition the devices consistently."""
    if (inner.kind, inner.num_ids, inner.auto) != (outer.kind, outer.num_ids, outer.auto):
        return None
    inner_of = {d: g for g in inner.groups for d in g}
    outer_of = {d: g for g in outer.groups for d in g}
    combined = {d: tuple(m for e in outer_of[d] for m in inner_of[e]) for d in outer_of}
    if any(len(group) != len(set(group)) or any(combined[m] != group for m in group)
           for group in combined.values()):
        return None
    return Ring(tuple(dict.fromkeys(combined[d] for d in sorted(combined))), outer.kind,
                outer.num_ids, outer.auto)


def placed_consumers(dots: list[ViewedUse], values: list[ir.Value], block: int,
                     f32_sums: bool, gather: ir.Operation, scan
                     ) -> tuple[list[Consumer], list[str]]:
    """The consumers of `dots` with the places of their rings, and why each dot left
    out has none; refused when no dot has one."""
    placed, unplaced = [], []
    for use in dots:
        consumer = place(consumer_of(use, values, block, f32_sums), gather.block,
                         scan.callers)
        (placed if isinstance(consumer, Consumer) else unplaced).append(consumer)
    if not placed:
        raise Unsupported(unplaced[0], kind=Kind.DIVERGENT)
    return placed, unplaced


def rings_and_other_readers(placed: list[Consumer], uses: list[ViewedUse]):
    """The consumers grouped into rings, the gathered tensor's other readers, the
    consumers that read the first ring's buffer instead of a ring of their own (None:
    the ring writes no buffer) and the views to move after that buffer."""
    groups = share_loops(in_program_order(placed))
    others = [use for use in uses if all(use.user != c.dot for c in groups[0])]
    reused, moved = None, reroutable(others, groups[0][0].anchor)
    if others and moved is not None:
        # Everything else reads the gathered tensor after the first ring: that ring
        # writes each shard it holds into a buffer that replaces the all_gather, and
        # the other readers (later dots included) read the buffer; nothing is sent twice.
        reused = [c for group in groups[1:] for c in group]
        groups = groups[:1]
    return groups, others, reused, moved


def reroutable(others: list[ViewedUse], anchor: ir.Operation) -> list[ir.Operation] | None:
    """Whether a buffer built just before `anchor` can replace the gathered tensor for
    every reader in `others`: each reader comes after it, through views that do too
    or that can move there (what they read besides the chain already exists at
    `anchor`). Returns the views to move, in program order, or None."""
    moved: list[ir.Operation] = []
    for use in others:
        for view in use.views:
            if after(anchor, view.op):
                break
            if not all(dominates(value, anchor) for value in view.reads):
                return None
            if view.op not in moved:
                moved.append(view.op)
        else:
            if not after(anchor, use.user):
                return None
    return moved


def consumers_detail(consumers: list[Consumer], gather: ir.Operation, ring: Ring,
                     inner: ir.Operation | None, loops: int, scan) -> str:
    """The remark's account of the ring's dots, the gathered tensor and its groups."""
    kinds = ", ".join(f"{c.kind} dim" + "".join(f" through {v.op.name}" for v in c.views)
                      + (f" hoisted out of {c.anchor.name}" if len(c.anchor.regions) else "")
                      for c in consumers)
    detail = (f"{len(consumers)} dot(s) ({kinds}), {gather.results[0].type} gathered "
              f"over groups of {ring.size}")
    if inner is not None:
        detail += (f" (an all_gather of the all_gather at {scan.where(inner.location)}, "
                   "both in one ring)")
    if loops > 1:
        detail += f", {loops} loops"
    return detail


def readers_detail(unplaced: list[str], notes: list[str], reused: list | None,
                   others: list[ViewedUse]) -> str:
    """The remark's account of the gathered tensor's readers outside the ring."""
    detail = ""
    if unplaced:
        detail += f"; {len(unplaced)} dot(s) left reading it: " + "; ".join(unplaced)
    if notes:
        detail += "; " + "; ".join(notes)
    if reused is not None:
        detail += (f"; the ring assembles the gathered tensor for {len(others)} other "
                   "reader(s)" + (f", {len(reused)} of them dot(s) with no ring of their "
                                  "own" if reused else ""))
    elif others:
        detail += (f"; the all_gather stays for {len(others)} other reader(s) that the "
                   "ring's result would not reach")
    return detail


def epilogues_detail(groups: list[list]) -> str:
    """The remark's account of the elementwise epilogues run on each block."""
    detail = ""
    for fused in (c for group in groups for c in group if isinstance(c, Fused)):
        ops = len(fused.epilogue.ops)
        detail += (f"; an elementwise epilogue of {len(fused.members)} of its dots "
                   f"({ops} op(s)) runs on each block: the ring keeps one buffer "
                   "for their products" if len(fused.members) > 1 else
                   f"; its dot's elementwise epilogue ({ops} op(s)) runs on each "
                   "block, fused into the block's dot")
    return detail
