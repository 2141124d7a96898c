"""The Python API's keyword options, pipelines, names, site records and warnings.

Unknown options raise TypeError (naming the valid ones), `pipeline=None` is the
default pipeline, `input_name` names text input in site locations, and sites left
unchanged for a reason other than size or profit raise a `SitesLeftUnchanged`
warning from every rewriting entry point (the same one-line summary overlap-opt
prints). overlap(), rewrite_lowered and rewrite_exported hand back their `Site`
records (`.sites`) and log `rewrite_summary` at INFO, the line overlap-opt ends with.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from harness import DATA, Program, assert_close, auto_axis_types, permutes
from overlap_hlo.ir.locations import Where
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.site import Site
from overlap_hlo.tools.overlap_opt import main

SDY = DATA / "shard_map_sdy.mlir"
OPTIONS = ("threshold_mib, hardware, bidirectional, target, device_coords, keep_sites, "
           "tpu_summing_rings, unroll, f32_sums, own_shard_last")

# A site the passes must leave alone: the gather and its dot sit in a branch of a
# conditional, which not every device may take.
IN_BRANCH = """module attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>, %c: tensor<i1>) -> tensor<8x8xf32> {
    %0 = "stablehlo.if"(%c) ({
      %1 = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<2x16xf32>) -> tensor<8x16xf32>
      %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
      stablehlo.return %2 : tensor<8x8xf32>
    }, {
      %3 = stablehlo.constant dense<0.0> : tensor<8x8xf32>
      stablehlo.return %3 : tensor<8x8xf32>
    }) : (tensor<i1>) -> tensor<8x8xf32>
    return %0 : tensor<8x8xf32>
  }
}
"""


# Unknown options and pipelines.

@pytest.mark.parametrize("call, name", [
    (lambda **kw: overlap_hlo.rewrite_source(SDY.read_text(), **kw), "rewrite_source"),
    (lambda **kw: overlap_hlo.rewrite_module(overlap_hlo.parse(SDY.read_text()), **kw),
     "rewrite_module"),
    (lambda **kw: overlap_hlo.remarks(SDY.read_text(), **kw), "remarks"),
    (lambda **kw: overlap_hlo.overlap(lambda x: x, **kw), "overlap"),
    (lambda **kw: overlap_hlo.rewrite_lowered(None, **kw), "rewrite_lowered"),
    (lambda **kw: overlap_hlo.rewrite_exported(None, **kw), "rewrite_exported"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_unknown_option_is_a_type_error(call, name):
    with pytest.raises(TypeError) as info:
        call(treshold_mib=0)
    message = str(info.value)
    assert message == (f"{name}() got an unexpected keyword argument 'treshold_mib'; did "
                       f"you mean 'threshold_mib'? (options: {OPTIONS})")
    with pytest.raises(TypeError, match=rf"'colour' \(options: {OPTIONS}\)$"):
        call(colour="red")


def test_pipeline_none_is_the_default_pipeline():
    text = overlap_hlo.rewrite_source(SDY.read_text(), None, threshold_mib=0)
    assert permutes(overlap_hlo.parse(text))
    assert overlap_hlo.overlap(lambda x: x, pipeline=None).pipeline == \
        overlap_hlo.DEFAULT_PIPELINE
    sites = overlap_hlo.remarks(SDY.read_text(), pipeline=None, threshold_mib=0)
    assert [site.applied for site in sites] == [True, True]


def test_pipeline_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="pipeline must be pipeline text"):
        overlap_hlo.rewrite_source(SDY.read_text(), 3)


def test_nested_pipeline_from_python():
    pipeline = ("builtin.module(overlap-all-gather-matmul{threshold-mib=0},"
                "func.func(cse,canonicalize{max-iterations=2}))")
    text = overlap_hlo.rewrite_source(SDY.read_text(), pipeline)
    assert permutes(overlap_hlo.parse(text))


# Names.

def test_input_name_names_text_input_in_site_locations():
    sites = overlap_hlo.remarks(SDY.read_text(), threshold_mib=0, input_name="model.mlir")
    assert [site.location for site in sites] == ["model.mlir:8:12", "model.mlir:12:12"]
    assert overlap_hlo.remarks(SDY.read_text())[0].location == "-:8:12"   # nameless
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        overlap_hlo.rewrite_source(IN_BRANCH, threshold_mib=0, input_name="branch.mlir")
    assert len(caught) == 1
    sites = overlap_hlo.remarks(IN_BRANCH, threshold_mib=0, input_name="branch.mlir")
    assert sites[0].location == "branch.mlir:4:12"


# Never silent.

def site(reason: str, applied: bool = False) -> Site:
    """A record left unchanged for `reason`: of that Kind when one is spelled so, else
    Kind.NONE (the reason itself is counted)."""
    kind = next((k for k in Kind if k == reason), Kind.NONE)
    return Site(Where("f.mlir", 1, 1), "overlap-all-gather-matmul", applied, reason=reason,
                kind=kind)


def test_unchanged_summary_counts_by_reason():
    sites = [site("", applied=True), site("replica groups odd"), site("inside a branch"),
             site("below threshold-mib"), site("inside a branch"), site("not profitable")]
    assert overlap_hlo.unchanged_summary(sites, see="--remarks") == (
        "3 of 6 candidate sites left unchanged (2 inside a branch, 1 replica groups odd); "
        "see --remarks")
    assert overlap_hlo.unchanged_summary(sites[:1] + sites[3:4], see="x") is None
    assert overlap_hlo.unchanged_summary([], see="x") is None
    assert overlap_hlo.unchanged_summary([site("odd")], see="x") == (
        "1 of 1 candidate site left unchanged (1 odd); see x")
    # Nothing rewritten: the sites below the threshold are all still there, and said so.
    assert overlap_hlo.unchanged_summary(sites[3:4] + sites[5:], see="x") == (
        "1 of 2 candidate sites left unchanged (1 below threshold-mib); see x")
    # Found slower in the compiled schedule (targets.decided) is a decision on profit.
    kept = site(str(Kind.KEPT))
    assert kept.kind is Kind.KEPT
    assert overlap_hlo.unchanged_summary([kept, sites[5]], see="x") is None


def test_rewrite_warns_about_sites_left_unchanged():
    with pytest.warns(overlap_hlo.SitesLeftUnchanged) as caught:
        overlap_hlo.rewrite_source(IN_BRANCH, threshold_mib=0)
    [warning] = caught
    assert str(warning.message).startswith(
        "overlap-hlo: 1 of 1 candidate site left unchanged (1 inside a stablehlo.if branch")
    assert str(warning.message).endswith("; see overlap_hlo.remarks()")
    assert warning.filename == __file__   # points at the caller
    with pytest.warns(overlap_hlo.SitesLeftUnchanged):
        overlap_hlo.rewrite_module(overlap_hlo.parse(IN_BRANCH), threshold_mib=0)


def test_no_warning_for_profit_or_for_remarks():
    # The premises: every site of SDY is unprofitable on tpu-v5e, and IN_BRANCH's site
    # is left unchanged for a reason that warns in a run.
    kinds = {s.kind for s in overlap_hlo.remarks(SDY.read_text(), hardware="tpu-v5e")}
    assert kinds == {Kind.NOT_PROFITABLE}
    branch = overlap_hlo.remarks(IN_BRANCH, threshold_mib=0)
    assert branch and not any(s.applied for s in branch)
    with pytest.warns(overlap_hlo.SitesLeftUnchanged):
        overlap_hlo.rewrite_source(IN_BRANCH, threshold_mib=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        overlap_hlo.rewrite_source(SDY.read_text(), hardware="tpu-v5e")  # not profitable
        overlap_hlo.remarks(IN_BRANCH, threshold_mib=0)             # a report, not a run


def test_a_run_that_rewrites_nothing_below_the_threshold_says_so():
    with pytest.warns(overlap_hlo.SitesLeftUnchanged, match="below threshold-mib"):
        overlap_hlo.rewrite_source(SDY.read_text())


def test_overlap_opt_prints_the_same_summary(tmp_path, capsys):
    path = tmp_path / "branch.mlir"
    path.write_text(IN_BRANCH)
    assert main([str(path), "--threshold-mib=0", "-o", str(tmp_path / "out.mlir")]) == 0
    with pytest.warns(overlap_hlo.SitesLeftUnchanged) as caught:
        overlap_hlo.rewrite_source(IN_BRANCH, threshold_mib=0)
    summary = str(caught[0].message).removeprefix("overlap-hlo: ").replace(
        "overlap_hlo.remarks()", "--remarks")
    tally = overlap_hlo.rewrite_summary(overlap_hlo.remarks(IN_BRANCH, threshold_mib=0))
    assert tally.startswith("0 of 1 site rewritten; 1 left unchanged (inside a "
                            "stablehlo.if branch")
    assert capsys.readouterr().err == (f"overlap-opt: {tally}\n"
                                       f"overlap-opt: warning: {summary}\n")
    # --remarks already reports every site; the warning would only repeat it.
    assert main([str(path), "--threshold-mib=0", "--remarks"]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err and "left unchanged: inside a stablehlo.if branch" in err
    assert err.endswith(f"overlap-opt: {tally}\n")
    # Every site below the threshold, nothing rewritten: the tally, then the warning.
    assert main([str(SDY), "-o", str(tmp_path / "small.mlir")]) == 0
    tally, warning = capsys.readouterr().err.splitlines()
    assert tally == ("overlap-opt: 0 of 2 sites rewritten; 2 left unchanged "
                     "(below threshold-mib)")
    assert warning.startswith("overlap-opt: warning: ") and "below threshold-mib" in warning


# What a run did: the one-line summary and the site records.

def test_rewrite_summary_counts_outcomes():
    rewritten = site("", applied=True)
    assert overlap_hlo.rewrite_summary([rewritten] * 4) == "4 of 4 sites rewritten"
    assert overlap_hlo.rewrite_summary([rewritten]) == "1 of 1 site rewritten"
    assert overlap_hlo.rewrite_summary([rewritten, rewritten, site("not profitable")]) == (
        "2 of 3 sites rewritten; 1 left unchanged (not profitable)")
    assert overlap_hlo.rewrite_summary(
        [site("inside a branch"), rewritten, site("below threshold-mib"),
         site("below threshold-mib")]) == (
        "1 of 4 sites rewritten; 3 left unchanged (2 below threshold-mib, "
        "1 inside a branch)")
    assert overlap_hlo.rewrite_summary([site("below threshold-mib")]) == (
        "0 of 1 site rewritten; 1 left unchanged (below threshold-mib)")
    assert overlap_hlo.rewrite_summary([]) == "no candidate sites"


def psum_mlp(x, w1, w2):
    """Megatron's tensor-parallel MLP: column- then row-parallel matmul, then psum."""
    return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "x")


def sp_mlp(x, w1, w2):
    """Sequence-parallel MLP: all_gather the sequence, psum_scatter the output."""
    h = jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w1
    return jax.lax.psum_scatter(jax.nn.gelu(h) @ w2, "x", scatter_dimension=0, tiled=True)


WEIGHTS = [((32, 128), P(None, "x")), ((128, 32), P("x", None))]
MLPS = {   # fn, its inputs and output spec, the patterns of its sites
    "psum": (psum_mlp, [((64, 32), P())] + WEIGHTS, P(), ["overlap-matmul-all-reduce"]),
    "gather-scatter": (sp_mlp, [((64, 32), P("x"))] + WEIGHTS, P("x"),
                       ["overlap-all-gather-matmul", "overlap-matmul-reduce-scatter"]),
}


@pytest.fixture(scope="module", params=sorted(MLPS))
def mlp(request):
    """(jitted fn, its arguments on 8 host CPU devices, the patterns of its sites)."""
    fn, inputs, out_specs, patterns = MLPS[request.param]
    program = Program(fn, (8,), ("x",), inputs, out_specs)
    return program.jitted(), program.args(), patterns


def outcomes(sites) -> list[tuple[str, bool, str]]:
    return [(s.pattern, s.applied, s.kind) for s in sites]


def test_overlap_exposes_the_sites_of_its_last_compile(mlp):
    fn, args, patterns = mlp
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    assert step.sites is None                  # nothing compiled yet
    assert_close(step(*args), fn(*args), [jnp.float32])
    assert outcomes(step.sites) == [(pattern, True, "") for pattern in patterns]
    assert all(isinstance(s, Site) and s.rule.startswith("threshold-mib=0 (explicit)")
               and s.plan is not None for s in step.sites)
    lowered = step.lower(*args)                # the rewritten Lowered carries them too
    assert outcomes(lowered.sites) == outcomes(step.sites)
    assert len(permutes(overlap_hlo.parse(lowered.as_text()))) > 0


def test_sites_left_unchanged_say_why(mlp):
    fn, args, patterns = mlp
    step = overlap_hlo.overlap(fn, hardware="tpu-v5e")   # the cost model: too small
    step(*args)
    assert outcomes(step.sites) == [(pattern, False, "not profitable") for pattern in patterns]
    assert all("not profitable on tpu-v5e" in s.reason for s in step.sites)
    with pytest.warns(overlap_hlo.SitesLeftUnchanged):   # nothing rewritten, all small
        lowered = overlap_hlo.rewrite_lowered(fn.lower(*args))
    assert outcomes(lowered.sites) == [(pattern, False, "below threshold-mib")
                                       for pattern in patterns]


def test_sites_follow_the_executable_the_last_call_ran():
    fn, inputs, out_specs, _ = MLPS["psum"]
    small = Program(fn, (8,), ("x",), inputs, out_specs)
    large = Program(fn, (8,), ("x",), [((128, 32), P())] + WEIGHTS, out_specs)
    step = overlap_hlo.overlap(small.jitted(), threshold_mib=0.01)  # 8 KiB below, 16 above
    with pytest.warns(overlap_hlo.SitesLeftUnchanged):
        step(*small.args())
    assert [s.applied for s in step.sites] == [False]
    step(*large.args())
    assert [s.applied for s in step.sites] == [True]
    step(*small.args())                        # from the cache: no new rewrite
    assert [s.applied for s in step.sites] == [False] and len(step._compiled) == 2


def test_rewrite_lowered_and_exported_carry_their_sites(mlp):
    fn, args, patterns = mlp
    want = [(pattern, True, "") for pattern in patterns]
    lowered = overlap_hlo.rewrite_lowered(fn.lower(*args), threshold_mib=0)
    assert isinstance(lowered, jax.stages.Lowered) and outcomes(lowered.sites) == want
    exported = overlap_hlo.rewrite_exported(jax.export.export(fn)(*args), threshold_mib=0)
    assert isinstance(exported, jax.export.Exported) and outcomes(exported.sites) == want
    assert_close(exported.call(*args), fn(*args), [jnp.float32])
    backward = exported.vjp()                  # rewritten on its own: its own records
    assert backward.sites and all(isinstance(s, Site) for s in backward.sites)
    assert not hasattr(jax.export.deserialize(exported.serialize()), "sites")


def test_each_rewrite_logs_its_summary_at_info(mlp, caplog):
    fn, args, patterns = mlp
    tally = {1: "1 of 1 site rewritten", 2: "2 of 2 sites rewritten"}[len(patterns)]
    caplog.set_level(logging.INFO, logger="overlap_hlo")
    step = overlap_hlo.overlap(fn, threshold_mib=0)
    step(*args)
    step(*args)                                # a cache hit rewrites nothing: no line
    overlap_hlo.rewrite_lowered(fn.lower(*args), threshold_mib=0)
    overlap_hlo.rewrite_exported(jax.export.export(fn)(*args), threshold_mib=0)
    name = fn.__name__                         # the function's, through jax.jit
    assert name in ("psum_mlp", "sp_mlp")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("overlap_hlo.api", logging.INFO, f"overlap-hlo: {name}: {tally}"),
        ("overlap_hlo.api", logging.INFO, f"overlap-hlo: {tally}"),
        ("overlap_hlo.api", logging.INFO, f"overlap-hlo: {name}: {tally}"),
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="overlap_hlo"):   # INFO off: silent
        overlap_hlo.overlap(fn, threshold_mib=0)(*args)
    assert caplog.records == []


@pytest.fixture(scope="module")
def branch_program():
    """shard_map with all_gather -> dot inside lax.cond on each device's own flag: the
    devices may not all take the branch, so the site is left unchanged, and warned."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",), **auto_axis_types(1))

    def body(x, w, flag):
        return jax.lax.cond(flag[0] > 0,
                            lambda: jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w,
                            lambda: jnp.zeros((x.shape[0] * 8, w.shape[1]), x.dtype))

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P(), P("x")),
                               out_specs=P(), check_vma=False))
    x = jax.device_put(jnp.ones((64, 32), jnp.float32), NamedSharding(mesh, P("x")))
    w = jax.device_put(jnp.ones((32, 16), jnp.float32), NamedSharding(mesh, P()))
    flag = jax.device_put(jnp.ones((8,), jnp.int32), NamedSharding(mesh, P("x")))
    return fn, (x, w, flag)


def test_jax_entry_points_warn(branch_program):
    fn, args = branch_program
    want = np.asarray(fn(*args))
    with pytest.warns(overlap_hlo.SitesLeftUnchanged, match="left unchanged") as caught:
        got = overlap_hlo.overlap(fn, threshold_mib=0)(*args)
    assert caught[0].filename == __file__
    np.testing.assert_allclose(np.asarray(got), want)
    with pytest.warns(overlap_hlo.SitesLeftUnchanged):
        overlap_hlo.rewrite_lowered(fn.lower(*args), threshold_mib=0)
    with pytest.warns(overlap_hlo.SitesLeftUnchanged):
        overlap_hlo.rewrite_exported(jax.export.export(fn)(*args), threshold_mib=0)


def test_sites_the_compiled_schedule_kept_are_logged_as_kept(monkeypatch, caplog):
    """targets.decided rewrites with keep-sites naming the sites the compiled schedule
    kept: its log line and `.sites` give the schedule's reason, not "named by
    keep-sites". The report is faked here (no target compile): one site kept."""
    import dataclasses
    import types

    from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
    from overlap_hlo.targets import decided, report

    mesh = jax.make_mesh((8,), ("x",))

    def layer(x, w1, w2):
        h = jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w1
        return jax.lax.psum_scatter(jnp.tanh(h) @ w2, "x", scatter_dimension=0, tiled=True)

    specs = (P("x"), P(None, "x"), P("x"))
    plain = jax.jit(jax.shard_map(layer, mesh=mesh, in_specs=specs, out_specs=P("x")))
    args = [jax.device_put(np.random.default_rng(i).standard_normal(shape, np.float32),
                           NamedSharding(mesh, spec))
            for i, (shape, spec) in enumerate(zip([(64, 32), (32, 64), (64, 32)], specs))]
    sites = overlap_hlo.remarks(plain.lower(*args).compiler_ir("stablehlo"), threshold_mib=0)
    assert [s.applied for s in sites] == [True, True]
    kept = dataclasses.replace(sites[1], applied=False, kind=Kind.KEPT,
                               reason=f"{Kind.KEPT}: rewritten, its row took longer")
    fake = types.SimpleNamespace(built_with=(
        {"threshold_mib": 0, "keep_sites": kept.location}, DEFAULT_PIPELINE),
        records=[sites[0], kept])
    monkeypatch.setattr(report, "build", lambda *a, **k: fake)
    caplog.set_level(logging.INFO, logger="overlap_hlo")
    step = decided.overlap(plain, "v4:2x2x1")
    assert_close(step(*args), plain(*args), [jnp.float32])
    assert [(s.applied, s.kind) for s in step.sites] == [(True, Kind.NONE), (False, Kind.KEPT)]
    [line] = [r.getMessage() for r in caplog.records if r.name == "overlap_hlo.api"]
    assert line.endswith(overlap_hlo.rewrite_summary(step.sites))
    assert str(Kind.KEPT) in line and str(Kind.NAMED_KEPT) not in line
