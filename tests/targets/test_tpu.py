"""Compile for TPU slices ahead of time (libtpu, no TPU needed) and check the schedule's
structure: which permutes overlap a matmul, which collectives are left, how many
transfers each ring makes. No timings are asserted.

Skipped only when libtpu is not installed (python -m overlap_hlo.targets.tpu_plugin
install).
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from harness import ROOT, permutes, require_libtpu  # noqa: E402

require_libtpu()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import overlap_hlo  # noqa: E402
from overlap_hlo.rewrite.rewrite_pass import RewritePass  # noqa: E402
from overlap_hlo.targets import report, schedule, tpu, tpu_plugin  # noqa: E402
from overlap_hlo.tools import report as report_cli  # noqa: E402

GATHER = "overlap-all-gather-matmul"
SCATTER = "overlap-matmul-reduce-scatter"
# What a gather or scatter compiles to (small scatters become an all-reduce on TPU).
GATHER_SCATTER_OPCODES = {"all-gather", "reduce-scatter", "all-reduce"}
B, S, D, F = 1, 1024, 512, 2048      # small: a few seconds per compile
EXAMPLES = ROOT / "examples"


def mlp(x, w_gate, w_up, w_down):
    """A sequence-parallel SwiGLU MLP: one gather shared by two dots, one scatter."""
    g = jax.lax.all_gather(x, "x", axis=1, tiled=True)
    h = jax.nn.silu(g @ w_gate) * (g @ w_up)
    return jax.lax.psum_scatter(h @ w_down, "x", scatter_dimension=1, tiled=True)


SPECS = (P(None, "x"), P(None, "x"), P(None, "x"), P("x", None))


def mesh_of(topology: str) -> Mesh:
    return Mesh(np.array(tpu.topology(topology).devices), ("x",))


def lowered_jit(topology: str):
    return jax.jit(jax.shard_map(mlp, mesh=mesh_of(topology), in_specs=SPECS,
                                 out_specs=P(None, "x")))


def lowered_args(topology: str) -> list:
    mesh = mesh_of(topology)
    shapes = [(B, S, D), (D, F), (D, F), (F, D)]
    return [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in zip(shapes, SPECS)]


def lowered_mlp(topology: str):
    return lowered_jit(topology).lower(*lowered_args(topology))


def compiled_opcodes(analysis: schedule.Analysis) -> list[str]:
    """Opcodes of every scheduled instruction, through the typed HLO bindings."""
    module = analysis.hlo_module
    sched = module.schedule()
    opcodes = []
    for comp in module.computations():
        try:
            opcodes += [str(i.opcode) for i in sched.sequence(comp)]
        except Exception:
            continue
    return opcodes


@pytest.fixture(scope="module")
def one_stream():
    return report.build(lowered_mlp("v5e:2x4"), "v5e:2x4", threshold_mib=0, unroll=1)


def check_structure(rep: report.Report, ring: int) -> None:
    """What every option set must give: rewritten sites, no gather or scatter left,
    the gather side overlapped, each ring N-1 transfers, counts from the schedule."""
    assert {row.pattern for row in rep.sites} == {GATHER, SCATTER}
    assert all(row.applied for row in rep.sites)
    left = {c.opcode for c in rep.rewritten.collectives}
    assert not left & GATHER_SCATTER_OPCODES, left
    original = {c.opcode for c in rep.original.collectives}
    assert "all-gather" in original and original & {"reduce-scatter", "all-reduce"}
    for row in rep.sites:
        assert row.permutes > 0
        # Every block moves once; one scatter stream moves it in two halves (two chains).
        halves = row.pattern == SCATTER and not rep.options.get("bidirectional")
        assert row.permute_executions == (ring - 1) * (2 if halves else 1), row
        assert None not in row.trip_counts
        if row.pattern == GATHER:
            assert row.overlapped == row.permutes, row.permute_details
    starts = compiled_opcodes(rep.rewritten).count("HloOpcode.kCollectivePermuteStart")
    assert starts == rep.permutes == sum(row.permutes for row in rep.sites)
    assert compiled_opcodes(rep.original).count("HloOpcode.kCollectivePermuteStart") == 0
    for value in (rep.original_us, rep.rewritten_us):
        assert value >= rep.compute_bound_us > 0
    for row in rep.sites:
        assert min(row.before_us, row.after_us) >= row.compute_bound_us > 0
        check_verdict_of(row)
    assert rep.format().splitlines()[-1].startswith(
        f"verdict: predicted {'faster' if rep.speedup > 1.005 else ''}")


def check_verdict_of(row):
    """A row's compute is its breakdown's sum, before and after; a slower row says so."""
    before = sum(pair[0] for pair in row.compute_breakdown.values())
    after = sum(pair[1] for pair in row.compute_breakdown.values())
    assert before == pytest.approx(row.original_compute_us) and before > 0
    assert after == pytest.approx(row.rewritten_compute_us) and after > 0
    assert row.compute_breakdown["dots"][1] > 0
    assert row.slower == (row.applied and row.after_us > row.before_us * 1.005)
    assert row.speedup == pytest.approx(row.before_us / row.after_us)


def test_one_stream_v5e(one_stream):
    check_structure(one_stream, ring=8)
    gather = next(row for row in one_stream.sites if row.pattern == GATHER)
    assert gather.trip_counts == [6]           # rounds 1..6 in the loop, 0 and 7 outside
    bodies = {loop.body for loop in one_stream.rewritten.loops}
    assert len(bodies) == 2                    # one loop per ring
    assert {c.body for c in one_stream.rewritten.loop_copies} <= bodies
    # One shift per iteration: the carried shard is copied, and the report says why.
    assert one_stream.rewritten.loop_copies
    assert "with --unroll=2 it alternates between two" in one_stream.format()


def test_bidirectional_v5e():
    rep = report.build(lowered_mlp("v5e:2x4"), "v5e:2x4", threshold_mib=0,
                       bidirectional=True)
    check_structure(rep, ring=8)
    for row in rep.sites:   # two streams: permutes on both link directions of the ring
        lanes = {p["lane"] for p in row.permute_details}
        assert len(lanes) == 2 and all(lane.startswith("link") for lane in lanes), row


def test_one_stream_v5p():
    rep = report.build(lowered_mlp("v5p:2x2x2"), "v5p:2x2x2", threshold_mib=0)
    check_structure(rep, ring=8)


def test_unrolled_v6e():
    rep = report.build(lowered_mlp("v6e:2x4"), "v6e:2x4", threshold_mib=0, unroll=2)
    check_structure(rep, ring=8)
    gather = next(row for row in rep.sites if row.pattern == GATHER)
    assert gather.trip_counts == [3]           # six middle rounds, two per iteration
    assert rep.rewritten.loop_copies == []     # unrolled: carried buffers alternate


def test_trip_counts_are_one_replaceable_function(one_stream):
    """The schedule reads trip counts through one hook (a ring plan can stand in)."""
    topo = tpu.topology("v5e:2x4")
    timing = schedule.Timing(topo.hardware, topo.chip.clock_ghz)
    once = schedule.analyze(one_stream.rewritten.hlo_module, timing,
                            trip_counts=lambda module, loop: 1)
    assert [loop.trip_count for loop in once.loops] == [1, 1]
    sites = overlap_hlo.remarks(lowered_mlp("v5e:2x4").as_text(), threshold_mib=0)
    built = sum(site.plan.permutes * site.rings for site in sites if site.applied)
    assert sum(p.executions for p in once.permutes) == len(once.permutes) == built
    assert once.total_us < one_stream.rewritten_us


def test_scatter_ring_overlaps(one_stream):
    """The pipelined reduce_scatter ring: each round's dot runs while the accumulator
    travels (before, the compiler fused the dot with the add of the received one)."""
    scatter = next(row for row in one_stream.sites if row.pattern == SCATTER)
    assert scatter.applied and scatter.permutes > 0   # a ring: else nothing is checked
    assert scatter.overlapped == scatter.permutes


def test_input_forms_compile_alike(one_stream):
    """A Lowered (the fixture's), MLIR bytecode and an Exported compile to the same
    executable."""
    lowered = lowered_mlp("v5e:2x4")
    exported = jax.export.export(lowered_jit("v5e:2x4"), platforms=["tpu"])(
        *lowered_args("v5e:2x4"))
    bytecode = overlap_hlo.serialize(tpu.as_module(lowered), bytecode=True)
    topo = tpu.topology("v5e:2x4")
    for source in (bytecode, exported):
        compiled = tpu.compile_module(tpu.as_module(source), topo)
        analysis = report.analyze_compiled(compiled, schedule.Timing(topo.hardware, 1.0))
        assert compiled.memory.temp_size_in_bytes == one_stream.original_temp_bytes
        assert [c.opcode for c in analysis.collectives] == [
            c.opcode for c in one_stream.original.collectives]


def test_device_count_must_fit():
    module = tpu.as_module(lowered_mlp("v5e:2x4").as_text())
    with pytest.raises(tpu.TopologyMismatch, match="written for 8 device.*v5e:2x2 has 4"):
        tpu.compile_module(module, tpu.topology("v5e:2x2"))
    with pytest.raises(tpu.TopologyMismatch, match="unknown TPU topology"):
        tpu.topology("h100:8")


def test_missing_libtpu_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tpu_plugin, "private_dir", lambda: str(tmp_path / "none"))
    monkeypatch.setattr(tpu_plugin, "site_library", lambda: None)
    tpu.topology.cache_clear()
    try:
        with pytest.raises(tpu.TpuUnavailable,
                           match=r"python -m overlap_hlo.targets.tpu_plugin install"):
            tpu.topology("v5e:4x4")
    finally:
        tpu.topology.cache_clear()


def test_describing_a_slice_leaves_the_environment_as_it_was():
    """libtpu is named to JAX (TPU_LIBRARY_PATH) only while a slice is described: the
    processes this one starts later load no libtpu."""
    before = os.environ.get(tpu_plugin.ENV)
    assert tpu.topology("v5p:2x2x1").device_count == 4
    assert os.environ.get(tpu_plugin.ENV) == before


def test_cli_json_and_timeline(tmp_path, capsys):
    """From text printed without locations: sites are found by their line in it."""
    source = tmp_path / "mlp.mlir"
    source.write_text(lowered_mlp("v5e:2x4").as_text())
    out, svg = tmp_path / "report.json", tmp_path / "timeline.svg"
    code = report_cli.main([str(source), "--tpu=v5e:2x4", "--threshold-mib=0",
                            "--bidirectional", f"--json={out}", f"--timeline={svg}"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert printed.err == ""
    data = json.loads(out.read_text())
    assert {"sites", "original_us", "rewritten_us", "compute_bound_us"} <= set(data)
    assert [site["pattern"] for site in data["sites"]] == [GATHER, SCATTER]
    assert sum(site["permutes"] for site in data["sites"]) == data["permutes"] > 0
    for site in data["sites"]:
        assert site["location"].startswith(f"{source}:") and site["permutes"] > 0
        assert site["before_us"] >= site["compute_bound_us"] > 0
        assert site["permutes"] == len(site["permute_details"])
        assert site["overlapped"] == sum(p["overlapped"] for p in site["permute_details"])
    assert svg.read_text().lstrip().startswith("<?xml")
    assert "total" in printed.out and f"{data['overlapped']}/{data['permutes']}" in printed.out
    assert data["speedup"] == pytest.approx(data["original_us"] / data["rewritten_us"])
    assert data["sites_slower"] == [s["location"] for s in data["sites"] if s["slower"]]
    # The rows and the row outside the sites add up to the module, before and after.
    outside = data["outside_sites"]
    for i, (site_key, total_key) in enumerate((("before_us", "original_us"),
                                                ("after_us", "rewritten_us"))):
        assert sum(s[site_key] for s in data["sites"]) + outside["us"][i] == \
            pytest.approx(data[total_key])
    assert sum(s["exposed_us"] for s in data["sites"]) + outside["exposed_us"][1] == \
        pytest.approx(data["rewritten_exposed_us"])
    # No instruction counts in two rows (the gather's neighbour matmul is the scatter's
    # dot): what is outside the sites is never negative.
    assert min(value for pair in outside.values() for value in pair) >= 0, outside
    assert sum(s["original_compute_us"] for s in data["sites"]) + outside["compute_us"][0] \
        == pytest.approx(data["original_compute_us"])
    assert "outside the sites" in printed.out
    # Each module's compute holds at least its matmuls' estimates (none priced as else).
    assert data["model_problems"] == [] and data["original_matmul_us"] > 0
    assert data["rewritten_compute_us"] >= data["rewritten_matmul_us"] > 0
    assert printed.out.splitlines()[-1].startswith("verdict: predicted ")
    assert f"({data['speedup']:.2f}x) on v5e:2x4" in printed.out
    assert (data["topology"], data["requested"]) == ("v5e:2x4", None)


def test_cli_takes_an_accelerator_type(tmp_path, capsys):
    """--tpu=v5e-8 compiles for v5e:2x4, the shape Google's docs give a v5e-8 (8 chips),
    and the report names both."""
    source = tmp_path / "mlp.mlir"
    source.write_text(lowered_mlp("v5e:2x4").as_text())
    out = tmp_path / "report.json"
    code = report_cli.main([str(source), "--tpu=v5e-8", "--threshold-mib=0", f"--json={out}"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    data = json.loads(out.read_text())
    assert (data["topology"], data["requested"]) == ("v5e:2x4", "v5e-8")
    assert printed.out.splitlines()[-1].startswith("verdict: predicted ")
    assert f"({data['speedup']:.2f}x) on v5e-8 (v5e:2x4)" in printed.out


def test_cli_flags_a_slower_site_and_says_why(tmp_path, capsys):
    """A tiny module rewritten anyway (threshold 0) is slower: the report flags each
    site, gives the categories that grew, and an unchanged run reports real figures."""
    code = report_cli.main([str(EXAMPLES / "tp_mlp.mlir"), "--tpu=v5e:2x4",
                            "--threshold-mib=0", "--no-bidirectional"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count(" SLOWER") == 2 and "predicted slower (" in out
    assert "exposed communication +" in out
    assert "verdict: predicted slower" in out
    assert "2 of 2 rewritten site(s) predicted slower" in out
    assert report_cli.main([str(EXAMPLES / "tp_mlp.mlir"), "--tpu=v5e:2x4"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 site(s) left unchanged (not profitable)" in out   # the slice's model
    rows = [line.split() for line in out.splitlines()
            if line.startswith(str(EXAMPLES / "tp_mlp.mlir"))]
    assert len(rows) == 2 and all(float(row[6]) > 0 for row in rows)   # before us
    assert all(row[-1] in ("all-gather", "reduce-scatter") for row in rows)


def test_the_original_collectives_are_priced_with_the_cube_links_their_groups_span():
    """libtpu names its groups as an iota list or mesh axes (by version): read either,
    each collective of the MLP on v5p:2x2x2 spans the whole cube, three links into
    every chip, and is priced so: faster than over a ring's two links."""
    topology = "v5p:2x2x2"
    topo = tpu.topology(topology)
    rep = report.build(lowered_mlp(topology), topology, threshold_mib=1000)
    two_links = schedule.analyze(rep.original.hlo_module, schedule.Timing(
        topo.hardware, topo.chip.clock_ghz, topo.device_count))
    assert rep.original.collectives
    for with_links, ring in zip(rep.original.collectives, two_links.collectives):
        assert sorted(rep.original.proto.by_name[with_links.name].group) == list(range(8))
        assert with_links.name == ring.name and with_links.time_us < 0.8 * ring.time_us


@pytest.mark.parametrize("options", [{"threshold_mib": 0}, {"threshold_mib": 1000}],
                         ids=["rewritten", "left-unchanged"])
def test_a_scatter_of_a_sum_of_dots_is_found_by_its_dots(options):
    """On v5p XLA compiles the reduce_scatter of all 8 devices as an all-reduce without
    a source location: the site's dots (summed before the scatter) find it, so the
    original's time is counted (it once showed 0 us)."""
    mesh = mesh_of("v5p:2x2x2")
    specs = (P(None, "x"), P("x", None), P(None, "x"), P("x", None))
    body = jax.shard_map(lambda a, b, c, d: jax.lax.psum_scatter(
        a @ b + c @ d, "x", scatter_dimension=0, tiled=True),
        mesh=mesh, in_specs=specs, out_specs=P("x"))
    shapes = [(1024, 512), (512, 256), (1024, 512), (512, 256)]
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for s, spec in zip(shapes, specs)]
    (row,) = report.build(jax.jit(body).lower(*args), "v5p:2x2x2", **options).sites
    assert row.original_collectives == ["all-reduce"]
    assert row.before_us > row.original_compute_us > 0
    assert row.applied == (options["threshold_mib"] == 0)


def test_cli_lists_unchanged_sites_without_a_python_warning(tmp_path):
    """A summing ring is left unchanged on TPU: the report's verdict says so, and no
    SitesLeftUnchanged warning (a Python file path on stderr) is printed too."""
    mesh = mesh_of("v5e:2x4")
    fsdp = jax.jit(jax.shard_map(lambda x, w: x @ jax.lax.all_gather(w, "x", tiled=True),
                                 mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in [((256, 512), P("x")), ((512, 256), P("x"))]]
    source = tmp_path / "fsdp.mlir"
    source.write_text(fsdp.lower(*args).as_text())
    # A process of its own, as a user runs it: pytest would catch the warning.
    printed = subprocess.run([sys.executable, "-m", "overlap_hlo.tools.report", str(source),
                              "--tpu=v5e:2x4", "--threshold-mib=0"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "1 of 1 site(s) left unchanged (summing ring on TPU)" in printed.stdout
    assert printed.stderr == ""


@pytest.mark.parametrize("argv, code, message", [
    (["{src}", "--tpu=v5e:2x2", "--threshold-mib=0"], 1, "written for 8 device"),
    (["{src}", "--tpu=v9x:2x2"], 2, "unknown TPU topology"),
    (["{src}", "--tpu=v5e-12"], 2, "v5e-N takes N in 1, 4, 8, 16"),
    (["{src}", "--tpu=v5e:3x3"], 2, "TPU topology 'v5e:3x3'"),   # libtpu's refusal
    (["{src}", "--tpu=v5e:2x4", "--timeline=out.pdf"], 2, ".svg or .png"),
    (["{src}", "--tpu=v5e:2x4", "--pass-pipeline=builtin.module(nope)"], 2, "nope"),
    (["{src}"], 2, "--tpu"),
    (["{dir}/missing.mlir", "--tpu=v5e:2x4"], 1, "cannot read"),
    (["{src}", "--tpu=v5e:2x4", "--json={dir}/no/such/dir/out.json"], 1, "does not exist"),
])
def test_cli_errors(tmp_path, capsys, argv, code, message):
    source = tmp_path / "mlp.mlir"
    source.write_text(lowered_mlp("v5e:2x4").as_text())
    argv = [a.format(src=source, dir=tmp_path) for a in argv]
    assert report_cli.main(argv) == code
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3


def test_overlap_opt_stays_off_libtpu(tmp_path):
    """overlap-opt neither imports the TPU module nor initializes JAX backends, so
    libtpu adds no warnings and takes no lock."""
    code = ("import sys\n"
            "from overlap_hlo.tools import overlap_opt\n"
            "rc = overlap_opt.main([sys.argv[1], '-o', sys.argv[2], '--threshold-mib=0'])\n"
            "from jax._src import xla_bridge\n"
            "assert 'overlap_hlo.targets.tpu' not in sys.modules, 'tpu imported'\n"
            "assert not xla_bridge._backends, 'backends initialized'\n"
            "sys.exit(rc)\n")
    example = str(ROOT / "examples" / "tp_mlp.mlir")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS",)}
    done = subprocess.run([sys.executable, "-c", code, example, str(tmp_path / "o.mlir")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "overlap-opt: 2 of 2 sites rewritten\n"   # its summary alone


def test_synchronous_permutes_count_as_exposed():
    """On v5e slices of 32 chips and more the TPU compiler keeps collective-permutes
    synchronous: the schedule counts each as a permute that overlaps nothing, not as a
    collective left."""
    topo = tpu.topology("v5e:8x8")
    mesh = Mesh(np.array(topo.devices), ("x",))

    def shift(x, w):
        moved = jax.lax.ppermute(x, "x", [(i, (i + 1) % 64) for i in range(64)])
        return moved @ w

    fn = jax.jit(jax.shard_map(shift, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")))
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for s, spec in (((64 * 256, 256), P("x")), ((256, 256), P()))]
    compiled = tpu.compile_module(tpu.as_module(fn.lower(*args)), topo)
    timing = schedule.Timing(topo.hardware, topo.chip.clock_ghz, topo.device_count)
    analysis = report.analyze_compiled(compiled, timing)
    opcodes = compiled_opcodes(analysis)
    assert "HloOpcode.kCollectivePermute" in opcodes, opcodes
    assert "HloOpcode.kCollectivePermuteStart" not in opcodes, opcodes
    (permute,) = analysis.permutes
    assert not permute.overlapped and permute.executions == 1 and permute.exposed_us > 0
    assert not analysis.collectives


def test_tpu_forms_remove_copies_and_buffer_fills():
    """The TPU forms (report's default): two rounds per iteration, so no loop copies
    its carried shard, and the gathered result's buffer is left uninitialised, so no
    broadcast fills it; the forms every backend runs (target=cpu) have both. Compute
    from the TPU compiler's own estimates, compared as ratios."""
    tpu_forms = report.build(lowered_mlp("v6e:2x4"), "v6e:2x4", threshold_mib=0)
    portable = report.build(lowered_mlp("v6e:2x4"), "v6e:2x4", threshold_mib=0,
                            target="cpu")
    check_structure(tpu_forms, ring=8)
    assert tpu_forms.options["target"] == "tpu"
    ours, theirs = (rep.rewritten.compute_by_category() for rep in (tpu_forms, portable))
    assert theirs.get("copies", 0) > 0 and theirs.get("initialisation", 0) > 0
    assert ours.get("copies", 0) == 0 and ours.get("initialisation", 0) == 0, ours
    assert tpu_forms.rewritten.loop_copies == []
    assert tpu_forms.rewritten.compute_us < portable.rewritten.compute_us
    original = tpu_forms.original.compute_by_category()
    assert original["dots"] > 0 and not {"copies", "initialisation"} & set(original)


# What libtpu compiles a reduce-scatter of a dot's rows into (dim 1 of 3): a whole-device
# group on v5p:2x2x2, v4:2x2x1 and v5e:2x4, a subgroup of 8 on v5p:2x2x4. The profiles'
# `all_reduce_whole_scatter` follows 0.0.50.1 (what jax 0.12 installs and the tpu-*
# profiles are calibrated on); 0.0.42.1 (jax 0.10.2) makes more of them all-reduces.
SCATTER_LOWERINGS = {
    "0.0.50.1": {"v5p:2x2x2": "all-reduce", "v5p:2x2x4": "reduce-scatter",
                 "v4:2x2x1": "all-reduce", "v5e:2x4": "reduce-scatter"},
    "0.0.42.1": {"v5p:2x2x2": "all-reduce", "v5p:2x2x4": "all-reduce",
                 "v4:2x2x1": "all-reduce", "v5e:2x4": "all-reduce"},
}


@pytest.mark.parametrize("topology, mesh_shape", [
    ("v5p:2x2x2", (1, 8)), ("v5p:2x2x4", (2, 8)), ("v4:2x2x1", (1, 8)), ("v5e:2x4", (1, 8))])
def test_the_profiles_know_which_scatters_become_all_reduces(topology, mesh_shape):
    """What `Hardware.all_reduce_whole_scatter` says of the chip is what libtpu 0.0.50.1
    does: a reduce-scatter over every device becomes an all-reduce on v4 and v5p, one
    over a subgroup stays, and v5e and v6e keep both. The older libtpu of jax 0.10.2
    is checked against what it was seen to do (SCATTER_LOWERINGS)."""
    version = tpu_plugin.version()
    if version not in SCATTER_LOWERINGS:
        pytest.skip(f"libtpu {version}: its scatter lowering was not recorded "
                    f"(recorded: {', '.join(SCATTER_LOWERINGS)})")
    topo = tpu.topology(topology)
    mesh = Mesh(np.array(topo.devices).reshape(mesh_shape), ("d", "x"))

    def scatter(a, w):
        return jax.lax.psum_scatter(a @ w, "x", scatter_dimension=1, tiled=True)

    specs = (P("d", None, "x"), P("x", None))
    fn = jax.jit(jax.shard_map(scatter, mesh=mesh, in_specs=specs,
                               out_specs=P("d", "x", None)))
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in (((mesh_shape[0], 512, 8 * 128), specs[0]),
                                ((8 * 128, 256), specs[1]))]
    compiled = tpu.compile_module(tpu.as_module(fn.lower(*args)), topo)
    timing = schedule.Timing(topo.hardware, topo.chip.clock_ghz, topo.device_count)
    (left,) = report.analyze_compiled(compiled, timing).collectives
    assert left.opcode == SCATTER_LOWERINGS[version][topology]
    if version == "0.0.50.1":
        whole = mesh_shape[0] == 1
        assert (left.opcode == "all-reduce") == (whole and topo.hardware.all_reduce_whole_scatter)


@pytest.mark.parametrize("topology", ["v5e:2x4", "v5p:2x2x2", "v6e:2x4"])
def test_a_returned_all_gather_is_copied_as_the_profiles_price_it(topology):
    """libtpu copies an all-gather the program returns into the output buffer (an
    all-reduce it writes in place); `Hardware.returned_gather_us` prices that copy
    within 25% of the compiler's estimate for 128 MiB of bf16 (ratios of estimates)."""
    topo = tpu.topology(topology)
    mesh = Mesh(np.array(topo.devices), ("x",))
    fn = jax.jit(jax.shard_map(lambda x: jax.lax.all_gather(x * 2, "x", axis=0, tiled=True),
                               mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False))
    arg = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
    compiled = tpu.compile_module(tpu.as_module(fn.lower(arg)), topo)
    proto = report.analyze_compiled(compiled, schedule.Timing(
        topo.hardware, topo.chip.clock_ghz, topo.device_count)).proto
    root = proto.computations[proto.entry_id].root
    assert root.opcode == "copy"
    assert [o.opcode for o in proto.operands(root)] == ["all-gather"]
    priced = topo.hardware.returned_gather_us(8192 * 8192 * 2)
    assert 0.8 < priced / (root.estimated_cycles() / topo.chip.clock_ghz / 1e3) < 1.25


def test_two_stream_rings_visit_physical_neighbours():
    """The report passes the slice's coordinates: a two-stream ring on v5e:2x4 visits
    neighbours only, so its two permutes share no link; in the group's own order
    (device_coords="") they do, and the schedule model charges the shared links."""
    topo = tpu.topology("v5e:2x4")
    assert topo.links.text() == "2x4:" + ";".join(f"{d % 2},{d // 2}" for d in range(8))
    reports = report.build_variants(lowered_mlp("v5e:2x4"), topo, {
        "physical": {"threshold_mib": 0, "bidirectional": True},
        "group order": {"threshold_mib": 0, "bidirectional": True, "device_coords": ""}})
    physical, grouped = reports["physical"], reports["group order"]
    check_structure(physical, ring=8)
    proto = physical.rewritten.proto
    pairs = {pair for p in physical.rewritten.permutes for pair in proto.by_name[p.name].pairs}
    assert pairs and all(topo.links.hops(a, b) == 1 for a, b in pairs)
    assert physical.rewritten_us < grouped.rewritten_us


def test_overlap_opt_tpu_flag_builds_rings_for_the_slice(tmp_path, capsys):
    """overlap-opt --tpu=SLICE: the slice's coordinates (two-stream rings of neighbours
    on v5e:2x4), its profile, TPU forms; an unknown slice is one error line."""
    from overlap_hlo.tools import overlap_opt

    source = tmp_path / "in.mlir"
    source.write_text(lowered_mlp("v5e:2x4").as_text())
    out = tmp_path / "out.mlir"
    assert overlap_opt.main([str(source), "-o", str(out), "--tpu=v5e:2x4",
                             "--threshold-mib=0", "--bidirectional"]) == 0
    links = tpu.topology("v5e:2x4").links
    pairs = [pair for _, ps in permutes(overlap_hlo.parse(out.read_text())) for pair in ps]
    assert pairs and all(links.hops(a, b) == 1 for a, b in pairs)
    assert "AllocateBuffer" in out.read_text()     # the TPU forms
    assert overlap_opt.main([str(source), "--tpu=v9:9"]) == 2   # a usage error
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "overlap-opt: error: argument --tpu: unknown TPU topology 'v9:9'")



@pytest.mark.parametrize("topology", ["v5e:2x4", "v6e:2x4"])
def test_a_reduce_scatter_libtpu_fuses_is_priced(topology):
    """XLA's partitioner writes the reduce-scatter of an auto-sharded `o @ wo` (heads
    sharded, the output split on the sequence) as an all-reduce and a dynamic-slice;
    libtpu fuses both (`calls=%all-reduce-scatter`). The schedule prices that fusion as
    the reduce-scatter it is (it once counted as 0 us: XLA's attention output
    projection looked 4x faster than the original on v5e)."""
    topo = tpu.topology(topology)
    mesh = Mesh(np.array(topo.devices), ("x",))
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in (((2, 512, 1024), P(None, None, "x")),
                                ((1024, 256), P("x", None)))]
    fn = jax.jit(lambda o, w: o @ w, out_shardings=NamedSharding(mesh, P(None, "x", None)))
    compiled = tpu.compile_module(tpu.as_module(fn.lower(*args)), topo)
    assert "calls=%all-reduce-scatter" in compiled.hlo_module.to_string()
    timing = schedule.Timing(topo.hardware, topo.chip.clock_ghz, topo.device_count,
                             topo.links)
    analysis = report.analyze_compiled(compiled, timing)
    (left,) = analysis.collectives
    assert left.opcode == "reduce-scatter" and left.time_us > 0
    expected = timing.collective_us("reduce-scatter", 2 * 512 * 256 * 2, 2 * 64 * 256 * 2,
                                    8, tuple(range(8)))
    assert left.time_us == pytest.approx(expected)
    assert analysis.total_us == pytest.approx(analysis.compute_us + left.time_us)


def test_a_biased_scatter_broadcasts_its_bias_per_block():
    """A bias vector added before the reduce_scatter: the ring broadcasts the vector to
    each block. It used to slice blocks of the whole broadcast, which libtpu then wrote
    out in full (70B-class rows on v5e:2x4: +570 us of compute, the ring 0.94x the
    original; now 1.24x). Compute from the TPU compiler's estimates, as ratios."""
    topology = "v5e:2x4"
    topo = tpu.topology(topology)
    mesh = Mesh(np.array(topo.devices), ("x",))

    def biased(h, w, bias):
        return jax.lax.psum_scatter(h @ w + bias, "x", scatter_dimension=0, tiled=True)

    specs = (P(None, "x"), P("x", None), P())
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in zip(((4096, 28672), (28672, 8192), (8192,)), specs)]
    fn = jax.jit(jax.shard_map(biased, mesh=mesh, in_specs=specs, out_specs=P("x")))
    rep = report.build(fn.lower(*args), topology, threshold_mib=0, bidirectional=True)
    assert rep.rewritten.permutes and all(p.overlapped for p in rep.rewritten.permutes)
    assert "initialisation" not in rep.rewritten.compute_by_category()
    assert rep.rewritten.compute_us < 1.15 * rep.original.compute_us


def scanned_mlp(x, w_gate, w_up, w_down):
    """Two layers of `mlp` under lax.scan (weights stacked on dim 0)."""
    def layer(h, ws):
        return h + mlp(h, *ws), None

    return jax.lax.scan(layer, x, (w_gate, w_up, w_down))[0]


def weights_copied_out_of_the_stack(analysis, weight_elements: set[int]) -> list[str]:
    """Instructions, not matmuls, that slice a whole layer's weight out of a stack."""
    proto = analysis.proto

    def slices(instr) -> bool:
        inner = [i for c in proto.called(instr) for i in c.instructions]
        return any(i.opcode == "dynamic-slice" for i in (inner or [instr]))

    return [name for name in analysis.compute_by_name
            if not schedule.contains_matmul(proto, instr := proto.by_name[name])
            and np.prod(instr.shape.dims or (0,)) in weight_elements and slices(instr)]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_scanned_layers_weights_are_not_copied_out_of_the_stack(monkeypatch, bidirectional):
    """A ring in a scanned layer slices the layer's weights inside its loop (RingPlan.
    views_in_loop): libtpu fuses the slice into each dot, as it does in the original,
    instead of copying each weight out of the stack before the loop. Checked to fail
    with the slice passed into the loop (views_in_loop off). One stream: loops of
    several iterations, whose trip count the schedule model must still read."""
    topology = "v5e:2x4"
    mesh = mesh_of(topology)
    specs = (P(None, "x"), P(None, None, "x"), P(None, None, "x"), P(None, "x", None))
    shapes = [(B, S, D), (2, D, F), (2, D, F), (2, F, D)]
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in zip(shapes, specs)]
    lowered = jax.jit(jax.shard_map(scanned_mlp, mesh=mesh, in_specs=specs,
                                    out_specs=P(None, "x"))).lower(*args)
    per_device = {D * F // 8}

    def copies(views_in_loop: bool):
        monkeypatch.setattr(RewritePass, "views_in_loop", property(lambda _: views_in_loop))
        rep = report.build(lowered, topology, threshold_mib=0, bidirectional=bidirectional)
        assert rep.options["target"] == "tpu" and all(s.applied for s in rep.sites)
        # the loops that slice in their body still have their trip counts read
        assert rep.rewritten.loops and all(loop.trip_count for loop in rep.rewritten.loops)
        assert "warning:" not in rep.format()
        return (weights_copied_out_of_the_stack(rep.original, per_device),
                weights_copied_out_of_the_stack(rep.rewritten, per_device), rep)

    original, rewritten, rep = copies(True)
    assert original == [] and rewritten == [], rewritten
    assert copies(False)[1], "the check must see the copies of a slice passed in"
