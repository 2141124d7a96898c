"""Differential harness: run a shard_map program before and after the rewrite.

`check(program)` lowers the jitted program (Shardy or GSPMD export form), rewrites a
copy with overlap_hlo, compiles both, runs them on the 8 host CPU devices with the
same random inputs and compares. It also checks the structure that makes the rewrite
worth having: the expected collectives are gone and collective_permute loops exist.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import overlap_hlo
from jaxlib.mlir import ir
# tests import run_spmd_module from here
from overlap_hlo.targets.cpu import run_per_device as run_spmd_module  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent   # the repository
DATA = ROOT / "tests" / "data"


# One all_gather -> dot and one dot -> reduce_scatter over a single group {group} of
# {n} partitions, shard 2 rows ({full} gathered); {handle} is the channel handle.
GATHER_MODULE = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<{full}x8xf32> {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = {handle}, type = 1>, replica_groups = dense<[{group}]> : tensor<1x{n}xi64>, use_global_device_ids}}> : (tensor<2x16xf32>) -> tensor<{full}x16xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{full}x16xf32>, tensor<16x8xf32>) -> tensor<{full}x8xf32>
    return %1 : tensor<{full}x8xf32>
  }}
}}"""

# An all_gather along the dot's contracting dim: a ring that sums its products. {manual}
# is empty, or MANUAL to compile it as the per-device program (run_spmd_module).
SUMMING_GATHER_MODULE = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @main(%x: tensor<16x2xf32>{manual}, %w: tensor<{full}x8xf32>{manual}) -> (tensor<16x8xf32>{manual}) {{
    %0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = {handle}, type = 1>, replica_groups = dense<[{group}]> : tensor<1x{n}xi64>, use_global_device_ids}}> : (tensor<16x2xf32>) -> tensor<16x{full}xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<16x{full}xf32>, tensor<{full}x8xf32>) -> tensor<16x8xf32>
    return %1 : tensor<16x8xf32>
  }}
}}"""

MANUAL = ' {mhlo.sharding = "{manual}"}'

SCATTER_MODULE = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @f(%x: tensor<{full}x16xf32>, %w: tensor<16x8xf32>) -> tensor<2x8xf32> {{
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{full}x16xf32>, tensor<16x8xf32>) -> tensor<{full}x8xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{{channel_handle = #stablehlo.channel_handle<handle = {handle}, type = 1>, replica_groups = dense<[{group}]> : tensor<1x{n}xi64>, scatter_dimension = 0 : i64, use_global_device_ids}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }}) : (tensor<{full}x8xf32>) -> tensor<2x8xf32>
    return %1 : tensor<2x8xf32>
  }}
}}"""


@dataclass
class Program:
    """A function over a mesh, its inputs (shape, PartitionSpec) and output specs."""

    fn: object
    mesh_shape: tuple[int, ...]
    axes: tuple[str, ...]
    inputs: list[tuple]           # (shape, PartitionSpec[, dtype])
    out_specs: object
    dtype: object = jnp.float32
    shard_mapped: bool = True
    manual_axes: frozenset | None = None  # shard_map axis_names; None: all mesh axes
    devices: tuple[int, ...] | None = None  # device order of the mesh; None: jax's own

    def mesh(self):
        """The mesh, its axes Auto: JAX 0.12 cannot lower psum_scatter in a partially
        manual shard_map over an Explicit mesh, and 0.10.2 has Auto as its default."""
        if self.devices is None:
            return jax.make_mesh(self.mesh_shape, self.axes, **auto_axis_types(len(self.axes)))
        devices = np.array(jax.devices())[list(self.devices)].reshape(self.mesh_shape)
        return jax.sharding.Mesh(devices, self.axes, **auto_axis_types(len(self.axes)))

    def jitted(self):
        mesh = self.mesh()
        fn = self.fn
        if self.shard_mapped:
            fn = jax.shard_map(fn, mesh=mesh, in_specs=tuple(spec for _, spec, *_ in self.inputs),
                               out_specs=self.out_specs, check_vma=False,
                               axis_names=self.manual_axes or set(self.axes))
        return jax.jit(fn)

    def args(self, seed: int = 0):
        mesh = self.mesh()
        rng = np.random.default_rng(seed)
        arrays = []
        for shape, spec, *dtype in self.inputs:   # an input may name its own dtype
            dtype = dtype[0] if dtype else self.dtype
            values = (rng.integers(-100, 100, shape) if jnp.issubdtype(dtype, jnp.integer)
                      else rng.standard_normal(shape))
            arrays.append(jax.device_put(jnp.asarray(values, dtype), NamedSharding(mesh, spec)))
        return arrays


def auto_axis_types(count: int) -> dict:
    axis_type = getattr(jax.sharding, "AxisType", None)
    return {} if axis_type is None else {"axis_types": (axis_type.Auto,) * count}


@contextlib.contextmanager
def partitioner(shardy: bool):
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def ops_named(module: ir.Module, *names: str) -> list[ir.Operation]:
    """Every op of `module` with one of `names`, in walk order."""
    found = []

    def visit(op):
        if op.name in names:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def require_libtpu() -> None:
    """Skip the calling test module unless libtpu is installed (privately, python -m
    overlap_hlo.targets.tpu_plugin install, or where JAX finds it), and let its compiles
    run beside another process that holds libtpu's lock file."""
    import os

    import pytest

    from overlap_hlo.targets import tpu_plugin

    if not tpu_plugin.available():
        pytest.skip("libtpu is not installed (python -m overlap_hlo.targets.tpu_plugin "
                    "install): no TPU compiler", allow_module_level=True)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def update_shapes(analysis) -> Counter:
    """(result dims, update dims) of every dynamic-update-slice in a compiled module's
    analysis (report.analyze_compiled), fused ones included."""
    proto = analysis.proto
    return Counter((i.shape.dims, proto.by_id[i.operand_ids[1]].shape.dims)
                   for i in proto.by_id.values() if i.opcode == "dynamic-update-slice")


def op_counts(module: ir.Module) -> Counter:
    counts = Counter()

    def visit(op):
        counts[op.name] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return counts


def mesh_axes_forms(text: str) -> list[bool]:
    """Per all_gather / reduce_scatter of `text`: are its groups given as mesh axes?"""
    from overlap_hlo.groups.meshes import is_mesh_axes

    found = []

    def visit(op):
        if op.name in ("stablehlo.all_gather", "stablehlo.reduce_scatter"):
            found.append(is_mesh_axes(op.attributes["replica_groups"]))
        return ir.WalkResult.ADVANCE

    overlap_hlo.parse(text).operation.walk(visit)
    return found


def permutes(module: ir.Module) -> list[tuple[int | None, tuple]]:
    """(channel handle, source-target pairs) of every collective_permute."""
    from jaxlib.mlir.dialects import stablehlo

    found = []

    def visit(op):
        if op.name == "stablehlo.collective_permute":
            attrs = op.attributes
            handle = (stablehlo.ChannelHandle(attrs["channel_handle"]).handle
                      if "channel_handle" in attrs else None)
            pairs = tuple(map(tuple, np.array(attrs["source_target_pairs"]).tolist()))
            found.append((handle, pairs))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def one_error_line(stderr: bytes | str) -> str:
    """A tool's stderr: exactly one line and no traceback; that line."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]



def ring_pipeline(bidirectional: bool | None = None, unroll: int | None = None,
                  more: str = "") -> str:
    """The gather and scatter passes then canonicalize and cse, each pass with
    `bidirectional` and `more` (pipeline options), `unroll` on the gather pass (whose
    option it is) only."""
    shared = " ".join(filter(None, [
        None if bidirectional is None else f"bidirectional={str(bidirectional).lower()}",
        more]))
    gather = " ".join(filter(None, [shared, None if unroll is None else f"unroll={unroll}"]))
    return (f"builtin.module(overlap-all-gather-matmul{{{gather}}},"
            f"overlap-matmul-reduce-scatter{{{shared}}},canonicalize,cse)")

def assert_close(got, want, dtypes) -> None:
    """fp32 to rounding (a sum in another order: 64 ulps of the output's scale, as a
    scanned gradient under jax 0.12 needed, its f64 error the original's); narrower
    types to a few ulps of the output's scale."""
    eps = max(float(jnp.finfo(d).eps) if jnp.issubdtype(d, jnp.floating) else 0.0
              for d in dtypes)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    if eps <= float(jnp.finfo(jnp.float32).eps):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=8e-6 * scale)
    else:
        np.testing.assert_allclose(got, want, rtol=4 * eps, atol=4 * eps * scale)


def check(program: Program, *, shardy: bool = True, rewritten: int = 1,
          left: Counter | None = None, pipeline: str = overlap_hlo.DEFAULT_PIPELINE):
    """Rewrite `program`, compare numerics, and return the rewritten op counts.

    `rewritten` is how many sites must be rewritten; `left` maps op names to how
    many of them must remain (all_gather / reduce_scatter not rewritten).
    """
    with partitioner(shardy):
        lowered = program.jitted().lower(*program.args())
        before = lowered.as_text()
        new = overlap_hlo.rewrite_lowered(lowered, pipeline, threshold_mib=0)
        assert lowered.as_text() == before, "the rewrite mutated JAX's cached module"
        module = new.compiler_ir("stablehlo")
        counts = op_counts(module)
        sites = overlap_hlo.rewrite_module(overlap_hlo.parse(before), pipeline,
                                           threshold_mib=0)
        applied = [s for s in sites if s.applied]
        assert len(applied) == rewritten, [s.format() for s in sites]
        assert counts["stablehlo.collective_permute"] >= rewritten
        handles = [h for h, _ in permutes(module) if h is not None]
        assert len(handles) == len(set(handles)), "channel handles must stay unique"
        for name, expected in (left or Counter()).items():
            assert counts[name] == expected, (name, counts)
        if left is None:
            assert counts["stablehlo.all_gather"] == 0, counts
            assert counts["stablehlo.reduce_scatter"] == 0, counts
        reference, candidate = lowered.compile(), new.compile()
        for seed in (0, 1):
            args = program.args(seed)
            want = jax.tree.leaves(reference(*args))
            got = jax.tree.leaves(candidate(*args))
            for w, g in zip(want, got):
                assert_close(g, w, (program.dtype, w.dtype))
    return counts


def gathered_dot(mesh, seed: int = 0):
    """(jitted all_gather(x, "x", rows) @ w over `mesh`, x, w): f32 (64, 32) @ (32, 16)."""
    def body(x, w):
        return jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(),
                               check_vma=False))
    rng = np.random.default_rng(seed)
    x = jax.device_put(jnp.asarray(rng.standard_normal((64, 32)), jnp.float32),
                       NamedSharding(mesh, P("x")))
    w = jax.device_put(jnp.asarray(rng.standard_normal((32, 16)), jnp.float32),
                       NamedSharding(mesh, P()))
    return fn, x, w


def permute_count(pass_module, n: int, options, **plan) -> int:
    """How many collective_permute ops a pass module's `emit_loop` builds for one ring of
    a group of `n` with these options (each needs a channel handle)."""
    return pass_module.plan_of(n, options, **plan).permutes
