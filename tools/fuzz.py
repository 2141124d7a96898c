"""Differential fuzzing: random shard_map programs, original vs rewritten, on 8 host devices.

Each case draws a mesh (1-D to 3-D, axis sizes 2 to 8, at most 8 devices, devices in
JAX's order or permuted), the axis or axes to gather/scatter over (several in either
order), which mesh axes the shard_map makes manual (all, or only some), a dot layout
(batch, contracting and free dims, each operand's dims in random order), which operand
and dim is gathered (or which result dim is scattered, or the product summed by a psum),
sizes (divisible by the group where the collective needs it, any size elsewhere), an
element type (f32, bf16, f16; f8 for gathers), what surrounds the site (CONTEXTS:
branches, loops, nested jax.jit calls, a stage under a branch), the export form (Shardy
or GSPMD), the pass options (bidirectional, unroll) and the forms (every backend's, or
the TPU forms with their summing rings, or the GPU forms: their uninitialised buffers
filled with NaN, so that an element a ring fails to write shows). The program is built with
jax.shard_map, lowered, rewritten with threshold-mib=0, and both versions run on the
same random inputs and are compared.
A few cases come from other generators: dims beyond int32 (checked on the IR),
reduce_scatters that sum in a wider type than their operand (hand-written modules,
checked against numpy), sequences of calls through overlap() with Python and JAX
scalars, static arguments and precision contexts (checked against jax.jit), and
all_to_alls beside a dot (EXCHANGES: MoE dispatch and combine, Ulysses, partial sums,
a transposed product) on random meshes, axes, sizes and types, and tensor-parallel blocks (BlockCase: psums after
row-parallel matmuls, residual adds and norms between them, in a scan or not, the
batch split over another mesh axis or not), and sites wrapped in what users write around
them (fuzz_wrapped: calls, linear ops, zero sizes, per-platform branches, two collectives
of one product, predicates from shard_map inputs). Besides a mismatch or a crash, a site
the tool reports as an internal error and a collective next to a dot with no site record
(silent) fail a case.

    python -m overlap_hlo.tools.fuzz --cases 1000 [--seed 0]
    overlap-fuzz --cases 1000

Prints how many cases were rewritten and agreed, left unchanged (and why), disagreed,
crashed, hit an internal error or left a site silent; exits 1 if any did.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass

from .cli import EXIT_FAILURE, EXIT_OK
from .fuzz_wrapped import WrappedCase, build_wrapped, draw_wrapped

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")   # host devices; no TPU backend start-up

# Around the site: nothing; the dot under a device-dependent lax.cond or in a fori_loop
# with a device-dependent trip count; an optimization_barrier between collective and
# dot; another user of the gathered tensor (or of the scattered dot); the dot in a
# nested jax.jit ("called"); the whole site in a nested jax.jit that only the devices
# of some groups run, under a lax.cond on another mesh axis ("called_under_cond"); a
# second dot in a lax.cond on a value the same on every device ("uniform_cond"); a
# scattered sum with a bias that something else reads too ("biased_read", scatter
# only). A ring must be placed where every device runs it, or the site left unchanged
# with a remark.
HUGE_SHARE = 0.05      # of the cases: dims beyond int32, checked on the IR only
PROMOTED_SHARE = 0.04  # reduce_scatters summing in a wider type (hand-written modules)
API_SHARE = 0.04       # call sequences through overlap() against jax.jit's
EXCHANGE_SHARE = 0.10  # all_to_all next to a dot (MoE dispatch and combine, Ulysses)
BLOCK_SHARE = 0.10     # tensor-parallel blocks: psum, residual, norm, next dot
WRAPPED_SHARE = 0.15   # sites wrapped in calls, linear ops, branches, platforms (fuzz_wrapped)
CONTEXTS = ("plain",) * 6 + ("cond", "device_loop", "barrier", "other_user", "called",
                             "called_under_cond", "uniform_cond")
SCATTER_CONTEXTS = CONTEXTS + ("biased_read",)
AXES = ("x", "y", "z")
MESHES = [(n,) for n in range(2, 9)] + [(2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (2, 2, 2)]
DTYPES = ("float32", "bfloat16", "float16")
GATHER_DTYPES = DTYPES + ("float8_e4m3fn",)   # XLA:CPU has no f8 reduce_scatter


@dataclass(frozen=True)
class Case:
    """Every random choice of one program; `describe()` is its reproducer."""

    mesh: tuple[int, ...]
    axes: tuple[str, ...]          # the collective's mesh axes
    kind: str                      # "gather", "scatter" or "all_reduce" (a psum)
    batch: tuple[int, ...]         # sizes of the batch dims
    contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]
    lhs_order: tuple[int, ...]     # permutation of the lhs's logical dims
    rhs_order: tuple[int, ...]
    operand: int                   # gather: which operand is gathered
    role: str                      # "batch", "contracting", "free" (of that operand / result)
    index: int                     # which dim of that role
    dtype: str
    shardy: bool
    bidirectional: bool
    unroll: int
    seed: int
    devices: tuple[int, ...] = ()  # the mesh's device order; () is JAX's own
    manual: tuple[str, ...] = ()   # shard_map's manual axes; () is every mesh axis
    context: str = "plain"         # what surrounds the site (CONTEXTS)
    target: str = ""               # the forms: "" (every backend), "tpu" (with its summing
                                   # rings) or "gpu"; their uninitialised buffers poisoned

    @property
    def group(self) -> int:
        sizes = dict(zip(AXES, self.mesh))
        return math.prod(sizes[a] for a in self.axes)

    def describe(self) -> str:
        return repr(self)


TARGETS = ("", "", "tpu", "gpu")   # shares of the forms a Case is rewritten into


def draw(rng: random.Random, seed: int) -> Case:
    """A random case (every dim the collective touches is divisible by the group)."""
    rank = rng.choice((1, 1, 2, 3))
    mesh = rng.choice([m for m in MESHES if len(m) == rank])
    names = AXES[:rank]
    axes = tuple(rng.sample(names, rng.choice((1, 1, 2)) if rank > 1 else 1))
    others = [a for a in names if a not in axes]
    manual = tuple(a for a in names if a in axes or rng.random() < 0.5) \
        if others and rng.random() < 0.3 else ()
    count = math.prod(mesh)
    devices = tuple(rng.sample(range(count), count)) if rng.random() < 0.3 else ()
    group = math.prod(dict(zip(AXES, mesh))[a] for a in axes)
    size = lambda: rng.randint(1, 6)  # noqa: E731
    batch = tuple(size() for _ in range(rng.choice((0, 0, 1))))
    contracting = tuple(size() for _ in range(rng.choice((1, 1, 2))))
    lhs_free = tuple(size() for _ in range(rng.choice((0, 1, 1, 2))))
    rhs_free = tuple(size() for _ in range(rng.choice((0, 1, 1, 2))))
    kind = rng.choice(("gather", "scatter", "scatter", "all_reduce"))
    operand = rng.randint(0, 1)
    if kind == "gather":
        own_free = lhs_free if operand == 0 else rhs_free
        roles = [("contracting", len(contracting))] + [("batch", len(batch))] * bool(batch) \
            + [("free", len(own_free))] * bool(own_free)
    else:
        roles = [("batch", len(batch))] * bool(batch) + \
            [("free", len(lhs_free) + len(rhs_free))] * bool(lhs_free or rhs_free)
        if not roles:
            lhs_free, roles = (size(),), [("free", 1)]
    role, count = rng.choice(roles)
    index = rng.randrange(count)
    # Make the touched dim divisible: a gathered dim is `group` shards of its size.
    scale = lambda dims, i: tuple(d * group if j == i else d for j, d in enumerate(dims))  # noqa: E731
    if role == "batch":
        batch = scale(batch, index)
    elif role == "contracting":
        contracting = scale(contracting, index)
    elif kind == "gather":
        if operand == 0:
            lhs_free = scale(lhs_free, index)
        else:
            rhs_free = scale(rhs_free, index)
    elif index < len(lhs_free):
        lhs_free = scale(lhs_free, index)
    else:
        rhs_free = scale(rhs_free, index - len(lhs_free))
    context = rng.choice(CONTEXTS if kind == "gather" else SCATTER_CONTEXTS)
    if context == "called_under_cond" and not others:
        context = "called"   # no other axis: a branch on the collective's own would hang
    dtype = rng.choice(GATHER_DTYPES if kind == "gather" else DTYPES)
    # axis_index in a GSPMD export is a partition_id XLA rejects: Shardy only there.
    shardy = rng.random() < 0.5 or context in ("cond", "device_loop")
    # XLA aborts the process compiling these originals when partially manual: any GSPMD
    # program, and a bf16 reduce_scatter (XLA:CPU, jax 0.10.2 and 0.12).
    partial_ok = shardy and not (kind != "gather" and dtype == "bfloat16")
    lhs_rank = len(batch) + len(contracting) + len(lhs_free)
    rhs_rank = len(batch) + len(contracting) + len(rhs_free)
    return Case(mesh, axes, kind, batch, contracting, lhs_free, rhs_free,
                tuple(rng.sample(range(lhs_rank), lhs_rank)),
                tuple(rng.sample(range(rhs_rank), rhs_rank)),
                operand, role, index, dtype, shardy,
                rng.random() < 0.5, rng.choice((1, 1, 2, 3)), seed, devices,
                manual if partial_ok and len(manual) < rank else (), context,
                rng.choice(TARGETS))


def _letters(case: Case):
    """einsum letters of each operand (in storage order) and of the result."""
    b = "ab"[:len(case.batch)]
    c = "cd"[:len(case.contracting)]
    lf, rf = "ef"[:len(case.lhs_free)], "gh"[:len(case.rhs_free)]
    lhs_logical, rhs_logical = b + c + lf, b + c + rf
    lhs = "".join(lhs_logical[i] for i in case.lhs_order)
    rhs = "".join(rhs_logical[i] for i in case.rhs_order)
    sizes = dict(zip(b + c + lf + rf, case.batch + case.contracting + case.lhs_free
                     + case.rhs_free))
    return lhs, rhs, b + lf + rf, sizes


def _touched_letter(case: Case) -> str:
    b, c = "ab"[:len(case.batch)], "cd"[:len(case.contracting)]
    if case.role == "batch":
        return b[case.index]
    if case.role == "contracting":
        return c[case.index]
    if case.kind == "gather":
        return ("ef" if case.operand == 0 else "gh")[case.index]
    free = "ef"[:len(case.lhs_free)] + "gh"[:len(case.rhs_free)]
    return free[case.index]


def build(case: Case):
    """(jitted shard_map program, inputs) for `case`."""
    if isinstance(case, ExchangeCase):
        return build_exchange(case)
    if isinstance(case, BlockCase):
        return build_block(case)
    if isinstance(case, WrappedCase):
        return build_wrapped(case)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = AXES[:len(case.mesh)]
    mesh = auto_mesh(case.mesh, case.devices)
    lhs, rhs, out, sizes = _letters(case)
    letter = _touched_letter(case)
    spec_axis = case.axes if len(case.axes) > 1 else case.axes[0]
    dtype = getattr(jnp, case.dtype)
    axis = case.axes if len(case.axes) > 1 else case.axes[0]

    def spec(letters: str, sharded: bool) -> P:
        return P(*[spec_axis if sharded and ch == letter else None for ch in letters])

    def around(product):
        """`product()` (the dot) in the case's control-flow context."""
        if case.context == "called":
            return jax.jit(lambda: product())()
        if case.context == "uniform_cond":   # a predicate from constants: every device
            inside = jax.lax.cond(jnp.int32(len(case.mesh)) > 0, lambda: product() * 2,
                                  lambda: product())
            return product() + inside
        if case.context == "cond":
            index = jax.lax.axis_index(case.axes[0])
            return jax.lax.cond(index < 1, product, lambda: jnp.zeros_like(product()))
        if case.context == "device_loop":
            trips = jax.lax.axis_index(case.axes[0]) % 2 + 1
            return jax.lax.fori_loop(0, trips, lambda i, acc: acc + product(),
                                     jnp.zeros_like(product()))
        return product()

    barrier = jax.lax.optimization_barrier if case.context == "barrier" else (lambda v: v)
    if case.kind == "gather":
        gathered = lhs if case.operand == 0 else rhs
        dim = gathered.index(letter)

        def site(a, w):
            g = barrier(jax.lax.all_gather(a if case.operand == 0 else w, axis, axis=dim,
                                           tiled=True))
            operands = (g, w) if case.operand == 0 else (a, g)
            y = around(lambda: jnp.einsum(f"{lhs},{rhs}->{out}", *operands,
                                          preferred_element_type=jnp.float32).astype(dtype))
            return (y, jnp.sum(g.astype(jnp.float32))) if case.context == "other_user" else y

        fn = under_cond(case, names, site)

        in_specs = (spec(lhs, case.operand == 0), spec(rhs, case.operand == 1))
        out_specs = (P(), P()) if case.context == "other_user" else P()
    else:
        dim = out.index(letter)

        def site(a, w):
            y = barrier(around(lambda: jnp.einsum(f"{lhs},{rhs}->{out}", a, w)))
            if case.context == "biased_read":
                y = y + jnp.asarray(1.0, y.dtype)
            scattered = (jax.lax.psum(y, axis) if case.kind == "all_reduce" else
                         jax.lax.psum_scatter(y, axis, scatter_dimension=dim, tiled=True))
            read = case.context in ("other_user", "biased_read")
            return (scattered, jnp.sum(y)) if read else scattered

        fn = under_cond(case, names, site)

        in_specs = (spec(lhs, False), spec(rhs, False))
        result = spec(out, case.kind != "all_reduce")   # a psum's result is replicated
        out_specs = ((result, P()) if case.context in ("other_user", "biased_read")
                     else result)
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=False, axis_names=set(case.manual or names)))
    rng = np.random.default_rng(case.seed)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal([sizes[ch] for ch in letters]),
                                         dtype), NamedSharding(mesh, s))
              for letters, s in ((lhs, in_specs[0]), (rhs, in_specs[1]))]
    return jitted, inputs


def auto_mesh(shape: tuple[int, ...], order: tuple[int, ...] = ()):
    """A mesh of the first prod(shape) devices (in `order` when given) over AXES. Auto
    axes: JAX 0.12 cannot lower psum_scatter in a partially manual shard_map over an
    Explicit mesh."""
    import jax
    import numpy as np

    devices = np.array(jax.devices()[:math.prod(shape)])
    if order:
        devices = devices[list(order)]
    axis_type = getattr(jax.sharding, "AxisType", None)
    names = AXES[:len(shape)]
    types = {} if axis_type is None else {"axis_types": (axis_type.Auto,) * len(names)}
    return jax.sharding.Mesh(devices.reshape(shape), names, **types)


def under_cond(case: Case, names, site):
    """`site` as it is, or, for "called_under_cond", as a nested jax.jit that only the
    devices whose index along a mesh axis the collective does not span is 0 run (a
    pipeline stage): every group takes the branch or skips it as a whole."""
    import jax
    import jax.numpy as jnp

    if case.context != "called_under_cond":
        return site
    manual = case.manual or names
    stage = next((a for a in manual if a not in case.axes), None)
    if stage is None:   # no other manual axis to branch on
        return site
    layer = jax.jit(site)

    def fn(a, w):
        shapes = jax.eval_shape(site, a, w)
        skip = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # noqa: E731
        return jax.lax.cond(jax.lax.axis_index(stage) == 0, lambda: layer(a, w), skip)

    return fn


@dataclass(frozen=True)
class HugeCase:
    """A gather or scatter whose dims exceed int32 (never run: checked on the IR)."""

    kind: str
    group: int
    rows: int            # the gathered shard's / scattered block's rows
    bidirectional: bool
    unroll: int

    def describe(self) -> str:
        return repr(self)


HUGE_MODULE = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @main(%x: tensor<{xs}x2xf32>, %w: tensor<2x2xf32>) -> tensor<{ys}x2xf32> {{
    {body}
  }}
}}"""
HUGE_GATHER = """%0 = "stablehlo.all_gather"(%x) <{{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[{ids}]> : tensor<1x{n}xi64>, use_global_device_ids}}> : (tensor<{xs}x2xf32>) -> tensor<{ys}x2xf32>
    %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<{ys}x2xf32>, tensor<2x2xf32>) -> tensor<{ys}x2xf32>
    return %1 : tensor<{ys}x2xf32>"""
HUGE_SCATTER = """%0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{xs}x2xf32>, tensor<2x2xf32>) -> tensor<{xs}x2xf32>
    %1 = "stablehlo.reduce_scatter"(%0) <{{scatter_dimension = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[{ids}]> : tensor<1x{n}xi64>, use_global_device_ids}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }}) : (tensor<{xs}x2xf32>) -> tensor<{ys}x2xf32>
    return %1 : tensor<{ys}x2xf32>"""


def draw_huge(rng: random.Random) -> HugeCase:
    return HugeCase(rng.choice(("gather", "scatter")), rng.randint(2, 8),
                    rng.randint(2 ** 27, 2 ** 33), rng.random() < 0.5, rng.choice((1, 2, 3)))


def run_huge(case: HugeCase) -> tuple[str, str]:
    """Rewrite the module and check the IR: it verifies, the collective is gone, and
    every start index of a slice along the huge dim is 64-bit."""
    from jaxlib.mlir import ir

    import overlap_hlo

    n, rows = case.group, case.rows
    xs, ys = (rows, rows * n) if case.kind == "gather" else (rows * n, rows)
    body = (HUGE_GATHER if case.kind == "gather" else HUGE_SCATTER).format(
        ids=list(range(n)), n=n, xs=xs, ys=ys)
    try:
        module = overlap_hlo.parse(HUGE_MODULE.format(n=n, xs=xs, ys=ys, body=body))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sites = overlap_hlo.rewrite_module(module, threshold_mib=0,
                                               bidirectional=case.bidirectional,
                                               unroll=case.unroll)
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    if not all(site.applied for site in sites):
        return "unchanged", "; ".join(site.reason for site in sites)
    narrow = []

    def visit(op):
        if op.name in ("stablehlo.all_gather", "stablehlo.reduce_scatter"):
            narrow.append(op.name)
        if op.name in ("stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice"):
            start = op.operands[1 if op.name == "stablehlo.dynamic_slice" else 2]
            huge = ir.RankedTensorType(op.operands[0].type).shape[0] > 2 ** 31 - 1
            if huge and ir.RankedTensorType(start.type).element_type.width < 64:
                narrow.append(f"{op.name} with a {start.type} start index")
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if narrow:
        return "mismatch", f"IR check: {sorted(set(narrow))}"
    return "rewritten", "IR only: 64-bit offsets"


def tolerance(dtype: str) -> float:
    """Largest accepted |rewritten - original| relative to the output's scale: f32 to
    rounding, narrower types four ulps (summation order and one more rounding differ)."""
    return {"float32": 1e-5, "bfloat16": 4 * 2 ** -7, "float16": 4 * 2 ** -10,
            "float8_e4m3fn": 4 * 2 ** -3}[dtype]


@dataclass(frozen=True)
class PromotedCase:
    """dot -> reduce_scatter whose region sums in f32 while the dot's product is narrower
    (XLA accepts it; JAX never writes it): a hand-written per-device module."""

    group: int
    rows: int           # the scattered block's rows
    inner: int          # the contracted size
    cols: int
    dtype: str          # the product's type: "bf16" or "f16"
    bidirectional: bool
    unroll: int
    seed: int

    def describe(self) -> str:
        return repr(self)


PROMOTED_MODULE = """module attributes {{mhlo.num_partitions = {n} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func @main(%x: tensor<{m}x{k}x{t}> {{mhlo.sharding = "{{manual}}"}}, %w: tensor<{k}x{c}x{t}> {{mhlo.sharding = "{{manual}}"}}) -> (tensor<{r}x{c}xf32> {{mhlo.sharding = "{{manual}}"}}) {{
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{m}x{k}x{t}>, tensor<{k}x{c}x{t}>) -> tensor<{m}x{c}x{t}>
    %1 = "stablehlo.reduce_scatter"(%0) <{{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = dense<[{ids}]> : tensor<1x{n}xi64>, scatter_dimension = 0 : i64, use_global_device_ids}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %2 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }}) : (tensor<{m}x{c}x{t}>) -> tensor<{r}x{c}xf32>
    return %1 : tensor<{r}x{c}xf32>
  }}
}}"""


def draw_promoted(rng: random.Random, seed: int) -> PromotedCase:
    return PromotedCase(rng.choice((2, 4, 8)), rng.randint(1, 4), rng.randint(1, 8),
                        rng.randint(1, 6), rng.choice(("bf16", "f16")), rng.random() < 0.5,
                        rng.choice((1, 2, 3)), seed)


def run_promoted(case: PromotedCase) -> tuple[str, str]:
    """The ring sums in f32 as the region says: checked against numpy's f32 sum of the
    devices' narrow products, to the narrow type's rounding (XLA:CPU runs the original
    in the narrow type, and may fold the ring's converts into its dots)."""
    import ml_dtypes
    import numpy as np

    import overlap_hlo
    from overlap_hlo.targets.cpu import run_per_device

    n, m = case.group, case.rows * case.group
    text = PROMOTED_MODULE.format(n=n, m=m, k=case.inner, c=case.cols, r=case.rows,
                                  t=case.dtype, ids=list(range(n)))
    narrow = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[case.dtype]
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((n, m, case.inner)).astype(narrow)
    w = np.repeat(rng.standard_normal((1, case.inner, case.cols)), n, axis=0).astype(narrow)
    try:
        module = overlap_hlo.parse(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sites = overlap_hlo.rewrite_module(module, threshold_mib=0,
                                               bidirectional=case.bidirectional,
                                               unroll=case.unroll)
        if not sites[0].applied:
            return "unchanged", sites[0].reason
        (got,) = run_per_device(overlap_hlo.serialize(module), 1, n, [x, w])
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    import jax

    # Each device's narrow product as XLA:CPU computes it, summed in f32 by numpy.
    products = [np.asarray(jax.jit(jax.numpy.matmul)(x[d], w[d]), np.float32) for d in range(n)]
    want = np.sum(products, axis=0).reshape(n, case.rows, case.cols)
    if got.dtype != np.float32:
        return "mismatch", f"result type {got.dtype}, not float32"
    error = _deviation([got], [want])
    # XLA may fold the convert into the dot (products not rounded to the narrow type).
    if not error <= tolerance({"bf16": "bfloat16", "f16": "float16"}[case.dtype]):
        return "mismatch", f"relative error {error:.3g} against numpy's f32 sum"
    return "rewritten", f"relative error {error:.2g}"


@dataclass(frozen=True)
class ApiCase:
    """A sequence of calls of one overlap()-wrapped jax.jit function with static
    arguments, Python and JAX scalars of several types, under matmul-precision
    contexts; every call must give jax.jit's result and dtype."""

    calls: tuple[tuple[str, float, int, str | None], ...]  # (scalar kind, value, static, precision)
    seed: int

    def describe(self) -> str:
        return repr(self)


SCALAR_KINDS = ("python", "weak", "float32", "bfloat16")


def draw_api(rng: random.Random, seed: int) -> ApiCase:
    calls = tuple((rng.choice(SCALAR_KINDS), rng.choice((0.5, 0.25, 3.0)), rng.choice((1, 2)),
                   rng.choice((None, None, "highest", "bfloat16")))
                  for _ in range(rng.randint(2, 6)))
    return ApiCase(calls, seed)


def run_api(case: ApiCase) -> tuple[str, str]:
    import contextlib

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import overlap_hlo

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("x",))

    def body(x, w, scale):
        return (jax.lax.all_gather(x, "x", axis=0, tiled=True) @ w) * scale

    layer = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P(),
                          check_vma=False)
    jitted = jax.jit(lambda x, w, scale, times: layer(x, w, scale) * times,
                     static_argnums=(3,))
    rng = np.random.default_rng(case.seed)
    x = jax.device_put(jnp.asarray(rng.standard_normal((16, 8)), jnp.bfloat16),
                       NamedSharding(mesh, P("x")))
    w = jax.device_put(jnp.asarray(rng.standard_normal((8, 4)), jnp.bfloat16),
                       NamedSharding(mesh, P()))
    make = {"python": float, "weak": jnp.asarray, "float32": jnp.float32,
            "bfloat16": jnp.bfloat16}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = overlap_hlo.overlap(jitted, threshold_mib=0)
            for kind, value, times, precision in case.calls:
                scalar = make[kind](value)
                context = (jax.default_matmul_precision(precision) if precision
                           else contextlib.nullcontext())
                with context:
                    got, want = step(x, w, scalar, times), jitted(x, w, scalar, times)
                if got.dtype != want.dtype:
                    return "mismatch", f"dtype {got.dtype}, jax.jit gives {want.dtype}"
                error = _deviation([np.asarray(got, np.float64)],
                                   [np.asarray(want, np.float64)])
                # bf16 dots: XLA may keep a product unrounded in one and not the other.
                if not error <= tolerance("bfloat16"):
                    return "mismatch", f"relative error {error:.3g} ({kind} {value})"
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    return "rewritten", (f"{len(case.calls)} calls, {len(step._compiled)} executables "
                         f"(jax.jit: {jitted._cache_size()})")


def run(case: Case | HugeCase) -> tuple[str, str]:
    """(outcome, detail): outcome is "rewritten", "unchanged", "mismatch", "crash", or
    "not generated" / "original fails" when JAX or XLA rejects the original program."""
    import jax

    if isinstance(case, HugeCase):
        return run_huge(case)
    if isinstance(case, PromotedCase):
        return run_promoted(case)
    if isinstance(case, ApiCase):
        return run_api(case)

    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", case.shardy)
    try:
        return _run(case)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def _run(case: Case) -> tuple[str, str]:
    import overlap_hlo
    from overlap_hlo.targets.cpu import rewrite_runnable

    try:
        jitted, inputs = build(case)
        lowered = jitted.lower(*inputs)
    except Exception as err:   # the generator made a program JAX rejects
        return "not generated", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    if getattr(case, "platforms", ()):
        return _run_exported(case, jitted, inputs)
    try:
        want = _leaves(lowered.compile()(*inputs))
    except Exception as err:   # e.g. XLA:CPU has no bf16 x bf16 -> f32 dot for some shapes
        return "original fails", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    options = dict(threshold_mib=0, bidirectional=case.bidirectional, unroll=case.unroll)
    if case.target:   # half the TPU cases (odd seeds) put a summing ring's own shard last
        options.update(target=case.target, tpu_summing_rings=case.target == "tpu",
                       own_shard_last=case.target == "tpu" and case.seed % 2 == 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # sites left unchanged are counted below
            if case.target:   # buffers left uninitialised there: NaN here
                sites, _, rewritten = rewrite_runnable(lowered, **options)
            else:
                sites = overlap_hlo.remarks(lowered.as_text(), **options)
                rewritten = overlap_hlo.rewrite_lowered(lowered, **options)
        got = _leaves(rewritten.compile()(*inputs))
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    reference = (lambda: _in_f32(jitted, inputs)) if case.dtype != "float32" else None
    return _outcome(lowered.as_text(), sites, got, want, case.dtype, reference)


def _outcome(text: str, sites, got, want, dtype: str, reference) -> tuple[str, str]:
    """The verdict on one rewritten program: a mismatch, a site the tool failed on
    ("internal error"), a collective next to a dot with no record ("silent"), else
    rewritten or unchanged."""
    agrees, error = judge(got, want, dtype, reference)
    if not agrees:
        return "mismatch", error
    internal = [site for site in sites if site.kind == "internal error"]
    if internal:
        return "internal error", internal[0].format()
    silent = silent_sites(text, sites)
    if silent:
        return "silent", f"no record for the collective at {silent[0]}"
    if not any(site.applied for site in sites):
        reasons = "; ".join(sorted({site.reason for site in sites})) or "no candidate site"
        return "unchanged", reasons
    return "rewritten", error


def silent_sites(text: str, sites) -> list[str]:
    """The collectives of `text` next to a dot that no site record names."""
    import overlap_hlo
    from overlap_hlo.ir.normalize import normalize
    from overlap_hlo.rewrite.coverage import candidates, unreported

    module = overlap_hlo.parse(text)
    with module.context:
        normalize(module.operation)
        return [str(c.where) for c in unreported(candidates(module.operation), sites)]


def _run_exported(case, jitted, inputs) -> tuple[str, str]:
    """A multi-platform export (case.platforms), rewritten with rewrite_exported and
    called on the CPU against the original export."""
    import jax
    from jax import export

    import overlap_hlo

    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in inputs]
    try:
        exported = export.export(jitted, platforms=case.platforms)(*shapes)
        want = _leaves(exported.call(*inputs))
    except Exception as err:
        return "original fails", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    options = dict(threshold_mib=0, bidirectional=case.bidirectional, unroll=case.unroll)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = exported.mlir_module()
            sites = overlap_hlo.remarks(text, **options)
            got = _leaves(overlap_hlo.rewrite_exported(exported, **options).call(*inputs))
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    return _outcome(text, sites, got, want, case.dtype, None)


def judge(got: list, want: list, dtype: str, reference=None) -> tuple[bool, str]:
    """Whether the rewritten outputs `got` agree with the original's `want`, and the
    error. Within `tolerance(dtype)` of the original's scale; failing that, for narrow
    types, against `reference()` (the program run in f32 on the same inputs): a ring
    sums in another order and rounds after each add, and an ill-conditioned op amplifies
    that (a layer norm over two features, bf16: the original 0.079 off the f32 result,
    two streams 0.26), so the rewrite may be off by four times what the original is,
    plus the tolerance; a wrong block is off by O(1)."""
    error = _deviation(got, want)
    if error <= tolerance(dtype):
        return True, f"relative error {error:.2g}"
    expected = reference() if reference is not None else None
    if expected is None:
        return False, f"relative error {error:.3g}"
    off, original_off = _deviation(got, expected), _deviation(want, expected)
    detail = (f"relative error {error:.3g} (against f32: rewritten {off:.3g}, original "
              f"{original_off:.3g})")
    return off <= 4 * original_off + tolerance(dtype), detail


def _deviation(got: list, want: list) -> float:
    """Largest |got - want| over the leaves, relative to each leaf's scale."""
    import numpy as np

    error = 0.0
    for g, w in zip(got, want):
        if w.size:
            scale = max(1.0, float(np.max(np.abs(w))))
            error = max(error, float(np.max(np.abs(g - w))) / scale)
    return error


def _in_f32(jitted, inputs) -> list | None:
    """The program's outputs with its floating inputs cast to f32 (None where it does
    not trace so)."""
    import jax.numpy as jnp

    try:
        return _leaves(jitted(*[x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating)
                                else x for x in inputs]))
    except Exception:
        return None


def _leaves(result):
    import jax
    import numpy as np

    return [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(result)]


def draw_any(rng: random.Random, seed: int):
    """One case of any generator, in the shares above."""
    pick, bound = rng.random(), 0.0
    for share, generator in ((HUGE_SHARE, lambda: draw_huge(rng)),
                             (PROMOTED_SHARE, lambda: draw_promoted(rng, seed)),
                             (API_SHARE, lambda: draw_api(rng, seed)),
                             (EXCHANGE_SHARE, lambda: draw_exchange(rng, seed)),
                             (BLOCK_SHARE, lambda: draw_block(rng, seed)),
                             (WRAPPED_SHARE, lambda: draw_wrapped(rng, seed))):
        bound += share
        if pick < bound:
            return generator()
    return draw(rng, seed=seed)


@dataclass(frozen=True)
class ExchangeCase:
    """An all_to_all beside a dot, from one of EXCHANGES (sizes a, b, c, d per device
    and group, the exchanged dims multiples of the group)."""

    mesh: tuple[int, ...]
    axis: str
    template: str
    sizes: tuple[int, int, int, int]
    dtype: str
    shardy: bool
    seed: int
    bidirectional: bool = False    # not used by the exchange, passed as pass options
    unroll: int = 1
    target: str = ""               # the forms every backend runs

    def describe(self) -> str:
        return repr(self)


# template -> (einsum, all_to_all before ("in") or after ("out") it, split, concat,
#              operand shapes as functions of (g, a, b, c, d), their sharded dims, out spec)
EXCHANGES = {
    "dispatch": ("ecm,emh->ech", "in", 0, 1,
                 lambda g, a, b, c, d: ((g * a, b, c), (g * a, c, d)), (None, 0), (0,)),
    "ulysses": ("shd,hdf->shf", "in", 1, 0,
                lambda g, a, b, c, d: ((g * a, g * b, c), (g * b, c, d)), (0, 0), (1,)),
    "combine": ("eck,ekm->ecm", "out", 1, 0,
                lambda g, a, b, c, d: ((g * a, g * b, c), (g * a, c, d)), (0, 0), (1,)),
    # the concat dim contracted (partial sums of chunk products)
    "values": ("ekc,kd->ecd", "in", 0, 1,
               lambda g, a, b, c, d: ((g * a, b, c), (g * b, d)), (None, None), (0,)),
    # the dot's result transposed, then exchanged (Ulysses' attention output)
    "attention-out": ("hqd,de->qhe", "out", 0, 1,
                      lambda g, a, b, c, d: ((b, g * a, c), (c, d)), (None, None), (0,)),
}


def draw_exchange(rng: random.Random, seed: int) -> ExchangeCase:
    mesh = rng.choice(MESHES)
    return ExchangeCase(mesh, rng.choice(AXES[:len(mesh)]), rng.choice(sorted(EXCHANGES)),
                        tuple(rng.randint(1, 4) for _ in range(4)),
                        rng.choice(DTYPES), rng.random() < 0.5, seed)


def build_exchange(case: ExchangeCase):
    """(jitted shard_map program, inputs) for an ExchangeCase."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = AXES[:len(case.mesh)]
    mesh = auto_mesh(case.mesh)
    g = dict(zip(names, case.mesh))[case.axis]
    einsum, where, split, concat, shapes, sharded, out_dims = EXCHANGES[case.template]
    dtype = getattr(jnp, case.dtype)

    def spec(rank, dim):
        return P(*[case.axis if d == dim else None for d in range(rank)])

    def fn(x, w):
        if where == "in":
            x = jax.lax.all_to_all(x, case.axis, split, concat, tiled=True)
        y = jnp.einsum(einsum, x, w)
        return jax.lax.all_to_all(y, case.axis, split, concat, tiled=True) \
            if where == "out" else y

    global_shapes = shapes(g, *case.sizes)
    in_specs = tuple(spec(len(shape), dim) for shape, dim in zip(global_shapes, sharded))
    out_specs = spec(3, out_dims[0])
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=False))
    rng = np.random.default_rng(case.seed)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal(shape), dtype),
                             NamedSharding(mesh, s))
              for shape, s in zip(global_shapes, in_specs)]
    return jitted, inputs


@dataclass(frozen=True)
class BlockCase:
    """`layers` Megatron MLP sublayers, x + psum(act(norm(x) @ w1) @ w2), over mesh axis
    `axis` (the batch split over `batch_axis` when there is one), in a scan or not,
    manual over every mesh axis or (`partial`) over `axis` only."""

    mesh: tuple[int, ...]
    axis: str
    batch_axis: str | None
    layers: int
    norm: str                      # "rms", "layer" or "none"
    activation: str                # "gelu", "silu" or "relu"
    sizes: tuple[int, int, int, int]   # batch, rows per device, model, hidden per device
    scanned: bool
    dtype: str
    shardy: bool
    seed: int
    bidirectional: bool = False
    unroll: int = 1
    partial: bool = False          # shard_map manual over `axis` only (the others auto)
    target: str = ""               # the forms every backend runs

    def describe(self) -> str:
        return repr(self)


def draw_block(rng: random.Random, seed: int) -> BlockCase:
    mesh = rng.choice(MESHES)
    names = AXES[:len(mesh)]
    axis = rng.choice(names)
    others = [a for a in names if a != axis]
    dtype = rng.choice(("float32", "float32", "bfloat16"))
    # Partially manual: Shardy and f32 only (XLA:CPU aborts on some such originals).
    partial = bool(others) and dtype == "float32" and rng.random() < 0.3
    return BlockCase(mesh, axis, None if partial or not others or rng.random() < 0.5
                     else rng.choice(others),
                     rng.randint(1, 3), rng.choice(("rms", "layer", "none")),
                     rng.choice(("gelu", "silu", "relu")),
                     tuple(rng.randint(1, 4) for _ in range(4)), rng.random() < 0.3,
                     dtype, partial or rng.random() < 0.5, seed,
                     rng.random() < 0.5, rng.choice((1, 1, 2)), partial)


def build_block(case: BlockCase):
    """(jitted shard_map program, inputs) for a BlockCase."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = AXES[:len(case.mesh)]
    mesh = auto_mesh(case.mesh)
    sizes = dict(zip(names, case.mesh))
    g, b = sizes[case.axis], sizes.get(case.batch_axis, 1)
    batch, rows, model, hidden = case.sizes
    act = {"gelu": jax.nn.gelu, "silu": jax.nn.silu, "relu": jax.nn.relu}[case.activation]

    def norm(h):
        if case.norm == "none":
            return h
        if case.norm == "layer":
            h = h - h.mean(-1, keepdims=True)
        return h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5)

    def sublayer(x, w1, w2):
        return x + jax.lax.psum(act(norm(x) @ w1) @ w2, case.axis)

    def fn(x, w1, w2):
        if case.scanned:
            return jax.lax.scan(lambda h, ws: (sublayer(h, *ws), None), x, (w1, w2))[0]
        for i in range(case.layers):
            x = sublayer(x, w1[i], w2[i])
        return x

    shapes = [(b * batch, g * rows, model), (case.layers, model, g * hidden),
              (case.layers, g * hidden, model)]
    in_specs = (P(case.batch_axis), P(None, None, case.axis), P(None, case.axis))
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                                   out_specs=P(case.batch_axis), check_vma=False,
                                   axis_names={case.axis} if case.partial else set(names)))
    rng = np.random.default_rng(case.seed)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal(shape) / math.sqrt(shape[-1]),
                                         getattr(jnp, case.dtype)), NamedSharding(mesh, s))
              for shape, s in zip(shapes, in_specs)]
    return jitted, inputs


FAILURES = ("mismatch", "crash", "internal error", "silent")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print every case")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    outcomes: Counter = Counter()
    reasons: Counter = Counter()
    failures = []
    start = time.perf_counter()
    for i in range(args.cases):
        seed = args.seed * 1_000_003 + i
        case = draw_any(rng, seed)
        if args.verbose:   # before running: XLA may abort the process
            print(f"case {i}: {case.describe()}", flush=True)
        outcome, detail = run(case)
        outcomes[outcome] += 1
        if outcome in ("unchanged", "not generated", "original fails"):
            reasons[f"{outcome}: {detail}"] += 1
        if outcome in FAILURES:
            failures.append((case, detail))
            print(f"FAILED case {i}: {outcome}: {detail}\n  {case.describe()}", flush=True)
        elif args.verbose:
            print(f"  -> {outcome}: {detail}", flush=True)
    elapsed = time.perf_counter() - start
    passed = outcomes["rewritten"] + outcomes["unchanged"]
    print(f"{args.cases} cases in {elapsed:.0f} s (seed {args.seed}): "
          f"{outcomes['rewritten']} rewritten and agreed, {outcomes['unchanged']} left "
          f"unchanged, {outcomes['mismatch']} mismatched, {outcomes['crash']} crashed, "
          f"{outcomes['internal error']} internal errors, {outcomes['silent']} silent sites, "
          f"{outcomes['not generated']} not generated, {outcomes['original fails']} whose "
          "original program XLA could not run")
    for reason, count in reasons.most_common():
        print(f"  {count:5d}  {reason}")
    print(f"{passed} passed, {len(failures)} failed")
    return EXIT_FAILURE if failures else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
