"""For when a GPU is lent: run the layers' original and rewritten modules with real
kernels, record their times, and dump XLA's GEMM autotune results.

    python benchmarks/gpu_device.py --out DIR [--platform cuda|cpu] [--layers mlp,...]

On one GPU the 8-device programs run under JAX's mock GPU topology `1x8x1` (eight mock
hosts of one GPU: every kernel real, each collective a stand-in), so this process runs
one device's share. For each layer of benchmarks/tpu.py at 70B-class dims (bf16 MLP,
SwiGLU MLP, Q/K/V) it compiles the original (with `gpu.COMPILER_OPTIONS`) and the module
rewritten for the GPU target with one stream and with two (with `gpu.REWRITTEN_OPTIONS`),
runs each `--repeats` times after a warm-up and records the median wall time. While
compiling, XLA writes its GEMM autotune results to DIR/autotune/LAYER-VARIANT.textproto
(`--xla_gpu_dump_autotune_results_to`), for deviceless compiles to load with
`--xla_gpu_load_autotune_results_from`. It also records one profiler trace of each
executable in DIR/trace (kernel times). Everything goes to DIR: results.json (times, the
device, versions, errors per step), autotune/, trace/.

`--platform cpu` runs the same steps on this machine's 8 host devices with small dims
(no mock topology, autotuning or GPU flags): how the script is tested without a GPU.
Each step's failure is recorded and the script goes on; it is sized to finish in well
under 5 minutes on one H100/H200.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

PLATFORMS = ("cuda", "cpu")
LAYERS = ("mlp", "swiglu", "qkv")
VARIANTS = {"original": None, "one stream": {"bidirectional": False},
            "two streams": {"bidirectional": True}}
MOCK_TOPOLOGY = "1x8x1"


def configure(platform: str) -> None:
    """Before JAX starts a backend: the platform, and on CPU 8 host devices."""
    os.environ["JAX_PLATFORMS"] = platform
    if platform == "cpu":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8").strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for every result")
    parser.add_argument("--platform", choices=PLATFORMS, default="cuda")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    configure(args.platform)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    import jax
    if args.platform == "cuda":
        jax.config.update("jax_mock_gpu_topology", MOCK_TOPOLOGY)
    os.makedirs(os.path.join(args.out, "autotune"), exist_ok=True)
    start = time.perf_counter()
    results = {"platform": args.platform, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime()),
               "jax": jax.__version__, "runs": [], "errors": []}
    try:
        results["device"] = str(jax.devices()[0].device_kind)
        results["devices"] = len(jax.devices())
        for name in args.layers.split(","):
            results["runs"].extend(run_layer(name, args, results["errors"]))
    except Exception:   # noqa: BLE001 - whatever happens, what was measured is written
        results["errors"].append({"step": "setup", "error": traceback.format_exc(limit=3)})
    results["seconds"] = round(time.perf_counter() - start, 1)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({k: v for k, v in results.items() if k != "errors"}, indent=1))
    print(f"{len(results['errors'])} step(s) failed; see {args.out}/results.json")
    return 0


def run_layer(name: str, args, errors: list) -> list[dict]:
    """Compile, time and trace each variant of one layer."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    import overlap_hlo
    from benchmarks.tpu import LARGE, Dims, layer, lowerings
    from overlap_hlo.targets import gpu

    cuda = args.platform == "cuda"
    dims = LARGE if cuda else Dims(batch=1, seq=256, model=128, hidden=512)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(1, 8), ("dp", "tp"))
    try:
        lowered, _ = lowerings(name, dims, mesh)
        inputs = _inputs(layer(name, dims, mesh)[2], mesh)
    except Exception:   # noqa: BLE001 - record it and go on to the next layer
        errors.append({"step": f"{name} inputs", "error": traceback.format_exc(limit=3)})
        return []
    rows = []
    for variant, options in VARIANTS.items():
        step = f"{name} {variant}"
        try:
            source = lowered if options is None else overlap_hlo.rewrite_lowered(
                lowered, threshold_mib=0, target="gpu" if cuda else "cpu", **options)
            compiler_options = {}
            if cuda:
                compiler_options = dict(gpu.COMPILER_OPTIONS if options is None
                                        else gpu.REWRITTEN_OPTIONS)
                compiler_options["xla_gpu_dump_autotune_results_to"] = os.path.join(
                    args.out, "autotune", f"{name}-{variant.replace(' ', '-')}.textproto")
            began = time.perf_counter()
            compiled = source.compile(compiler_options or None)
            compile_s = time.perf_counter() - began
            jax.block_until_ready(compiled(*inputs))          # warm-up
            times = []
            for _ in range(args.repeats):
                began = time.perf_counter()
                jax.block_until_ready(compiled(*inputs))
                times.append(time.perf_counter() - began)
            label = variant.replace(" ", "-")
            with jax.profiler.trace(os.path.join(args.out, "trace", f"{name}-{label}")):
                jax.block_until_ready(compiled(*inputs))
            rows.append({"layer": name, "variant": variant, "median_us":
                         statistics.median(times) * 1e6, "min_us": min(times) * 1e6,
                         "compile_s": compile_s, "repeats": args.repeats})
            print(f"{step}: {rows[-1]['median_us']:.0f} us (median of {args.repeats})",
                  flush=True)
        except Exception:   # noqa: BLE001 - record it and go on to the next step
            errors.append({"step": step, "error": traceback.format_exc(limit=3)})
            print(f"{step}: failed (recorded)", flush=True)
    return rows


def _inputs(specs, mesh) -> list:
    """Random bf16 arrays of the layer's (global shape, PartitionSpec) inputs, made from
    this process's shards only (under the mock topology the others are mock hosts')."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    rng = np.random.default_rng(0)
    arrays = []
    for shape, spec in specs:
        data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        arrays.append(jax.make_array_from_callback(
            shape, NamedSharding(mesh, spec),
            lambda index, data=data: jnp.asarray(data[index], jnp.bfloat16)))
    return arrays


if __name__ == "__main__":
    sys.exit(main())
