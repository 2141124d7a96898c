"""Compile for NVIDIA GPU targets ahead of time (JAX's CUDA plugin, no GPU needed) and
check the schedule's structure and the report built on it. No timings are asserted;
a GEMM's modelled time is checked against the cost model's formula.

Skipped only when the plugin is not installed (python -m overlap_hlo.targets.gpu_plugin
install). With jaxlib 0.10, whose plugin carries no target descriptions, the package's
copy of the 0.12 plugin's is used.
"""
import json

import pytest

from harness import ROOT
from overlap_hlo.targets import gpu

try:
    H100 = gpu.target("h100:8")
except gpu.GpuUnavailable as err:
    pytest.skip(f"no GPU compiler: {err}", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from overlap_hlo.plan import cost  # noqa: E402
from overlap_hlo.targets import aot, candidates, report, schedule  # noqa: E402
from overlap_hlo.targets.gpu_timing import GpuTiming  # noqa: E402
from overlap_hlo.tools import report as report_cli  # noqa: E402

M, K, N = 1024, 2048, 1024      # per-device rows, contracted, columns: small compiles


def gathered_dot(a, b):
    return jax.lax.all_gather(a, "x", axis=0, tiled=True) @ b


def lowered(tgt: gpu.Target, m: int = M, k: int = K, n_cols: int = N):
    mesh = Mesh(np.array(tgt.devices), ("x",))
    n = tgt.device_count
    specs = (P("x", None), P(None, "x"))
    fn = jax.jit(jax.shard_map(gathered_dot, mesh=mesh, in_specs=specs,
                               out_specs=P(None, "x")))
    return fn.lower(
        jax.ShapeDtypeStruct((m * n, k), jnp.bfloat16, sharding=NamedSharding(mesh, specs[0])),
        jax.ShapeDtypeStruct((k, n_cols * n), jnp.bfloat16,
                             sharding=NamedSharding(mesh, specs[1])))


@pytest.fixture(scope="module")
def one_stream():
    return report.build(lowered(H100), H100, threshold_mib=0, bidirectional=False)


def test_gather_becomes_overlapped_permutes(one_stream):
    original = [c.opcode for c in one_stream.original.collectives]
    assert original == ["all-gather"]
    (row,) = one_stream.sites
    assert row.applied and row.collectives_left == [] and row.original_collectives == [
        "all-gather"]
    assert one_stream.rewritten.collectives == []
    assert row.permutes == one_stream.permutes > 0
    assert 0 < row.overlapped <= row.permutes
    assert row.synchronous == sum(p.synchronous for p in one_stream.rewritten.permutes)
    assert one_stream.platform == "GPU" and "analytic model" in one_stream.times_from
    assert one_stream.original_temp_bytes > 0 and one_stream.rewritten_temp_bytes > 0
    text = one_stream.format()
    assert "GPU temporaries" in text and "kernels priced by the analytic model" in text


def test_permute_counts_match_the_compiled_module(one_stream):
    """Every collective-permute the compiled schedule runs is counted once (an
    asynchronous one is an async-start around a computation holding the permute)."""
    proto = one_stream.rewritten.proto
    sequences = schedule.scheduled_sequences(one_stream.rewritten.hlo_module, proto)
    starts = [i for seq in sequences.values() for i in seq if i.opcode == "async-start"]
    wrapped = {c.name for start in starts for c in proto.called(start)}
    scheduled = [i for name, seq in sequences.items() if name not in wrapped for i in seq
                 if i.opcode in ("collective-permute", "collective-permute-start")
                 or (i.opcode == "async-start"
                     and any(c.root.opcode == "collective-permute" for c in proto.called(i)))]
    assert len(scheduled) == one_stream.permutes


@pytest.mark.parametrize("bidirectional, unroll", [(True, 2), (False, 4)])
def test_unrolled_rings_keep_every_permute_asynchronous(bidirectional, unroll):
    """Unrolled rings whose loop would run once (two streams unroll=2, one stream
    unroll=4 over 8 GPUs) are emitted without the loop: with it, XLA's GPU pipeline made
    the sends before it synchronous (3 and 2 of 7 at the paper MLP's dims)."""
    rep = report.build(lowered(H100, 1024, 4096, 2048), H100, threshold_mib=0,
                       bidirectional=bidirectional, unroll=unroll, target="gpu")
    (row,) = rep.sites
    assert row.applied and rep.permutes == 7
    assert rep.overlapped == rep.permutes
    assert sum(p.synchronous for p in rep.rewritten.permutes) == 0


def test_gemm_priced_by_the_cost_model():
    compiled = gpu.compile_module(aot.as_module(lowered(H100)), H100)
    analysis = report.analyze_compiled(compiled, GpuTiming(H100.hardware, 0.0, 8))
    proto = analysis.proto
    (gemm,) = [proto.by_name[name] for name in analysis.compute_by_name
               if schedule.contains_matmul(proto, proto.by_name[name])]
    n = H100.device_count
    traffic = 2 * (M * n * K + K * N + M * n * N)          # bf16 operands and result
    expected = cost.PROFILES["h100-sxm"].dot_us(2.0 * M * n * K * N, traffic, "bf16")
    assert analysis.compute_by_name[gemm.name] == pytest.approx(expected)


def test_two_hosts_and_other_models():
    two = gpu.target("h100:2x8")
    assert two.device_count == 16 and two.hosts == 2
    assert sorted({d.process_index for d in two.devices}) == [0, 1]
    assert gpu.target("h200:8").hardware.name == "h200"
    b200 = gpu.target("b200:8")
    compiled = gpu.compile_module(aot.as_module(lowered(b200)), b200)
    assert compiled.memory.temp_size_in_bytes > 0


def test_a100_compiles_with_its_description_and_profile(tmp_path, capsys):
    """a100 (the 80 GB SXM4 part, the `a100` cost profile): XLA's description of it from
    the plugin, or this package's copy where the plugin carries none (jaxlib 0.10)."""
    a100 = gpu.target("a100:8")
    assert a100.devices[0].device_kind == "NVIDIA A100-SXM4-80GB"
    assert a100.hardware.name == "a100"
    source = tmp_path / "gather.mlir"
    source.write_text(lowered(a100).as_text())
    out = tmp_path / "report.json"
    assert report_cli.main([str(source), "--gpu=a100:8", "--threshold-mib=0",
                            "--no-bidirectional", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["topology"], data["hardware"]) == ("a100:8", "a100")
    assert data["permutes"] == data["overlapped"] > 0
    assert "on a100:8" in capsys.readouterr().out


def test_device_count_must_fit():
    module = aot.as_module(lowered(H100))
    with pytest.raises(gpu.TargetMismatch, match="written for 8 device.*h100:2x8 has 16"):
        gpu.compile_module(module, gpu.target("h100:2x8"))


def test_cli_gpu_json(tmp_path, capsys):
    """`overlap-report --gpu`: the bundled example's rows, permutes as compiled."""
    out = tmp_path / "report.json"
    assert report_cli.main([str(ROOT / "examples" / "transformer_layer.mlir"),
                            "--gpu=h100:8", "--threshold-mib=0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GPU temporaries" in text and "verdict:" in text
    payload = json.loads(out.read_text())
    assert payload["platform"] == "GPU" and payload["topology"] == "h100:8"
    assert len(payload["sites"]) == 4
    assert sum(row["permutes"] for row in payload["sites"]) == payload["permutes"] > 0
    assert payload["collectives_left"] == []


def test_the_profile_deciding_tries_no_tpu_candidate():
    """The candidate with the TPU summing rings is not tried for a GPU target (its module
    would be the two-stream one)."""
    rep = report.build(lowered(H100), H100)
    forms = [label for label in rep.candidates
             if label != report.PER_PASS and "slower site(s) kept" not in label]
    assert forms == [label for label, extra in report.CANDIDATES.items()
                     if candidates.tried_on(extra, "GPU")]
    assert not any("summing rings" in label for label in rep.candidates)


@pytest.mark.parametrize("argv, message", [
    (["--gpu=h100:8", "--tpu=v5e:2x4"], "not allowed with argument"),
    ([], "one of the arguments --tpu --gpu is required"),
    (["--gpu=h100:7x"], "argument --gpu: unknown GPU target 'h100:7x'"),
    (["--gpu=v100:8"], "MODEL one of h100, h200, b200, a100"),
])
def test_cli_target_errors(argv, message, capsys):
    """Each is a usage error: exit status 2, one line."""
    code = report_cli.main([str(ROOT / "examples" / "transformer_layer.mlir"), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def scattered_dot(a, b):
    return jax.lax.psum_scatter(a @ b, "x", scatter_dimension=0, tiled=True)


def lowered_scatter(tgt: gpu.Target, m: int = M, k: int = K, n_cols: int = N):
    mesh = Mesh(np.array(tgt.devices), ("x",))
    n = tgt.device_count
    specs = (P(None, "x"), P("x", None))
    fn = jax.jit(jax.shard_map(scattered_dot, mesh=mesh, in_specs=specs, out_specs=P("x")))
    return fn.lower(
        jax.ShapeDtypeStruct((m * n, k * n), jnp.bfloat16, sharding=NamedSharding(mesh, specs[0])),
        jax.ShapeDtypeStruct((k * n, n_cols), jnp.bfloat16,
                             sharding=NamedSharding(mesh, specs[1])))


def test_ring_flags_keep_the_scatter_chains_apart(monkeypatch):
    """A one-stream reduce_scatter ring has two chains whose permutes and dots XLA's GPU
    pipeline merges by default (the merged permute then waits for the merged dot); with
    RING_FLAGS every permute has a GEMM between its start and done."""
    with_flags = report.build(lowered_scatter(H100), H100, threshold_mib=0,
                              bidirectional=False)
    assert with_flags.permutes and with_flags.overlapped == with_flags.permutes
    assert with_flags.synchronous == 0
    monkeypatch.setattr(gpu, "REWRITTEN_OPTIONS", gpu.COMPILER_OPTIONS)
    merged = report.build(lowered_scatter(H100), H100, threshold_mib=0, bidirectional=False)
    assert merged.permutes < with_flags.permutes        # chains' permutes combined
    assert merged.overlapped < merged.permutes


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_two_stream_scatter_ring_keeps_every_permute_asynchronous(target):
    """The own block adds the up stream's sum behind a barrier and the last arrival
    after it, in the GPU forms and in those every backend runs: with both adds fused
    into the GEMM, XLA made the last transfer synchronous (the 70B MLP's down
    projection on h100:8, these dims)."""
    rep = report.build(lowered_scatter(H100, 512, 3584, 8192), H100, threshold_mib=0,
                       bidirectional=True, target=target)
    (row,) = rep.sites
    assert row.applied and rep.rewritten.collectives == []
    assert rep.synchronous == 0 and rep.overlapped == rep.permutes > 0


def shared_gather(x, wq, wk, wv):
    g = jax.lax.all_gather(x, "x", axis=1, tiled=True)
    return g @ wq, g @ wk, g @ wv


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_a_second_stream_adds_its_shards_not_a_round_of_products(target):
    """Three dots on one gather (Q/K/V at Llama-70B's dims), two streams: each dot's
    second block waits for its first to be written. Without that XLA's GPU scheduler
    ran a round's six GEMMs before their writes, each product live as split-K f32
    partials (8 MiB each): 80 MiB of temporaries against one stream's 40; 56 with it.
    The second stream may add its received shards (two buffers of 8 MiB), no more. The
    GPU forms and those every backend runs (target=cpu) alike."""
    mesh = Mesh(np.array(H100.devices), ("x",))
    n, rows, width, cols = H100.device_count, 512, 8192, 1024
    specs = (P(None, "x", None), P(None, "x"), P(None, "x"), P(None, "x"))
    fn = jax.jit(jax.shard_map(shared_gather, mesh=mesh, in_specs=specs,
                               out_specs=(P(None, None, "x"),) * 3))
    shapes = [(1, rows * n, width)] + [(width, cols * n)] * 3
    lowered_qkv = fn.lower(*(jax.ShapeDtypeStruct(s, jnp.bfloat16,
                                                  sharding=NamedSharding(mesh, spec))
                             for s, spec in zip(shapes, specs)))
    one, two = (report.build(lowered_qkv, H100, threshold_mib=0, bidirectional=streams,
                             target=target) for streams in (False, True))
    for rep in (one, two):
        (row,) = rep.sites
        assert row.applied and rep.rewritten.collectives == []
        assert rep.overlapped == rep.permutes > 0 and rep.synchronous == 0
    shard = rows * width * 2
    assert two.rewritten_temp_bytes <= one.rewritten_temp_bytes + 2 * shard + 2**20
    assert two.rewritten_temp_bytes <= two.original_temp_bytes


@pytest.mark.parametrize("options", [{}, {"xla_gpu_dot_merger_threshold_mb": 32}])
def test_rewrite_lowered_compiles_gpu_rings_with_their_flags(options):
    """What overlap() and rewrite_lowered compile: a Lowered for the GPU whose rings
    get RING_FLAGS as compiler options of that executable alone (no XLA_FLAGS), under
    the ones the user gives .compile(); compiled deviceless, every permute of the
    scatter ring then has a GEMM between its start and done."""
    import overlap_hlo
    from overlap_hlo.targets.gpu_timing import GpuTiming

    new = overlap_hlo.rewrite_lowered(lowered_scatter(H100), threshold_mib=0,
                                      bidirectional=False)
    assert set(gpu.REWRITTEN_OPTIONS.items()) <= set(new._lowering._compiler_options_kvs)
    compiled = new.compile(options or None)
    hlo = compiled.runtime_executable().hlo_modules()[0]
    permutes = schedule.analyze(hlo, GpuTiming(H100.hardware, 0.0, 8),
                                timeline=False).permutes
    if options:   # the user's dot merger merges the chains' dots again
        assert not all(p.window_matmul for p in permutes)
    else:
        assert permutes and all(p.window_matmul and not p.synchronous for p in permutes)
    plain = lowered_scatter(H100)   # a module without rings gets no options
    kept = overlap_hlo.rewrite_lowered(plain, threshold_mib=1e6)   # nothing rewritten
    assert not kept._lowering._compiler_options_kvs


def test_overlap_decided_for_a_gpu_target_runs_on_cpu_devices():
    """targets.decided.overlap with a GPU target: the report compiled for H100 decides,
    the lowering for host CPU devices runs the decision and computes the original's."""
    from harness import assert_close, permutes

    from overlap_hlo.targets import decided

    mesh = Mesh(np.array(jax.devices("cpu")[:H100.device_count]), ("x",))
    plain = jax.jit(jax.shard_map(gathered_dot, mesh=mesh, in_specs=(P("x", None),
                                  P(None, "x")), out_specs=P(None, "x")))
    step = decided.overlap(plain, "h100:8")   # a GPU target by name
    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (M * H100.device_count, K), jnp.bfloat16)
    b = jax.random.normal(kb, (K, N * H100.device_count), jnp.bfloat16) / np.sqrt(K)
    assert_close(step(a, b), plain(a, b), [jnp.bfloat16])
    rep = step.report
    assert rep.platform == "GPU" and [site.pattern for site in step.sites] == [
        row.pattern for row in rep.sites]
    applied = [site.applied for site in step.sites]
    assert applied == [row.applied for row in rep.sites]
    assert bool(permutes(step.lower(a, b).compiler_ir("stablehlo"))) == any(applied)
    assert (rep.built_with is None) == (rep.chosen == report.ORIGINAL)
