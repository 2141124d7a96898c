"""The cost model's arithmetic on hand-computed cases, its profiles and its decisions."""
import dataclasses
import json
import math

import pytest

import overlap_hlo
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.plan import cost
from overlap_hlo.plan.ring_plan import RingPlan

H100 = cost.PROFILES["h100-sxm"]


def test_profile_figures_match_their_datasheets():
    figures = {name: (p.tflops.get("bf16"), p.link_gbps) for name, p in cost.PROFILES.items()}
    assert figures == {
        "tpu-v4": (275, 50), "tpu-v5e": (197, 50), "tpu-v5p": (459, 100),
        "h100-sxm": (989, 450), "h200": (989, 450), "b200": (2250, 900), "a100": (312, 300),
        "host-cpu": (0.005, 2.0), "tpu-v6e": (918, 100),
    }
    assert cost.PROFILES["tpu-v5e"].tflops["int8"] == 393
    assert cost.PROFILES["a100"].tflops["f32"] == 156
    assert all(p.source for p in cost.PROFILES.values())


def test_matmul_and_shift_times():
    # 2 TFLOP of bf16 at 989 TFLOP/s x 0.7 efficiency.
    assert H100.matmul_us(2e12, "bf16") == pytest.approx(2e12 / (989e12 * 0.7) * 1e6)
    assert H100.matmul_us(2e12, "bf16") == pytest.approx(2889.0, rel=1e-3)
    # f32 runs at the tf32 rate; unknown types at the slowest listed rate.
    assert H100.matmul_us(1e12, "f32") == pytest.approx(1e12 / (494e12 * 0.7) * 1e6)
    assert H100.matmul_us(1e12, "i32") == pytest.approx(1e12 / (494e12 * 0.7) * 1e6)
    # 1 MB over 450 GB/s x 0.8, plus 10 us latency; twice the bandwidth both ways.
    assert H100.shift_us(1e6) == pytest.approx(10 + 1e6 / 360e9 * 1e6)
    assert H100.shift_us(1e6, directions=2) == pytest.approx(10 + 1e6 / 720e9 * 1e6)


def test_round_plans():
    def blocks(kind, n, bidi):
        return RingPlan(kind, n, bidi).blocks

    assert blocks("gather", 4, False) == (1, 1, 1, 1)
    assert blocks("gather", 8, True) == (1, 2, 2, 2, 1)
    assert blocks("gather", 7, True) == (1, 2, 2, 2)
    assert blocks("gather", 2, True) == (1, 1)
    assert blocks("scatter", 8, True) == (1, 2, 2, 2, 1)
    assert blocks("scatter", 7, True) == (2, 2, 2, 1)
    assert blocks("scatter", 3, True) == (2, 1)
    for n in range(2, 10):
        for bidi in (False, True):
            assert sum(blocks("gather", n, bidi)) == n
            assert sum(blocks("scatter", n, bidi)) == n


def test_estimate_by_hand():
    hw = cost.Hardware("toy", {"bf16": 1.0}, link_gbps=1.0, latency_us=0.0,
                       step_overhead_us=1.0, loop_overhead_us=2.0, matmul_efficiency=1.0,
                       link_efficiency=1.0)
    # N=4, whole dot 4e6 FLOP: T_c = 1e6 / 1e12 s = 1 us; block 2000 B: T_m = 2 us
    # over one link direction, 1 us over both (the collective's best case). A gather
    # ring: 4 rounds, the last with nothing in flight, 2 loop iterations.
    gather = RingPlan("gather", 4)
    assert (gather.sends, gather.trip_count) == ((1, 1, 1, 0), 2)
    est = cost.estimate(cost.SiteShape(4, 4e6, "bf16", 2000.0, gather), hw)
    assert est.before_us == pytest.approx(3 * 1 + 4 * 1)            # 7
    assert est.after_us == pytest.approx(3 * 2 + 1 + 4 * 1 + 2 * 2)  # 15
    assert not est.pays()
    assert (est.blocks_per_round, est.exposed_round, est.plan) == ((1, 1, 1, 1), 3, gather)
    # Without overheads, balanced blocks (T_c = T_m = 2 us)... A scatter ring: two
    # chains, each transfer beside the other chain's dot, but a chain sends the sum its
    # dot has just made: a round is T_m + T_c / 2 = 3 us, and the ring does not pay.
    free = dataclasses.replace(hw, step_overhead_us=0.0, loop_overhead_us=0.0)
    scatter = RingPlan("scatter", 4)
    assert scatter.sends == (1, 2, 2, 1)
    est = cost.estimate(cost.SiteShape(4, 8e6, "bf16", 2000.0, scatter), free)
    assert (est.before_us, est.after_us) == (pytest.approx(3 * 1 + 8), pytest.approx(4 * 3))
    assert not est.pays() and est.exposed_round == -1
    # ...compute-bound ones (T_c = 20 us) gain little: 3.6% is inside the 5% margin.
    est = cost.estimate(cost.SiteShape(4, 8e7, "bf16", 2000.0, scatter), free)
    assert (est.before_us, est.after_us) == (pytest.approx(3 * 1 + 80), pytest.approx(80))
    assert est.pays(margin=0) and not est.pays()
    # Bidirectional: the same 4 blocks in 3 rounds, the middle one two blocks; no loop.
    bidi = RingPlan("gather", 4, bidirectional=True)
    assert (bidi.blocks, bidi.trip_count) == ((1, 2, 1), 0)
    assert cost.estimate(cost.SiteShape(4, 4e6, "bf16", 2000.0, bidi),
                         hw).after_us == pytest.approx(2 + 2 + 1 + 3)
    # The loop's iterations come from the plan: unroll=2 halves them...
    plain, unrolled = RingPlan("gather", 8), RingPlan("gather", 8, unroll=2)
    assert (plain.trip_count, unrolled.trip_count) == (6, 3)
    after = [cost.estimate(cost.SiteShape(8, 4e6, "bf16", 2000.0, p), hw).after_us
             for p in (plain, unrolled)]
    assert after[0] - after[1] == pytest.approx(3 * hw.loop_overhead_us)
    # ...and a loop that would run once is not built: no loop overhead at all.
    once = RingPlan("gather", 4, unroll=2)
    assert once.trip_count == 0
    assert (cost.estimate(cost.SiteShape(4, 4e6, "bf16", 2000.0, once), hw).after_us
            == pytest.approx(15 - 2 * 2))


def test_an_estimate_is_computed_once_per_shape_and_profile():
    """The layers of a model repeat their sites' shapes: their estimates are computed
    once; a profile that differs in any figure (same name) is not taken for another."""
    hw = cost.Hardware("toy", {"bf16": 1.0}, link_gbps=1.0, latency_us=0.0,
                       step_overhead_us=1.0, loop_overhead_us=2.0)
    shape = cost.SiteShape(4, 4e6, "bf16", 2000.0, RingPlan("gather", 4))
    first = cost.estimate(shape, hw)
    hits = cost._estimate.cache_info().hits
    again = cost.estimate(dataclasses.replace(shape), dataclasses.replace(hw))
    assert again == first and cost._estimate.cache_info().hits == hits + 1
    slower = cost.estimate(shape, dataclasses.replace(hw, loop_overhead_us=20.0))
    assert slower.after_us == pytest.approx(first.after_us + 2 * 18.0)


def test_roofline_prices_the_weights_every_partial_dot_reads():
    """With a memory bandwidth, a dot takes its FLOPs' time or its bytes' time,
    whichever is longer: the ring's partial dots each read the weights whole."""
    hw = cost.Hardware("toy", {"bf16": 1.0}, link_gbps=1e6, latency_us=0.0,
                       step_overhead_us=0.0, loop_overhead_us=0.0, matmul_efficiency=1.0,
                       link_efficiency=1.0, hbm_gbps=1.0 / cost.MEMORY_EFFICIENCY)
    # 1 GB/s x 0.8 / 0.8: 1 byte = 1e-3 us. Whole dot 4e6 FLOP = 4 us; 2000 B of weights
    # (2 us) and 2000 B sliced (2 us): the original's one dot is compute-bound, 4 us.
    gather = RingPlan("gather", 4)
    shape = cost.SiteShape(4, 4e6, "bf16", 1.0, gather, whole_bytes=2000.0,
                           sliced_bytes=2000.0)
    est = cost.estimate(shape, hw)
    assert est.before_us == pytest.approx(4, abs=0.01)
    # A round: 1 us of FLOPs, but 2000 + 500 B = 2.5 us of memory; 4 rounds.
    assert est.after_us == pytest.approx(4 * 2.5, abs=0.01)
    # One-stream scatter: two chains, each a dot reading the weights: 4.5 us a round.
    scatter = cost.estimate(dataclasses.replace(shape, plan=RingPlan("scatter", 4)), hw)
    assert scatter.after_us == pytest.approx(4 * 4.5, abs=0.01)
    # Two streams: rounds of 1, 2, 1 blocks. Over a free dim each block is a dot of its
    # own reading the weights: the two-block round is 2 x 2000 + 1000 B = 5 us; a ring
    # that sums multiplies the round's blocks side by side in one dot: 2000 + 1000 B.
    bidi = cost.estimate(dataclasses.replace(
        shape, plan=RingPlan("gather", 4, bidirectional=True)), hw)
    assert bidi.after_us == pytest.approx(2.5 + 5 + 2.5, abs=0.01)
    summing = cost.estimate(dataclasses.replace(
        shape, plan=RingPlan("gather", 4, bidirectional=True, in_loop_sum=True)), hw)
    assert summing.after_us == pytest.approx(2.5 + 3 + 2.5, abs=0.01)
    # No bandwidth in the profile: memory is not priced.
    assert cost.estimate(shape, dataclasses.replace(hw, hbm_gbps=0.0)).after_us == \
        pytest.approx(4, abs=0.01)


def test_serial_sums_price_each_read_and_write_of_the_sum():
    """A ring that sums its products: with `serial_sums` (the tpu-* profiles) every
    round after the first that multiplies reads and writes the sum at the memory
    bandwidth, beside its dot; without it (the GPU profiles) the sum costs nothing more."""
    hw = cost.Hardware("toy", {"bf16": 1.0}, link_gbps=1e6, latency_us=0.0,
                       step_overhead_us=0.0, loop_overhead_us=0.0, matmul_efficiency=1.0,
                       link_efficiency=1.0, hbm_gbps=1.0 / cost.MEMORY_EFFICIENCY)
    # 1 byte = 1e-3 us; a 1000-byte sum read and written: 2 us per add.
    plain = cost.SiteShape(8, 8e6, "bf16", 1.0, RingPlan("gather", 8, True, 1,
                                                         in_loop_sum=True))
    summing = dataclasses.replace(plain, sum_bytes=1000.0)
    own_last = dataclasses.replace(summing, plan=RingPlan("gather", 8, True, 1,
                                                          in_loop_sum=True, tied_sums=True,
                                                          own_last=True))
    assert cost.estimate(summing, hw).after_us == cost.estimate(plain, hw).after_us
    serial = dataclasses.replace(hw, serial_sums=True)
    # Own shard in round 0, then 4 rounds that add (the last one shared): 4 adds.
    assert cost.estimate(summing, serial).after_us == pytest.approx(
        cost.estimate(plain, serial).after_us + 4 * 2.0)
    # Own shard last: rounds 1..4 multiply, 3 of them add; round 0's shifts are bare.
    plan = own_last.plan
    assert plan.blocks == (0, 2, 2, 2, 2)
    assert cost.estimate(own_last, serial).after_us == pytest.approx(
        cost.estimate(dataclasses.replace(own_last, sum_bytes=0.0), serial).after_us + 3 * 2.0)
    assert all(p.serial_sums == (p.platform == "tpu") for p in cost.PROFILES.values())


def test_the_copy_of_a_returned_all_gather_is_priced_on_tpu_only():
    """`returned_gather_us`: a read and a write at half the streaming rate on the tpu-*
    profiles (libtpu copies a returned all-gather), nothing elsewhere."""
    for hw in cost.PROFILES.values():
        assert hw.copies_returned_gathers == (hw.platform == "tpu"), hw.name
        expected = hw.memory_us(4 * 2**27) if hw.platform == "tpu" else 0.0
        assert hw.returned_gather_us(2**27) == pytest.approx(expected)
    assert cost.hardware("tpu-v5e").returned_gather_us(2**27) == pytest.approx(819.2, rel=1e-3)


def test_the_models_checked_against_libtpu_decide_tpu_rings_that_sum():
    """v5e, v5p and v6e: every summing ring their model chose compiled faster; v4's
    chose some that compiled slower (benchmarks/RESULTS.md)."""
    assert {name for name, hw in cost.PROFILES.items() if hw.decides_summing_rings} == {
        "tpu-v5e", "tpu-v5p", "tpu-v6e"}


def test_whole_device_scatter_is_priced_as_the_all_reduce_the_compiler_makes():
    """XLA's TPU compiler runs a reduce-scatter over every device as an all-reduce on
    v4 and v5p (test_tpu checks the compiler still does): the original pays twice the
    collective there, and only there."""
    scatter = cost.SiteShape(8, 8e9, "bf16", 2**20, RingPlan("scatter", 8),
                             spans_all_devices=True)
    gather = dataclasses.replace(scatter, plan=RingPlan("gather", 8))
    subgroup = dataclasses.replace(scatter, spans_all_devices=False)
    for name in cost.PROFILES:
        hw = cost.PROFILES[name]
        assert hw.all_reduce_whole_scatter == (name in ("tpu-v4", "tpu-v5p")), name
        twice = 2 if hw.all_reduce_whole_scatter else 1
        est = cost.estimate(scatter, hw)
        assert est.collective_us == pytest.approx(twice * hw.collective_us(2**20, 8))
        assert est.before_us == pytest.approx(cost.estimate(subgroup, hw).before_us
                                              + (twice - 1) * est.collective_us / twice)
        assert cost.estimate(gather, hw).collective_us == pytest.approx(
            hw.collective_us(2**20, 8))


def test_json_profile(tmp_path):
    path = tmp_path / "chip.json"
    path.write_text(json.dumps({"name": "chip", "tflops": {"f32": 10.0}, "link_gbps": 5.0,
                                "latency_us": 1.0, "step_overhead_us": 0.5,
                                "loop_overhead_us": 0.5}))
    assert cost.hardware(str(path)).tflops == {"f32": 10.0}
    (tmp_path / "bad.json").write_text(json.dumps({"name": "x", "flops": 1}))
    with pytest.raises(ValueError, match="unknown hardware fields"):
        cost.hardware(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="unknown hardware 'no-such-chip'"):
        cost.hardware("no-such-chip")


GATHER = """
module attributes {{mhlo.num_partitions = 4 : i32}} {{
  func.func @f(%x: tensor<{s}x{k}xbf16>, %w: tensor<{k}x{m}xbf16>) -> tensor<{full}x{m}xbf16> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}}> : (tensor<{s}x{k}xbf16>) -> tensor<{full}x{k}xbf16>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{full}x{k}xbf16>, tensor<{k}x{m}xbf16>) -> tensor<{full}x{m}xbf16>
    return %1 : tensor<{full}x{m}xbf16>
  }}
}}
"""


def gather_module(s, k, m):
    return GATHER.format(s=s, k=k, m=m, full=4 * s)


def balanced_columns(hw: cost.Hardware) -> int:
    """Output columns m at which one block's dot (2 s k m FLOP) takes as long as its
    shift (2 s k bytes): m = FLOP/s / (bytes/s), rounded to a power of two."""
    flops = hw.tflops.get("bf16", min(hw.tflops.values())) * 1e12 * hw.matmul_efficiency
    return 2 ** round(math.log2(flops / (hw.link_gbps * 1e9 * hw.link_efficiency)))


@pytest.mark.parametrize("profile", sorted(cost.PROFILES))
def test_hardware_decides_as_the_arithmetic_says(profile):
    hw = cost.PROFILES[profile]
    tiny = overlap_hlo.remarks(gather_module(2, 16, 8), hardware=profile)
    # Twice the balanced columns: the dot outlasts the shift, so the ring pays even
    # with the calibrated tpu-* per-round overheads (tpu-v4: 166 us for 32 MiB blocks).
    large = overlap_hlo.remarks(gather_module(4096, 4096, 2 * balanced_columns(hw)),
                                hardware=profile)
    assert [s.applied for s in tiny] == [False] and tiny[0].kind == Kind.NOT_PROFITABLE
    assert tiny[0].estimate.after_us >= tiny[0].estimate.before_us * 0.95
    assert [s.applied for s in large] == [True]
    assert large[0].estimate.pays()


def test_threshold_overrides_the_cost_model():
    tiny = overlap_hlo.remarks(gather_module(2, 16, 8), hardware="h100-sxm", threshold_mib=0)
    assert [s.applied for s in tiny] == [True]
    assert tiny[0].estimate.hardware == "h100-sxm"


def test_default_decides_by_size_and_predicts_on_the_default_profile():
    (site,) = overlap_hlo.remarks(gather_module(2, 16, 8))
    assert not site.applied and site.kind == Kind.BELOW_THRESHOLD
    assert site.estimate.hardware == "h100-sxm"


def test_statistics_count_by_reason():
    sites = (overlap_hlo.remarks(gather_module(2, 16, 8), hardware="tpu-v5e")
             + overlap_hlo.remarks(gather_module(2048, 8192, 8192), hardware="tpu-v5e"))
    assert overlap_hlo.statistics(sites) == {"overlap-all-gather-matmul": {
        "seen": 2, "rewritten": 1, "skipped: not profitable": 1}}


@pytest.mark.parametrize("fields, message", [
    ({"tflops": {}}, "'tflops' must map"),
    ({"tflops": {"f32": "fast"}}, "'tflops' must map"),
    ({"link_gbps": 0}, "'link_gbps' must be a positive number"),
    ({"latency_us": -1}, "'latency_us' must be a number >= 0"),
    ({"all_reduce_whole_scatter": 1}, "'all_reduce_whole_scatter' must be true or false"),
    ({"serial_sums": "yes"}, "'serial_sums' must be true or false"),
    ({"copies_returned_gathers": None}, "'copies_returned_gathers' must be true or false"),
    ({"decides_summing_rings": "v5e"}, "'decides_summing_rings' must be true or false"),
])
def test_json_profile_values_are_checked(tmp_path, fields, message):
    profile = {"name": "chip", "tflops": {"f32": 10.0}, "link_gbps": 5.0, "latency_us": 1.0,
               "step_overhead_us": 0.5, "loop_overhead_us": 0.5, **fields}
    path = tmp_path / "chip.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match=message):
        cost.hardware(str(path))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        cost.hardware(str(tmp_path / "broken.json"))


def test_a_ring_that_assembles_the_gathered_tensor_pays_each_block_twice():
    """The buffer a ring writes for the gathered tensor's other readers: each block read
    and written once more (the original's all_gather writes it as it gathers)."""
    hw = cost.Hardware("toy", {"bf16": 1.0}, link_gbps=1e6, latency_us=0.0,
                       step_overhead_us=0.0, loop_overhead_us=0.0, matmul_efficiency=1.0,
                       link_efficiency=1.0, hbm_gbps=1.0 / cost.MEMORY_EFFICIENCY)
    shape = cost.SiteShape(4, 4e6, "bf16", 1.0, RingPlan("gather", 4))
    plain = cost.estimate(shape, hw)
    assembled = cost.estimate(dataclasses.replace(shape, assembled_bytes=3000.0), hw)
    assert assembled.before_us == plain.before_us
    assert assembled.after_us - plain.after_us == pytest.approx(6.0, abs=1e-6)   # 6000 B
