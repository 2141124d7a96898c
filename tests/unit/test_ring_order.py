"""Rings in physical order: where devices sit (ring_order.Links), the order a ring
visits its group, the visit table the emitted ring reads, the link load the cost
model and the schedule model charge, and the rewritten programs' numerics on the 8
host devices with a 2x4 slice's coordinates."""
import dataclasses
import itertools

import jax
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import Program, check, permutes, ring_pipeline
from overlap_hlo.groups.collectives import Ring
from overlap_hlo.ir.unsupported import Unsupported
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_order import Links, physical_order, ring_load, step_hops
from overlap_hlo.plan.ring_plan import RingPlan
from overlap_hlo.targets import schedule

# libtpu's numbering of a v5e:2x4 / v6e:2x4: device d at x = d mod 2, y = d // 2.
SLICE_2X4 = "2x4:" + ";".join(f"{d % 2},{d // 2}" for d in range(8))
CUBE = "2x2x2:" + ";".join(f"{d % 2},{d // 2 % 2},{d // 4}" for d in range(8))


def test_text_form_round_trips_and_refuses_what_it_cannot_read():
    links = Links.parse(SLICE_2X4)
    assert links.text() == SLICE_2X4 and links.extents == (2, 4) and links.wraps == (False,) * 2
    assert Links.parse("4tx4:0,0;3,3").wraps == (True, False)
    for bad, message in [("2x4", "not EXTENTS:COORDS"), ("2y4:0,0", "not like 2x4"),
                         ("2x4:0", "2 integers"), ("2x4:0,-1", "2 integers"),
                         ("2x4:2,0", "lie outside"), ("0x4:0,0", "1 to"),
                         ("99999x2:0,0", "1 to 4096"), ("x".join("2" * 9) + ":0", "like 2x4")]:
        with pytest.raises(ValueError, match=message):
            Links.parse(bad)


def test_hops_and_link_loads():
    line = Links.parse("8:" + ";".join(map(str, range(8))))
    torus = Links.parse("8t:" + ";".join(map(str, range(8))))
    assert (line.hops(0, 7), torus.hops(0, 7), torus.hops(1, 6)) == (7, 1, 3)
    ring = list(range(8))
    # One stream along a row: the closing pair goes back over the links the other
    # pairs use in the other direction, so no directed link carries two transfers...
    assert ring_load(line, ring, streams=1) == 1
    # ...but two streams at once do, and a cycle on a line cannot avoid it.
    assert ring_load(line, ring, streams=2) == 2
    # The closing pair crosses 7 hops; a zigzag steps over at most 2 (0 2 4 6 7 5 3 1).
    zigzag = [ring[i] for i in physical_order(line, ring, streams=2)]
    assert step_hops(line, zigzag) == 2 and ring_load(line, zigzag, streams=2) == 2
    assert ring_load(torus, ring, streams=2) == 1
    assert physical_order(torus, ring, streams=2) is None   # neighbours already
    # Transfers in flight alongside count on the links this one uses, not elsewhere.
    assert line.max_link_load([(0, 1)], alongside=[(0, 2), (5, 6)]) == 2
    assert line.max_link_load([(0, 0)]) == 0


@pytest.mark.parametrize("text, streams, loaded", [(SLICE_2X4, 2, 2), (CUBE, 2, 2),
                                                    (SLICE_2X4, 1, 1)])
def test_physical_order_steps_to_neighbours(text, streams, loaded):
    """The group order 0..7 of a 2x4 slice or a 2x2x2 cube (libtpu's numbering) has
    pairs 3 or 4 hops apart and, with two streams, links loaded twice; the ring order
    found steps to neighbours and loads every link once."""
    links = Links.parse(text)
    group = list(range(8))
    assert ring_load(links, group, streams) == loaded and step_hops(links, group) > 2
    cycle = [group[i] for i in physical_order(links, group, streams)]
    assert sorted(cycle) == group and cycle[0] == 0
    assert ring_load(links, cycle, streams) == 1 and step_hops(links, cycle) == 1


def test_visit_table_follows_the_shifts():
    """After k shifts down the ring (shift_pairs(+1)), each device holds the buffer of
    the device whose group index is its visit row's entry k, for two groups in
    different orders."""
    ring = Ring(((0, 1, 2, 3), (4, 5, 6, 7)), "partition", 8,
                orders=((0, 2, 3, 1), (3, 2, 1, 0)))
    holds = {d: d for d in range(8)}
    table = ring.visit_table()
    for k in range(4):
        for d in range(8):
            group = ring.groups[d // 4]
            assert group.index(holds[d]) == table[d * 4 + k]
        moved = {target: holds[source] for source, target in ring.shift_pairs(+1)}
        holds = moved
    assert sorted(ring.position_table()) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_coordinates_for_other_devices_are_refused():
    ring = Ring((tuple(range(8)),), "partition", 8)
    with pytest.raises(Unsupported, match="places 4 devices"):
        ring.in_physical_order(Links.parse("2x2:0,0;1,0;0,1;1,1"))
    assert ring.in_physical_order(None) is ring
    neighbours = Ring((tuple(range(8)),), "partition", 8, orders=((0, 1, 3, 5, 7, 6, 4, 2),))
    assert ring.in_physical_order(Links.parse(SLICE_2X4), streams=1) == neighbours
    ordered = ring.in_physical_order(Links.parse(SLICE_2X4), streams=2)
    assert ordered.step_load(Links.parse(SLICE_2X4), 2) == 1
    assert ring.step_load(Links.parse(SLICE_2X4), 2) == 2


def test_models_charge_the_busiest_link():
    hw = cost.PROFILES["tpu-v5e"]
    shape = cost.SiteShape(8, 1e9, "bf16", 2**20, RingPlan("gather", 8, bidirectional=True))
    shared = dataclasses.replace(shape, link_load=2)
    assert cost.estimate(shared, hw).shift_us == pytest.approx(hw.shift_us(2 * 2**20))
    timing = schedule.Timing(hw, 1.5, 8, Links.parse(SLICE_2X4))
    down = tuple((q, (q - 1) % 8) for q in range(8))
    up = tuple((q, (q + 1) % 8) for q in range(8))
    assert timing.permute_us(2**20, down) == pytest.approx(hw.shift_us(2**20))
    assert timing.permute_us(2**20, down, alongside=up) == pytest.approx(hw.shift_us(2**21))
    assert schedule.Timing(hw, 1.5, 8).permute_us(2**20, down, up) == \
        pytest.approx(hw.shift_us(2**20))


def test_the_library_collective_uses_the_links_of_the_axes_its_group_spans():
    """A whole 2x2x2 cube: three links into every chip; a 4x4x4 torus: six (the
    scaling-book's k axes x both directions); a 2x4 slice: two (a corner has two
    links); a row, a group that is not a whole sub-slice, or no links: a ring's two.
    Both models price the original with them (never an all-to-all: its blocks cross
    several hops)."""
    cube, slice_2x4 = Links.parse(CUBE), Links.parse(SLICE_2X4)
    torus = Links.parse("4tx4tx4t:" + ";".join(f"{d % 4},{d // 4 % 4},{d // 16}"
                                               for d in range(64)))
    assert cube.collective_directions(range(8)) == 3
    assert torus.collective_directions(range(64)) == 6
    assert torus.collective_directions(range(4)) == 2          # one wrapped row: 2
    assert torus.collective_directions(range(16)) == 4         # a wrapped 4x4 plane
    assert slice_2x4.collective_directions(range(8)) == 2
    assert cube.collective_directions([0, 1, 2, 3]) == 2        # a 2x2 face
    assert cube.collective_directions([0, 3, 5, 6]) == 2        # not a sub-slice
    ring = Ring(((0, 1, 2, 3, 4, 5, 6, 7),), "partition", 8)
    assert ring.collective_directions(cube) == 3 and ring.collective_directions(None) == 2
    hw = cost.PROFILES["tpu-v5p"]
    assert hw.collective_us(2**20, 8, 3) == pytest.approx(
        3 * hw.latency_us + 7 * 2**20 / (hw.link_gbps * 1e9 * hw.link_efficiency * 3) * 1e6)
    shape = cost.SiteShape(8, 1e9, "bf16", 2**20, RingPlan("gather", 8))
    three = dataclasses.replace(shape, collective_directions=3)
    assert cost.estimate(three, hw).collective_us == pytest.approx(hw.collective_us(2**20, 8, 3))
    assert cost.estimate(three, hw).before_us < cost.estimate(shape, hw).before_us
    timing, group = schedule.Timing(hw, 1.75, 8, cube), tuple(range(8))
    assert timing.collective_us("all-gather", 2**20, 2**23, 8, group) == \
        pytest.approx(hw.collective_us(2**20, 8, 3))
    assert timing.collective_us("all-to-all", 2**23, 2**23, 8, group) == \
        pytest.approx(hw.collective_us(2**20, 8, 2))
    assert schedule.Timing(hw, 1.75, 8).collective_us("all-gather", 2**20, 2**23, 8, group) \
        == pytest.approx(hw.collective_us(2**20, 8, 2))


def option(bidirectional: bool, unroll: int) -> str:
    return ring_pipeline(bidirectional, unroll, f"device-coords={SLICE_2X4}")


def mlp(x, w1, w2):
    h = jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w1
    return jax.lax.psum_scatter(jax.nn.relu(h) @ w2, "x", scatter_dimension=0, tiled=True)


def fsdp(x, w):
    return x @ jax.lax.all_gather(w, "x", axis=0, tiled=True)


PROGRAMS = {
    "mlp": (Program(mlp, (8,), ("x",), [((64, 32), P("x")), ((32, 48), P(None, "x")),
                                        ((48, 32), P("x"))], P("x")), 2),
    "fsdp": (Program(fsdp, (8,), ("x",), [((64, 64), P("x")), ((64, 24), P("x"))], P("x")), 1),
}
FORMS = [(True, None), (True, 2), (None, 2), (None, 1)]


@pytest.mark.parametrize("name, form", list(itertools.product(PROGRAMS, FORMS)))
def test_rings_in_physical_order_compute_the_original(name, form):
    """Differential: the rewritten program equals the original on 8 host devices, and
    every ring visits neighbours only."""
    program, sites = PROGRAMS[name]
    pipeline = option(*form)
    check(program, pipeline=pipeline, rewritten=sites)
    module = overlap_hlo.parse(program.jitted().lower(*program.args()).as_text())
    overlap_hlo.rewrite_module(module, pipeline, threshold_mib=0)
    links = Links.parse(SLICE_2X4)
    hops = {links.hops(a, b) for _, pairs in permutes(module) for a, b in pairs}
    assert hops == {1}, hops
