"""Where devices sit on a slice, and the order a ring visits its group in.

A ring shifts every buffer one position per step, all pairs at once; a step takes as
long as its busiest link needs: when the group's consecutive members are several hops
apart, their routes can share links (along a row without wraparound, the closing pair
of one stream travels back over the links the other stream uses). And libtpu keeps a
permute whose pairs are not neighbours synchronous on v5e slices of 32 chips and more. `Links` holds each device's coordinates on the slice (TPU chips:
`Topology.links`), the slice's extent per axis and which axes wrap around, and routes
a pair one axis after the other; `physical_order` finds a cyclic order of a group whose
members are fewer hops apart than in the group's own order, loading no link more
(neighbours where a Hamiltonian cycle of them exists: both columns of a 2x4 slice, a
Gray code of a 2x2x2 cube; a zigzag on a row without wraparound).
Text form (the `device-coords` pass option): `EXTENTS:COORDS`, e.g.
`2x4:0,0;1,0;0,1;1,1;0,2;1,2;0,3;1,3` (device id d's coordinates are the d-th entry;
an extent followed by `t` wraps around, e.g. `4tx4tx4t`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_SEARCH_STEPS = 20_000    # per group and hop bound: the order search gives up after
MAX_ORDERED_GROUP = 256      # larger groups keep their own order
MAX_AXES = 8
MAX_EXTENT = 4096            # chips along one axis (a TPU pod's axes hold dozens)


@dataclass(frozen=True)
class Links:
    """Each device's coordinates (by id), the slice's extent per axis and its wraps."""

    coords: tuple[tuple[int, ...], ...]
    extents: tuple[int, ...]
    wraps: tuple[bool, ...]

    def hops(self, a: int, b: int) -> int:
        """Links between devices a and b on a shortest route (0: the same chip)."""
        return sum(_distance(x, y, n, w) for x, y, n, w in
                   zip(self.coords[a], self.coords[b], self.extents, self.wraps))

    def max_link_load(self, pairs: Sequence[tuple[int, int]],
                      alongside: Sequence[tuple[int, int]] = ()) -> int:
        """How many pairs cross the busiest directed link that `pairs` use, each pair
        routed one axis after the other along its shorter way round, counting the
        pairs of `alongside` (transfers in flight at the same time) on those links
        too (0: every pair of `pairs` on its own chip)."""
        own, other = self._loads(pairs), self._loads(alongside)
        return max((count + other.get(link, 0) for link, count in own.items()), default=0)

    def _loads(self, pairs: Sequence[tuple[int, int]]) -> dict[tuple, int]:
        load: dict[tuple, int] = {}
        for source, target in pairs:
            here = list(self.coords[source])
            for axis, (n, wraps) in enumerate(zip(self.extents, self.wraps)):
                goal = self.coords[target][axis]
                while here[axis] != goal:
                    forward = (goal - here[axis]) % n if wraps else goal - here[axis]
                    step = 1 if 0 < forward <= (n // 2 if wraps else n) else -1
                    link = (tuple(here), axis, step)
                    load[link] = load.get(link, 0) + 1
                    here[axis] = (here[axis] + step) % n if wraps else here[axis] + step
        return load

    def text(self) -> str:
        extents = "x".join(f"{n}{'t' if w else ''}" for n, w in zip(self.extents, self.wraps))
        return extents + ":" + ";".join(",".join(map(str, c)) for c in self.coords)

    @classmethod
    def parse(cls, text: str) -> Links:
        """From the text form; ValueError naming what is wrong."""
        head, colon, body = text.partition(":")
        if not colon or not head or not body:
            raise ValueError(f"'{_short(text)}' is not EXTENTS:COORDS (e.g. 2x4:0,0;1,0;...)")
        axes = head.split("x")
        if len(axes) > MAX_AXES or not all(a.rstrip("t").isdigit() for a in axes):
            raise ValueError(f"extents '{_short(head)}' are not like 2x4 or 4tx4tx4t")
        extents = tuple(int(a.rstrip("t")) for a in axes)
        wraps = tuple(a.endswith("t") for a in axes)
        if not all(1 <= n <= MAX_EXTENT for n in extents):
            raise ValueError(f"extents '{_short(head)}' must be 1 to {MAX_EXTENT}")
        coords = []
        for entry in body.split(";"):
            parts = entry.split(",")
            if len(parts) != len(extents) or not all(p.isdigit() for p in parts):
                raise ValueError(f"coordinates '{_short(entry)}' are not {len(extents)} "
                                 "integers separated by ','")
            point = tuple(int(p) for p in parts)
            if any(x >= n for x, n in zip(point, extents)):
                raise ValueError(f"coordinates '{entry}' lie outside {head}")
            coords.append(point)
        return cls(tuple(coords), extents, wraps)

    def collective_directions(self, members: Sequence[int]) -> int:
        """The link directions into each member that a library collective over
        `members` can use at once: where the members are every chip of the sub-slice
        spanned by the axes along which they differ, the fewest neighbours any member
        has along those axes (a wrapped axis of 3 or more chips: 2; an axis of 2: 1;
        a row without wraparound: 1 at its ends, 2 inside); at least 2 (the
        bidirectional ring the model gave it before). A group of 8 on a 2x2x2 cube: 3;
        on a 4x4x4 torus all of it: 6 (the scaling-book's k axes x both directions);
        on 2x4: 2 (a corner has two links)."""
        points = [self.coords[m] for m in members]
        spanned = [axis for axis in range(len(self.extents))
                   if len({p[axis] for p in points}) > 1]
        full = 1
        for axis in spanned:
            full *= self.extents[axis]
        if not spanned or len(set(points)) != len(points) or full != len(points):
            return 2

        def neighbours(point) -> int:
            count = 0
            for axis in spanned:
                n, x = self.extents[axis], point[axis]
                count += (1 if n == 2 else 2 if self.wraps[axis]
                          else (x > 0) + (x < n - 1))
            return count

        return max(2, min(neighbours(p) for p in points))


def _distance(x: int, y: int, n: int, wraps: bool) -> int:
    d = abs(x - y)
    return min(d, n - d) if wraps else d


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def step_hops(links: Links, cycle: Sequence[int]) -> int:
    """The most hops between consecutive devices of `cycle` (last to first included)."""
    return max(links.hops(a, b) for a, b in zip(cycle, [*cycle[1:], cycle[0]]))


def ring_load(links: Links, cycle: Sequence[int], streams: int = 1) -> int:
    """The busiest link's load in one ring step along `cycle`: every member sends to the
    next one, and with two streams also to the previous one, all at once."""
    forward = list(zip(cycle, [*cycle[1:], cycle[0]]))
    backward = [(b, a) for a, b in forward] if streams == 2 else []
    return links.max_link_load(forward + backward)


def physical_order(links: Links, group: Sequence[int],
                   streams: int = 1) -> tuple[int, ...] | None:
    """Indices into `group` in a cyclic order whose consecutive members are fewer hops
    apart than in the group's own order (the fewest found: neighbours where the group
    allows it), and whose ring step (`streams` 1 or 2) loads no link more than the
    group's order does; None when the group's order already steps to neighbours
    without loading a link twice, or no better order is found within
    MAX_SEARCH_STEPS."""
    n = len(group)
    if n <= 2 or n > MAX_ORDERED_GROUP:
        return None
    hops, load = step_hops(links, group), ring_load(links, group, streams)
    if hops <= 1 and load <= 1:
        return None
    for bound in range(1, hops):
        order = _cycle_within(links, group, bound)
        if order is not None and ring_load(links, [group[i] for i in order], streams) <= load:
            return order
    return None


def _cycle_within(links: Links, group: Sequence[int], bound: int) -> tuple[int, ...] | None:
    """A Hamiltonian cycle of `group` whose steps cross at most `bound` hops, by depth-
    first search from member 0: nearest first, then fewest onward choices (Warnsdorff)."""
    n = len(group)
    near = [[j for j in range(n) if j != i and links.hops(group[i], group[j]) <= bound]
            for i in range(n)]
    path, used, budget = [0], [False] * n, [MAX_SEARCH_STEPS]
    used[0] = True

    def extend() -> bool:
        if len(path) == n:
            return 0 in near[path[-1]]
        budget[0] -= 1
        if budget[0] < 0:
            return False
        here = group[path[-1]]
        choices = [j for j in near[path[-1]] if not used[j]]
        choices.sort(key=lambda j: (links.hops(here, group[j]),
                                    sum(not used[k] for k in near[j]), j))
        for j in choices:
            path.append(j)
            used[j] = True
            if extend():
                return True
            path.pop()
            used[j] = False
        return False

    found = extend()
    return tuple(path) if found else None
