"""Cost-model PREDICTIONS (not measurements) for GPT-style layers on each profile.

For each model size of the paper's range, one transformer layer's four sites on a
tensor-parallel group of 8 (bf16): Q/K/V projections (one all_gather, three dots),
the attention output projection (dot -> reduce_scatter), the MLP up projection
(all_gather -> dot) and down projection (dot -> reduce_scatter). Each site is
exported with jax.shard_map, and overlap_hlo decides it with --hardware=PROFILE,
exactly as `overlap-opt --remarks` would; the table sums the four sites' predicted
times before and after, one stream and bidirectional.

    python benchmarks/predictions.py [--tokens 16384] [--tp 8] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")   # host devices; no TPU backend start-up

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import overlap_hlo  # noqa: E402

# d_model of GPT-style models from ~6.7B to ~1T parameters (GPT-3 / Megatron sizes).
MODELS = {"gpt-6.7b": 4096, "gpt-13b": 5120, "gpt-175b": 12288, "gpt-1t": 25600}


def layer_modules(model: int, tokens: int, tp: int) -> dict[str, str]:
    """The four sites of one layer as StableHLO text, for a group of `tp` devices."""
    mesh = jax.make_mesh((tp,), ("tp",))
    ag = lambda x: jax.lax.all_gather(x, "tp", axis=0, tiled=True)  # noqa: E731
    rs = lambda y: jax.lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)  # noqa: E731
    hidden = 4 * model
    sites = {
        "qkv": (lambda x, wq, wk, wv: tuple(g @ w for g in [ag(x)] for w in (wq, wk, wv)),
                [((tokens, model), P("tp"))] + [((model, model), P(None, "tp"))] * 3,
                (P(None, "tp"),) * 3),
        "attn-out": (lambda a, wo: rs(a @ wo),
                     [((tokens, model), P(None, "tp")), ((model, model), P("tp"))], P("tp")),
        "mlp-up": (lambda x, w: ag(x) @ w,
                   [((tokens, model), P("tp")), ((model, hidden), P(None, "tp"))], P(None, "tp")),
        "mlp-down": (lambda h, w: rs(h @ w),
                     [((tokens, hidden), P(None, "tp")), ((hidden, model), P("tp"))], P("tp")),
    }
    texts = {}
    for name, (fn, inputs, out_specs) in sites.items():
        jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(s for _, s in inputs),
                                       out_specs=out_specs))
        args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
                for shape, spec in inputs]
        texts[name] = jitted.lower(*args).as_text()
    return texts


def predict(tokens: int, tp: int) -> list[dict]:
    rows = []
    for model_name, model in MODELS.items():
        texts = layer_modules(model, tokens, tp)
        for profile in overlap_hlo.PROFILES:
            if profile == "host-cpu":   # this machine's profile: for its own small sizes
                continue
            row = {"model": model_name, "hardware": profile}
            for mode, bidirectional in (("uni", False), ("bidi", True)):
                sites = [site for text in texts.values() for site in
                         overlap_hlo.remarks(text, hardware=profile, bidirectional=bidirectional)]
                before = sum(s.estimate.before_us for s in sites)
                # A site the model rejects keeps its original time.
                after = sum(s.estimate.after_us if s.applied else s.estimate.before_us
                            for s in sites)
                row[f"{mode}_before_us"] = before
                row[f"{mode}_after_us"] = after
                row[f"{mode}_applied"] = sum(s.applied for s in sites)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | hardware | layer before (us) | after, one stream (us) | speedup | "
             "after, bidirectional (us) | speedup | sites decomposed (uni/bidi) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['hardware']} | {r['uni_before_us']:.0f} | "
            f"{r['uni_after_us']:.0f} | {r['uni_before_us'] / r['uni_after_us']:.2f}x | "
            f"{r['bidi_after_us']:.0f} | {r['bidi_before_us'] / r['bidi_after_us']:.2f}x | "
            f"{r['uni_applied']}/4, {r['bidi_applied']}/4 |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per step (batch x seq)")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel group size")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    print(f"# cost-model PREDICTIONS, not measurements; {datetime.now(timezone.utc):%Y-%m-%d} UTC")
    print(f"# one layer's four sites, {args.tokens} tokens, bf16, tensor parallel {args.tp}")
    rows = predict(args.tokens, args.tp)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
