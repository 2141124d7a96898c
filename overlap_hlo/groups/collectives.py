"""Replica groups of all_gather / reduce_scatter, and the rings built from them.

XLA reads a collective's `replica_groups` in one of three modes (its
CollectiveOpGroupMode): cross-replica (no channel handle), cross-replica-and-partition
(a channel handle, no `use_global_device_ids`) and flattened ids (both). A
`collective_permute` speaks partition ids (with a channel handle) or replica ids
(without). `Ring.from_collective` maps a collective to one of those two id spaces, or
says why it can't.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from overlap_hlo.groups.manual import AutoAxes, auto_axes_at
from overlap_hlo.groups.meshes import MAX_DEVICES, is_mesh_axes, mesh_axes_groups
from overlap_hlo.ir.dominance import not_run_by_all
from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.plan.ring_order import Links, physical_order, ring_load


# Source-target pairs a site's permutes may list in all (each permute lists every
# device): 2^16 pairs print as about 1.5 MB, where the collective names its groups in a
# few bytes (mesh axes). A group of 4096 still gets 16 permutes, one of 65536 none.
MAX_RING_PAIRS = 2**16


@dataclass(frozen=True)
class Ring:
    """Groups of device ids (`kind` is "partition" or "replica") of equal size."""

    groups: tuple[tuple[int, ...], ...]
    kind: str
    num_ids: int
    auto: AutoAxes | None = None  # mesh axes still automatic where the site sits
    # Per group, the group index at each ring position (None: the group's own order).
    orders: tuple[tuple[int, ...], ...] | None = None

    @property
    def size(self) -> int:
        return len(self.groups[0])

    @property
    def spans_all_devices(self) -> bool:
        """One group of every device the module runs on."""
        return len(self.groups) == 1 and self.size == self.num_ids

    def member(self, group: int, position: int) -> int:
        """The device at ring `position` of group `group` (its physical order, if any)."""
        members = self.groups[group]
        return members[position if self.orders is None else self.orders[group][position]]

    def position_table(self) -> list[int]:
        """Entry d is the ring position of device id d within its group."""
        table = [0] * self.num_ids
        for g in range(len(self.groups)):
            for position in range(self.size):
                table[self.member(g, position)] = position
        return table

    def visit_table(self) -> list[int]:
        """Entries d*N .. d*N+N-1: the group index (the block) of the device k ring
        positions after device d, for k = 0..N-1 (a ring in physical order)."""
        n, table = self.size, [0] * (self.num_ids * self.size)
        for g, members in enumerate(self.groups):
            index = {device: i for i, device in enumerate(members)}
            for position in range(n):
                start = self.member(g, position) * n
                for k in range(n):
                    table[start + k] = index[self.member(g, (position + k) % n)]
        return table

    def shift_pairs(self, sign: int = 1) -> list[tuple[int, int]]:
        """Source/target pairs sending position q's buffer to position q - sign (a ring
        step with sign +1 or -1; a shift by k positions with sign -k).

        After k shifts with sign +1 position p holds the buffer of p + k; with -1, of
        p - k."""
        n = self.size
        return [(self.member(g, q), self.member(g, (q - sign) % n))
                for g in range(len(self.groups)) for q in range(n)]

    def step_load(self, links: Links | None, streams: int = 1) -> int:
        """The busiest link's load in one step of this ring with `streams` streams
        (`ring_order.ring_load`; taken as 1 without links covering the ids, or for
        rings too large to order, see `in_physical_order`)."""
        n = self.size
        if not self._orderable(links) or len(links.coords) != self.num_ids:
            return 1
        return max(1, max(ring_load(links, [self.member(g, p) for p in range(n)], streams)
                          for g in range(len(self.groups))))

    def collective_directions(self, links: Links | None) -> int:
        """The link directions a library collective over these groups uses at once
        (`Links.collective_directions`, the fewest over the groups; 2 without links
        covering the ids)."""
        if links is None or len(links.coords) != self.num_ids:
            return 2
        return min(links.collective_directions(members) for members in self.groups)

    def in_physical_order(self, links: Links | None, streams: int = 1) -> Ring:
        """This ring visiting each group in the order `ring_order.physical_order` finds
        on `links` for a ring of `streams` streams (unchanged without links, in a
        partially manual region, when no group gains, or when the visit table would
        exceed MAX_RING_PAIRS entries; Unsupported when `links` does not place every
        id)."""
        if links is not None and len(links.coords) != self.num_ids:
            raise Unsupported(f"device-coords places {len(links.coords)} devices but the "
                              f"group's ids run to {self.num_ids}", kind=Kind.DEVICE_COORDS)
        if not self._orderable(links) or self.auto is not None:
            return self
        orders = [physical_order(links, members, streams) for members in self.groups]
        if all(order is None for order in orders):
            return self
        identity = tuple(range(self.size))
        return dataclasses.replace(self, orders=tuple(order or identity for order in orders))

    def _orderable(self, links: Links | None) -> bool:
        """Links are given and the visit table of every device fits MAX_RING_PAIRS."""
        return links is not None and self.num_ids * self.size <= MAX_RING_PAIRS

    def require_pairs(self, permutes: int) -> None:
        """Unsupported when `permutes` permutes of this ring would list more than
        MAX_RING_PAIRS source-target pairs (each lists every device of every group)."""
        pairs = permutes * len(self.groups) * self.size
        if pairs > MAX_RING_PAIRS:
            raise Unsupported(f"its {permutes} collective_permutes over {len(self.groups)} "
                              f"group(s) of {self.size} would list {pairs} source-target "
                              f"pairs (at most {MAX_RING_PAIRS})", kind=Kind.RING_TOO_LARGE)

    @property
    def uses_channel(self) -> bool:
        return self.kind == "partition"

    @classmethod
    def from_collective(cls, op: ir.Operation, scan) -> Ring:
        """The ring of `op`'s groups; `scan` is the pass run's ModuleScan."""
        attrs = op.attributes
        module = _enclosing_module(op)
        sizes = scan.memo(("module sizes", hash(module)), lambda: _module_sizes(module))
        has_channel = "channel_handle" in attrs and _channel(attrs["channel_handle"]) > 0
        # What the attributes and the module's sizes decide, once per pass run.
        key = ("ring ids", hash(module), op.name, attrs["replica_groups"], has_channel,
               "use_global_device_ids" in attrs)
        groups, flattened = scan.memo(key + ("groups",),
                                      lambda: _read_groups(op, sizes, has_channel))
        divergence = not_run_by_all(op, scan.callers)
        if divergence is not None:
            raise Unsupported(divergence)
        groups, kind, num_ids = scan.memo(key, lambda: _id_space(sizes, groups, flattened))
        auto = auto_axes_at(op, scan) if kind == "partition" else None
        return cls(groups, kind, num_ids, auto)


def _read_groups(op: ir.Operation, sizes: tuple[int, int], has_channel: bool
                 ) -> tuple[list[list[int]], tuple[bool, bool]]:
    """`op`'s groups as lists of ids, and (has a channel, global ids) for how to read
    them; `sizes`: the module's (partitions, replicas)."""
    attrs = op.attributes
    num_partitions, num_replicas = sizes
    # all_to_all has no use_global_device_ids: with a channel its groups hold
    # partition ids (StableHLO: cross_partition), as global ids do here.
    global_ids = ("use_global_device_ids" in attrs
                  or (op.name == "stablehlo.all_to_all" and has_channel))
    flattened = has_channel and global_ids
    groups = _groups(attrs["replica_groups"], op, flattened, num_partitions * num_replicas)
    return groups, (has_channel, global_ids)


def _id_space(sizes: tuple[int, int], groups: list[list[int]], flattened: tuple[bool, bool]
              ) -> tuple[tuple[tuple[int, ...], ...], str, int]:
    """The groups, the kind of ids they hold and how many there are, checked to
    partition those ids."""
    has_channel, global_ids = flattened
    num_partitions, num_replicas = sizes
    if num_replicas > 1 and num_partitions > 1:
        raise Unsupported(f"replica and partition ids mixed ({num_replicas} replicas x "
                          f"{num_partitions} partitions)")
    if not has_channel:
        kind, num_ids = "replica", num_replicas
    elif global_ids:
        kind, num_ids = ("replica", num_replicas) if num_replicas > 1 else (
            "partition", num_partitions)
    elif num_replicas == 1:
        # Cross-replica-and-partition with one replica: each group spans all partitions.
        if groups and groups != [[0]]:
            raise Unsupported("cross-replica-and-partition groups other than [[0]]")
        kind, num_ids, groups = "partition", num_partitions, []
    else:
        kind, num_ids = "replica", num_replicas
    if not groups:
        groups = [list(range(num_ids))]
    _check_partition(groups, num_ids)
    return tuple(tuple(g) for g in groups), kind, num_ids


def _enclosing_module(op: ir.Operation) -> ir.Operation | None:
    parent = op
    while parent is not None and parent.name != "builtin.module":
        parent = parent.parent
    return parent


def _module_sizes(module: ir.Operation | None) -> tuple[int, int]:
    """(mhlo.num_partitions, mhlo.num_replicas) of `module`, default 1."""
    attrs = module.attributes if module is not None else {}

    def read(name: str) -> int:
        if name not in attrs:
            return 1
        if not isinstance(attrs[name], ir.IntegerAttr):
            raise Unsupported(f"{name} is not an integer: {attrs[name]}")
        value = ir.IntegerAttr(attrs[name]).value
        if not 1 <= value <= MAX_DEVICES:
            raise Unsupported(f"{name} = {value} is outside 1..{MAX_DEVICES}")
        return value

    return read("mhlo.num_partitions"), read("mhlo.num_replicas")


def _channel(attr: ir.Attribute) -> int:
    if not stablehlo.ChannelHandle.isinstance(attr):
        raise Unsupported(f"channel_handle of unexpected type: {attr}")
    return stablehlo.ChannelHandle(attr).handle


def _groups(attr: ir.Attribute, op: ir.Operation, flattened: bool,
            num_devices: int) -> list[list[int]]:
    """Dense groups from either form; mesh axes only with flattened (global) ids."""
    if is_mesh_axes(attr):
        if not flattened:
            raise Unsupported("replica groups as mesh axes without a channel handle and "
                              "use_global_device_ids")
        mesh, groups = mesh_axes_groups(attr, op)
        if mesh.size != num_devices:
            raise Unsupported(f"mesh of {mesh.size} devices in a module of {num_devices}")
        return groups
    if not isinstance(attr, ir.DenseIntElementsAttr):
        raise Unsupported(f"replica groups of unexpected type: {attr}")
    array = np.array(attr, dtype=np.int64)
    if array.size == 0:
        return []
    return array.reshape(array.shape[0], -1).tolist()


def _check_partition(groups: list[list[int]], num_ids: int) -> None:
    ids = [d for g in groups for d in g]
    if any(d < 0 for d in ids):
        raise Unsupported("replica groups padded with -1")
    if sorted(ids) != list(range(num_ids)):
        raise Unsupported(f"replica groups do not partition the {num_ids} device ids")
    if len(groups[0]) < 2:
        raise Unsupported("group size 1: nothing to overlap")
