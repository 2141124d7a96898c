"""Remarks and statistics: one record per site, and what decided.

Sites with the same source line and shapes (a layer called in a Python loop) are
separate sites, each with its own record, through rewrite_module(), remarks(),
statistics(), --remarks and --pass-statistics. Each remark names the rule that
decided (the default threshold, an explicit threshold-mib, the cost model), labels its
prediction with the profile that made it, and says when a rewritten site is predicted
slower than the original.
"""
import jax
import pytest
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import GATHER_MODULE, SCATTER_MODULE, Program, check, partitioner
from overlap_hlo.tools import overlap_opt

AG = jax.lax.all_gather
RS = jax.lax.psum_scatter
LAYERS = 3


def layer(x, w1, w2):
    h = AG(x, "x", axis=0, tiled=True) @ w1
    return x + RS(h @ w2, "x", scatter_dimension=0, tiled=True)


def looped(x, w1, w2):
    for _ in range(LAYERS):   # one source line, one shape: LAYERS sites per collective
        x = layer(x, w1, w2)
    return x


PROG = Program(looped, (8,), ("x",), [((64, 32), P("x")), ((32, 64), P(None, "x")),
                                      ((64, 32), P("x"))], P("x"))


@pytest.fixture(scope="module")
def text():
    """With debug info: every layer's sites carry the same Python source location."""
    with partitioner(True):
        return PROG.jitted().lower(*PROG.args()).as_text(debug_info=True)


def test_every_site_has_its_own_record(text):
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert len(sites) == 2 * LAYERS
    assert len({s.location for s in sites}) == 2   # one line for each collective
    assert len({s.format() for s in sites}) == 2   # identical records, still six
    assert overlap_hlo.statistics(sites) == {
        "overlap-all-gather-matmul": {"seen": LAYERS, "rewritten": LAYERS},
        "overlap-matmul-reduce-scatter": {"seen": LAYERS, "rewritten": LAYERS}}
    module = overlap_hlo.parse(text)
    assert len(overlap_hlo.rewrite_module(module, threshold_mib=0)) == 2 * LAYERS


def test_every_site_rewritten_and_run(text):
    check(PROG, rewritten=2 * LAYERS)


def test_cli_prints_one_remark_per_site(text, tmp_path, capsys):
    src = tmp_path / "model.mlir"
    src.write_text(text)
    assert overlap_opt.main([str(src), "--threshold-mib=0", "--remarks", "--pass-statistics",
                             "-o", str(tmp_path / "out.mlir")]) == 0
    err = capsys.readouterr().err
    assert err.count(": remark: overlap-all-gather-matmul: rewritten: ") == LAYERS
    assert err.count(": remark: overlap-matmul-reduce-scatter: rewritten: ") == LAYERS


# What decided, and on which profile.
SMALL = [((64, 32), P("x")), ((32, 16), P())]   # 8 KiB gathered: below the default 1 MiB
BIG = [((8192, 1024), P("x")), ((1024, 8192), P())]   # 32 MiB gathered, 137 GFLOP


def one_site(inputs, **options):
    prog = Program(lambda x, w: AG(x, "x", axis=0, tiled=True) @ w, (8,), ("x",), inputs, P())
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    (site,) = overlap_hlo.remarks(text, **options)
    return site


def test_default_threshold_is_named_and_no_unchosen_prediction_is_shown():
    site = one_site(SMALL)
    assert not site.applied
    assert "below threshold-mib=1 (the default: neither threshold-mib nor hardware given)" \
        in site.reason
    assert site.estimate.hardware == "h100-sxm" and "predicted" not in site.format()


def test_default_threshold_rewrite_names_the_rule():
    site = one_site(BIG)
    line = site.format()
    assert site.applied and "decided by threshold-mib=1 (the default" in line
    assert line.endswith("MiB communicated") and "predicted" not in line


def test_explicit_threshold_over_a_named_profile():
    site = one_site(SMALL, threshold_mib=0, hardware="tpu-v5e")
    line = site.format()
    assert site.applied
    assert "decided by threshold-mib=0 (explicit, over the cost model for tpu-v5e)" in line
    assert "on tpu-v5e" in line and "not chosen" not in line
    # The cost model would not rewrite this tiny site: the remark says it plainly.
    assert site.estimate.after_us > site.estimate.before_us
    assert line.endswith(": predicted slower than the original")


def test_cost_model_decides_when_a_profile_is_named():
    rewritten = one_site(BIG, hardware="tpu-v5e")
    assert rewritten.applied
    assert rewritten.rule == "the cost model for tpu-v5e, two streams (the faster form)"
    assert rewritten.plan.streams == 2
    assert "predicted slower" not in rewritten.format()
    unchanged = one_site(SMALL, hardware="tpu-v5e")
    assert not unchanged.applied and unchanged.kind == "not profitable"
    assert unchanged.reason == "not profitable on tpu-v5e (the cost model: less than 5% faster)"


def test_faster_rewrite_is_not_called_slower():
    site = one_site(BIG, threshold_mib=0, hardware="tpu-v5e")
    assert site.estimate.after_us < site.estimate.before_us
    assert "slower" not in site.format()


GATHER_DOT_SCATTER_SAME_DIM = """module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<2x8xf32> {
    %0 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
    %2 = "stablehlo.reduce_scatter"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %3 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %3 : tensor<f32>
    }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
    return %2 : tensor<2x8xf32>
  }
}
"""


def test_remarks_name_the_op_they_mean():
    """The reduce_scatter whose dot the all_gather ring takes names the all_gather's
    location (line 3), not the dot's (line 4)."""
    sites = overlap_hlo.remarks(GATHER_DOT_SCATTER_SAME_DIM, input_name="m.mlir",
                                threshold_mib=0)
    gather, scatter = sites
    assert gather.location == "m.mlir:3:10" and scatter.location == "m.mlir:5:10"
    assert "decomposed by the all_gather ring at m.mlir:3:10 instead" in scatter.reason
    assert "at m.mlir:5:10, which keeps its collective" in gather.detail


def test_the_form_is_chosen_per_site_unless_given():
    """With a profile and no threshold the model builds the faster of one and two
    streams; an explicit bidirectional=false/true, or a threshold, fixes the form."""
    chosen = one_site(BIG, hardware="tpu-v5e")
    one = one_site(BIG, hardware="tpu-v5e", bidirectional=False)
    two = one_site(BIG, hardware="tpu-v5e", bidirectional=True)
    assert chosen.plan.streams == 2 and chosen.estimate == two.estimate
    assert one.plan.streams == 1 and one.estimate.after_us > two.estimate.after_us
    assert one.rule == two.rule == "the cost model for tpu-v5e"
    assert one_site(BIG, threshold_mib=0, hardware="tpu-v5e").plan.streams == 1


@pytest.mark.parametrize("threshold", [0, 1000], ids=["rewritten", "left-unchanged"])
def test_sites_carry_their_positions_and_their_dots(threshold):
    """A site names its collective and its dots by file, line and column, rewritten or
    left unchanged; its remark line renders them."""
    for module, collective, dot in [(GATHER_MODULE, 3, 4), (SCATTER_MODULE, 4, 3)]:
        text = module.format(n=4, full=8, handle=1, group=[0, 1, 2, 3])
        (site,) = overlap_hlo.remarks(text, threshold_mib=threshold, input_name="m.mlir")
        assert site.where == overlap_hlo.Where("m.mlir", collective, 10)
        assert site.dots == (overlap_hlo.Where("m.mlir", dot, 10),)
        assert site.applied == (threshold == 0)
        assert site.format() == f"m.mlir:{collective}:10: remark: {site.message()}"
        assert site.message().startswith(site.pattern + ": ")


@pytest.mark.parametrize("other_reader", [False, True])
def test_the_estimate_prices_the_buffer_assembled_for_other_readers(other_reader):
    """A ring that writes the gathered tensor for a reader besides its dots is priced
    with that buffer (cost.SiteShape.assembled_bytes); one that does not, without."""
    def fn(x, w):
        g = AG(x, "x", axis=0, tiled=True)
        return g @ w + g.sum() if other_reader else g @ w

    prog = Program(fn, (8,), ("x",), [((64, 32), P("x")), ((32, 16), P())], P())
    with partitioner(True):
        text = prog.jitted().lower(*prog.args()).as_text()
    site, = overlap_hlo.remarks(text, threshold_mib=0, hardware="tpu-v6e")
    assert site.applied
    assert site.estimate.shape.assembled_bytes == (64 * 32 * 4 if other_reader else 0)
