"""Real programs: how many of the bytes that collectives next to matmuls move the rewrite
takes off the matmuls, and whether every rewrite still computes the same.

    python benchmarks/real_programs.py [--json PATH] [--table PATH.md]

Each program re-creates, at small dims, a pattern from public JAX code (named in its
docstring), written with `jax.shard_map` on 8 host CPU devices. For each program and
option set (the defaults; `bidirectional=True, unroll=2`; the TPU and GPU forms):

- *beside matmuls*: the all_gather, reduce_scatter, all_reduce and all_to_all ops whose
  result reaches a dot, or whose operand comes from one (a loop's result: from its last
  round), through ops that only move, cast or combine elements (`beside_matmuls`; an
  independent reading of the module, not the passes' own matching), and the bytes each
  moves (its larger side; twice that for an all_reduce, a reduce-scatter and an
  all-gather, so the all_gather an all_reduce's ring leaves counts for half);
- the same after `overlap_hlo.rewrite_lowered`, and the share of the bytes gone;
- the rewritten program run against the original with the same random inputs.

The target (issue 20): at least 95% of the bytes gone with the defaults and with
`--bidirectional --unroll=2`, every rewrite numerically equal.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402

import overlap_hlo  # noqa: E402
from overlap_hlo.ir.dots import tensor_bytes  # noqa: E402
from overlap_hlo.ir.ops import ELEMENTWISE, as_op, defining_op  # noqa: E402
from overlap_hlo.targets.cpu import rewrite_runnable  # noqa: E402

OPTION_SETS = {"defaults": {},
               "bidirectional, unroll=2": {"bidirectional": True, "unroll": 2},
               "tpu forms": {"target": "tpu", "bidirectional": True},
               "gpu forms": {"target": "gpu", "bidirectional": True}}
TARGET_SHARE = 0.95

COLLECTIVES = frozenset(f"stablehlo.{name}" for name in (
    "all_gather", "reduce_scatter", "all_reduce", "all_to_all"))
DOTS = frozenset({"stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution"})
# Ops that only move, cast or combine elements: a collective reached through them still
# sits next to the matmul.
PASSING = ELEMENTWISE | {f"stablehlo.{name}" for name in (
    "convert", "reshape", "transpose", "broadcast_in_dim", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "select", "reduce")} | {
    "sdy.sharding_constraint"}
DEPTH = 8


# --- the programs -----------------------------------------------------------------------

def ag(x, axis, name="x"):
    return jax.lax.all_gather(x, name, axis=axis, tiled=True)


def rs(y, axis, name="x"):
    return jax.lax.psum_scatter(y, name, scatter_dimension=axis, tiled=True)


def a2a(x, split, concat, name="x"):
    return jax.lax.all_to_all(x, name, split, concat, tiled=True)


@dataclass
class Program:
    """A shard_map program on 8 devices: its function, mesh and inputs."""

    name: str
    source: str                       # the public code it re-creates
    fn: object
    mesh: tuple[tuple[int, ...], tuple[str, ...]]
    inputs: list[tuple[tuple[int, ...], P]]
    out_specs: object
    tolerance: float = 2e-4
    grad: bool = False                # differentiate a scalar loss of fn w.r.t. all inputs

    def jitted(self):
        shape, axes = self.mesh
        mesh = jax.make_mesh(shape, axes, **_auto(len(axes)))
        fn = self.fn
        out_specs = self.out_specs
        if self.grad:
            body = fn

            def fn(*args):
                return jax.grad(lambda *a: jnp.sum(jnp.square(body(*a))),
                                argnums=tuple(range(len(args))))(*args)
            out_specs = tuple(spec for _, spec in self.inputs)
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=tuple(s for _, s in self.inputs),
                                     out_specs=out_specs, check_vma=False)), mesh

    def args(self, mesh, seed: int = 0):
        rng = np.random.default_rng(seed)
        return [jax.device_put(jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[-1]),
                                           jnp.float32), NamedSharding(mesh, spec))
                for shape, spec in self.inputs]


def _auto(count: int) -> dict:
    axis_type = getattr(jax.sharding, "AxisType", None)
    return {} if axis_type is None else {"axis_types": (axis_type.Auto,) * count}


def megatron_mlp(x, w1, w2):
    """Column- then row-parallel matmul, the partial sums added with psum."""
    return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "x")


def gptj_block(x, wq, wo, w1, w2):
    """GPT-J's parallel block: attention and MLP on the same input, one psum of both."""
    s = x.shape[0]
    q = (x @ wq).reshape(s, -1, 64)
    scores = jnp.einsum("qhd,khd->hqk", q, q) / 8.0
    attn = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), q).reshape(s, -1)
    return x + jax.lax.psum(attn @ wo + jax.nn.gelu(x @ w1) @ w2, "x")


def sequence_parallel_mlp(x, w1, w2):
    """Megatron's sequence parallelism: gather the sequence, scatter the sum back."""
    return x + rs(jax.nn.gelu(ag(x, 0) @ w1) @ w2, 0)


def scanned_layers(x, w1, w2):
    """Sequence-parallel layers under jax.lax.scan (MaxText's scanned decoder)."""
    def layer(h, ws):
        return sequence_parallel_mlp(h, *ws), None
    return jax.lax.scan(layer, x, (w1, w2))[0]


def fsdp_layer(x, w):
    """FSDP: the weight's rows gathered before use (its gradient is scattered back)."""
    return jax.nn.gelu(x @ ag(w, 0))


def data_parallel_step(x, w1, w2):
    """A tensor-parallel MLP's weight gradients, averaged over the data-parallel axis
    (the optimizer's input in every data-parallel training step)."""
    def loss(w1, w2):
        return jnp.sum(jnp.square(megatron_mlp(x, w1, w2)))
    return jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), jax.grad(loss, (0, 1))(w1, w2))


def moe_layer(x, router, w1, w2):
    """Top-1 MoE with capacity (AXLearn / MaxText): dispatch einsum, all_to_all over the
    experts, expert matmuls, all_to_all back, combine einsum."""
    t, e = x.shape[0], router.shape[1]
    capacity = 2 * t // e
    choice = jnp.argmax(x @ router, axis=-1)
    slot = jnp.cumsum(jax.nn.one_hot(choice, e), axis=0) * jax.nn.one_hot(choice, e)
    mask = jax.nn.one_hot(jnp.sum(slot, -1).astype(jnp.int32) - 1, capacity)[:, None, :] \
        * jax.nn.one_hot(choice, e)[:, :, None]                     # [t, e, c]
    dispatched = a2a(jnp.einsum("td,tec->ecd", x, mask), 0, 1)     # [e/8, 8c, d]
    h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", dispatched, w1))
    out = a2a(jnp.einsum("ecf,efd->ecd", h, w2), 1, 0)             # [e, c, d]
    return jnp.einsum("ecd,tec->td", out, mask)


def ulysses_attention(x, wq, wk, wv, wo):
    """DeepSpeed-Ulysses (MaxText): heads exchanged for the sequence around attention."""
    s = x.shape[0]
    q, k, v = (a2a((x @ w).reshape(s, -1, 64), 1, 0) for w in (wq, wk, wv))  # [8s, h/8, 64]
    scores = jnp.einsum("qhd,khd->hqk", q, k) / 8.0
    o = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), v)
    return a2a(o, 0, 1).reshape(s, -1) @ wo


def weight_gathered(x, w):
    """Weight-gathered 2-D layout (google-research's scaling-transformer-inference): the
    weight gathered over 'x' along one dim, then over ('y', 'z') along the other."""
    return x @ ag(ag(w, 0, "x"), 1, ("y", "z"))


def int8_mlp(x, scale, w1, w2):
    """An int8 activation gathered, dequantized by a per-channel scale, then used
    (EasyDeL's quantized linear), with a sequence-parallel scatter after."""
    xq = jnp.round(jnp.clip(x * 64, -127, 127)).astype(jnp.int8)
    h = (ag(xq, 0).astype(jnp.float32) * scale) @ w1
    return rs(jax.nn.gelu(h) @ w2, 0)


PROGRAMS = [
    Program("megatron-mlp", "Megatron-LM tensor-parallel MLP (psum after the row-parallel "
            "matmul)", megatron_mlp, ((8,), ("x",)),
            [((1024, 512), P()), ((512, 2048), P(None, "x")), ((2048, 512), P("x"))], P()),
    Program("megatron-mlp-grad", "its training step (value_and_grad through the psum)",
            megatron_mlp, ((8,), ("x",)),
            [((512, 512), P()), ((512, 2048), P(None, "x")), ((2048, 512), P("x"))], P(),
            grad=True),
    Program("gptj-block", "mesh-transformer-jax's GPT-J layer (one psum of attention and "
            "MLP)", gptj_block, ((8,), ("x",)),
            [((512, 512), P()), ((512, 1024), P(None, "x")), ((1024, 512), P("x")),
             ((512, 2048), P(None, "x")), ((2048, 512), P("x"))], P()),
    Program("sequence-parallel-mlp", "Megatron sequence parallelism", sequence_parallel_mlp,
            ((8,), ("x",)),
            [((1024, 512), P("x")), ((512, 2048), P(None, "x")), ((2048, 512), P("x"))],
            P("x")),
    Program("scanned-layers-grad", "MaxText's scanned decoder, training step",
            scanned_layers, ((8,), ("x",)),
            [((1024, 256), P("x")), ((2, 256, 1024), P(None, None, "x")),
             ((2, 1024, 256), P(None, "x"))], P("x"), grad=True),
    Program("fsdp-grad", "FSDP (the weight gathered, its gradient scattered)", fsdp_layer,
            ((8,), ("x",)), [((1024, 1024), P("x")), ((1024, 512), P("x"))], P("x"),
            grad=True),
    Program("dp-gradient-mean", "data-parallel gradient means over a tensor-parallel MLP",
            data_parallel_step, ((2, 4), ("dp", "x")),
            [((1024, 512), P("dp")), ((512, 2048), P(None, "x")), ((2048, 512), P("x"))],
            (P(None, "x"), P("x"))),
    Program("moe", "AXLearn / MaxText top-1 MoE with capacity", moe_layer, ((8,), ("x",)),
            [((4096, 512), P("x")), ((512, 16), P()), ((16, 512, 1024), P("x")),
             ((16, 1024, 512), P("x"))], P("x"), tolerance=1e-3),
    Program("ulysses", "DeepSpeed-Ulysses attention (MaxText)", ulysses_attention,
            ((8,), ("x",)), [((2048, 1024), P("x"))] + [((1024, 1024), P())] * 4, P("x")),
    Program("weight-gathered", "google-research scaling-transformer-inference, 2-D "
            "weight-gathered FFN", weight_gathered, ((2, 2, 2), ("x", "y", "z")),
            [((1024, 1024), P(("x", "y", "z"))), ((1024, 1024), P("x", ("y", "z")))],
            P(("x", "y", "z"))),
    Program("int8-mlp", "EasyDeL int8 MLP (dequantizing scale, sequence parallel)",
            int8_mlp, ((8,), ("x",)),
            [((2048, 1024), P("x")), ((1, 1024), P()), ((1024, 2048), P(None, "x")),
             ((2048, 1024), P("x"))], P("x")),
]


# --- reading a module -------------------------------------------------------------------

@dataclass(frozen=True)
class Collective:
    name: str                 # stablehlo.all_gather, ...
    bytes: float              # the larger of its operand and its result
    location: str


def _producers(value: ir.Value) -> list[ir.Value]:
    """What `value` is computed from, one step up: a PASSING op's operands, the value an
    optimization_barrier passes on, or for a loop's result the value its body returns
    (the loop's last round)."""
    op = defining_op(value)
    if op is None:
        return []
    if op.name in PASSING:
        return list(op.operands)
    index = list(op.results).index(value)
    if op.name == "stablehlo.optimization_barrier":
        return [op.operands[index]]
    if op.name == "stablehlo.while":
        terminator = list(op.regions[1].blocks[0].operations)[-1]
        return [terminator.operands[index]]
    return []


def _nearby(value: ir.Value, forward: bool, depth: int = DEPTH) -> bool:
    """A dot reached from `value` through PASSING ops, along users or producers (and
    into a loop's last round)."""
    frontier = [value]
    for _ in range(depth):
        if forward:
            ops = [as_op(use.owner) for v in frontier for use in v.uses]
            if any(op.name in DOTS for op in ops):
                return True
            frontier = [r for op in ops if op.name in PASSING for r in op.results] + [
                use.owner.results[use.operand_number] for v in frontier for use in v.uses
                if as_op(use.owner).name == "stablehlo.optimization_barrier"]
        else:
            if any((op := defining_op(v)) is not None and op.name in DOTS for v in frontier):
                return True
            frontier = [p for v in frontier for p in _producers(v)]
        if not frontier:
            return False
    return False


def moved_bytes(op: ir.Operation) -> float:
    """What a collective moves, counted in tensors of its larger side: an all_reduce
    moves it twice (a reduce-scatter, then an all-gather), the others once."""
    size = max(tensor_bytes(v.type) for v in [*op.operands, *op.results]
               if isinstance(v.type, ir.RankedTensorType))
    return 2 * size if op.name == "stablehlo.all_reduce" else size


def beside_matmuls(module: ir.Module) -> list[Collective]:
    """The collectives of `module` whose result reaches a dot or whose operand comes from
    one through PASSING ops (within a region), with the bytes each moves."""
    found = []

    def visit(op):
        op = as_op(op)
        if op.name in COLLECTIVES:
            if any(_nearby(r, True) for r in op.results) or \
                    any(_nearby(o, False) for o in op.operands):
                found.append(Collective(op.name, moved_bytes(op), str(op.location)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


# --- measuring --------------------------------------------------------------------------

@dataclass
class Outcome:
    before: list[Collective]
    after: list[Collective]
    rewritten_sites: int
    max_error: float
    remarks: list[str] = field(default_factory=list)       # the sites left unchanged
    applied_all_reduces: list[str] = field(default_factory=list)   # their locations

    @property
    def share(self) -> float:
        """The share of the bytes beside matmuls that no longer are."""
        total = sum(c.bytes for c in self.before)
        return 1.0 - sum(c.bytes for c in self.after) / total if total else 1.0


def run(program: Program, options: dict) -> Outcome:
    """`program` lowered, rewritten with `options` (sites decided as the defaults decide:
    a target's forms are given alone, so the threshold stays), run against the original."""
    jitted, mesh = program.jitted()
    args = program.args(mesh)
    lowered = jitted.lower(*args)
    before = beside_matmuls(overlap_hlo.parse(lowered.as_text()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", overlap_hlo.SitesLeftUnchanged)
        sites, module, rewritten = rewrite_runnable(lowered, **options)
    after = beside_matmuls(module)
    want = jax.tree.leaves(jitted(*args))
    got = jax.tree.leaves(rewritten.compile()(*args))
    error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                / max(1.0, float(np.max(np.abs(np.asarray(a))))) for a, b in zip(want, got))
    return Outcome(before, after, sum(s.applied for s in sites), error,
                   [s.format() for s in sites if not s.applied],
                   [s.location for s in sites
                    if s.applied and s.pattern == "overlap-matmul-all-reduce"])


def measure(programs=PROGRAMS, option_sets=OPTION_SETS) -> list[dict]:
    rows = []
    for program in programs:
        for label, options in option_sets.items():
            start = time.perf_counter()
            out = run(program, options)
            rows.append({
                "program": program.name, "source": program.source, "options": label,
                "beside_before": len(out.before),
                "mib_before": sum(c.bytes for c in out.before) / 2**20,
                "beside_after": len(out.after),
                "mib_after": sum(c.bytes for c in out.after) / 2**20,
                "left": [f"{c.name} {c.bytes / 2**20:.2f} MiB at {c.location}"
                         for c in out.after],
                "share": out.share, "rewritten_sites": out.rewritten_sites,
                "max_error": out.max_error, "correct": out.max_error <= program.tolerance,
                "remarks": out.remarks, "seconds": time.perf_counter() - start})
            print(f"{program.name:24s} {label:24s} {rows[-1]['share']:6.1%} "
                  f"error {out.max_error:.1e}", file=sys.stderr, flush=True)
    return rows


def totals(rows: list[dict]) -> dict[str, dict]:
    """Per option set: bytes beside matmuls before and after over every program, the
    share gone, and whether every rewrite was numerically equal."""
    out = {}
    for label in dict.fromkeys(row["options"] for row in rows):
        mine = [row for row in rows if row["options"] == label]
        before = sum(row["mib_before"] for row in mine)
        after = sum(row["mib_after"] for row in mine)
        out[label] = {"mib_before": before, "mib_after": after,
                      "share": 1 - after / before if before else 1.0,
                      "correct": all(row["correct"] for row in mine),
                      "collectives_before": sum(row["beside_before"] for row in mine),
                      "collectives_after": sum(row["beside_after"] for row in mine)}
    return out


def table(rows: list[dict]) -> str:
    labels = list(dict.fromkeys(row["options"] for row in rows))
    lines = ["| program | beside matmuls | " + " | ".join(labels) + " |",
             "|---|---|" + "---|" * len(labels)]
    for name in dict.fromkeys(row["program"] for row in rows):
        mine = {row["options"]: row for row in rows if row["program"] == name}
        first = mine[labels[0]]
        cells = [f"{r['share']:.0%} gone ({r['beside_after']} left), "
                 f"{'equal' if r['correct'] else 'MISMATCH'}" for r in mine.values()]
        lines.append(f"| {name} | {first['beside_before']}, {first['mib_before']:.1f} MiB | "
                     + " | ".join(cells) + " |")
    summary = totals(rows)
    lines.append("| **all** | " + f"{summary[labels[0]]['collectives_before']}, "
                 f"{summary[labels[0]]['mib_before']:.1f} MiB | " + " | ".join(
                     f"**{t['share']:.1%}** gone ({t['collectives_after']} left), "
                     f"{'all equal' if t['correct'] else 'MISMATCH'}"
                     for t in summary.values()) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--programs", help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    programs = PROGRAMS
    if args.programs:
        wanted = args.programs.split(",")
        programs = [p for p in PROGRAMS if p.name in wanted]
    start = time.perf_counter()
    rows = measure(programs)
    text = table(rows)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"# real programs, {stamp}, jax {jax.__version__}, "
              f"{time.perf_counter() - start:.0f} s\n")
    print(header + text)
    for label, t in totals(rows).items():
        met = "met" if t["share"] >= TARGET_SHARE and t["correct"] else "NOT met"
        print(f"{label}: {t['share']:.1%} of {t['mib_before']:.1f} MiB beside matmuls gone "
              f"(target >= {TARGET_SHARE:.0%}, every rewrite equal: {met})")
    if args.table:
        with open(args.table, "w") as f:
            f.write(header + text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": stamp, "jax": jax.__version__, "rows": rows,
                       "totals": totals(rows)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
