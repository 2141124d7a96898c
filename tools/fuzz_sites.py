"""overlap-fuzz's main generator: one all_gather, reduce_scatter or psum beside a dot in
a random shard_map program (`Case`, drawn by `draw`, built by `build_site`)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .fuzz_common import AXES, DTYPES, MESHES, Generator, auto_mesh

# Around the site: nothing; the dot under a device-dependent lax.cond or in a fori_loop
# with a device-dependent trip count; an optimization_barrier between collective and
# dot; another user of the gathered tensor (or of the scattered dot); the dot in a
# nested jax.jit ("called"); the whole site in a nested jax.jit that only the devices
# of some groups run, under a lax.cond on another mesh axis ("called_under_cond"); a
# second dot in a lax.cond on a value the same on every device ("uniform_cond"); a
# scattered sum with a bias that something else reads too ("biased_read", scatter
# only). A ring must be placed where every device runs it, or the site left unchanged
# with a remark.
CONTEXTS = ("plain",) * 6 + ("cond", "device_loop", "barrier", "other_user", "called",
                             "called_under_cond", "uniform_cond")
SCATTER_CONTEXTS = CONTEXTS + ("biased_read",)
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
    batch, contracting, lhs_free, rhs_free = _divisible(
        (batch, contracting, lhs_free, rhs_free), kind, operand, role, index, group)
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


def _divisible(dims, kind: str, operand: int, role: str, index: int, group: int):
    """(batch, contracting, lhs_free, rhs_free) `dims` with the touched dim made divisible:
    a gathered dim is `group` shards of its size."""
    batch, contracting, lhs_free, rhs_free = dims

    def scale(sizes, i):
        return tuple(d * group if j == i else d for j, d in enumerate(sizes))

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
    return batch, contracting, lhs_free, rhs_free


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


def build_site(case: Case):
    """(jitted shard_map program, inputs) for a Case."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    names = AXES[:len(case.mesh)]
    mesh = auto_mesh(case.mesh, case.devices)
    lhs, rhs, out, sizes = _letters(case)
    make = _gather_site if case.kind == "gather" else _scatter_site
    site, in_specs, out_specs = make(case, lhs, rhs, out)
    fn = under_cond(case, names, site)
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=False, axis_names=set(case.manual or names)))
    rng = np.random.default_rng(case.seed)
    dtype = getattr(jnp, case.dtype)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal([sizes[ch] for ch in letters]),
                                         dtype), NamedSharding(mesh, s))
              for letters, s in ((lhs, in_specs[0]), (rhs, in_specs[1]))]
    return jitted, inputs


def _gather_site(case: Case, lhs: str, rhs: str, out: str):
    """(site, in_specs, out_specs): the dot of an all_gathered operand."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    axis, dtype, barrier = _axis(case), getattr(jnp, case.dtype), _barrier(case)
    dim = (lhs if case.operand == 0 else rhs).index(_touched_letter(case))

    def site(a, w):
        g = barrier(jax.lax.all_gather(a if case.operand == 0 else w, axis, axis=dim,
                                       tiled=True))
        operands = (g, w) if case.operand == 0 else (a, g)
        y = _around(case, lambda: jnp.einsum(f"{lhs},{rhs}->{out}", *operands,
                                             preferred_element_type=jnp.float32).astype(dtype))
        return (y, jnp.sum(g.astype(jnp.float32))) if case.context == "other_user" else y

    in_specs = (_spec(case, lhs, case.operand == 0), _spec(case, rhs, case.operand == 1))
    return site, in_specs, (P(), P()) if case.context == "other_user" else P()


def _scatter_site(case: Case, lhs: str, rhs: str, out: str):
    """(site, in_specs, out_specs): a psum_scatter (or a psum) of the dot."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    axis, barrier = _axis(case), _barrier(case)
    dim = out.index(_touched_letter(case))
    read = case.context in ("other_user", "biased_read")

    def site(a, w):
        y = barrier(_around(case, lambda: jnp.einsum(f"{lhs},{rhs}->{out}", a, w)))
        if case.context == "biased_read":
            y = y + jnp.asarray(1.0, y.dtype)
        scattered = (jax.lax.psum(y, axis) if case.kind == "all_reduce" else
                     jax.lax.psum_scatter(y, axis, scatter_dimension=dim, tiled=True))
        return (scattered, jnp.sum(y)) if read else scattered

    in_specs = (_spec(case, lhs, False), _spec(case, rhs, False))
    result = _spec(case, out, case.kind != "all_reduce")   # a psum's result is replicated
    return site, in_specs, (result, P()) if read else result


def _axis(case: Case):
    """The collective's mesh axis, or its tuple of axes."""
    return case.axes if len(case.axes) > 1 else case.axes[0]


def _spec(case: Case, letters: str, sharded: bool):
    """The PartitionSpec of dims `letters`: the touched one split over the collective's
    axes when `sharded`."""
    from jax.sharding import PartitionSpec as P

    letter = _touched_letter(case)
    return P(*[_axis(case) if sharded and ch == letter else None for ch in letters])


def _barrier(case: Case):
    """An optimization_barrier between collective and dot ("barrier"), else identity."""
    import jax

    return jax.lax.optimization_barrier if case.context == "barrier" else (lambda v: v)


def _around(case: Case, product):
    """`product()` (the dot) in the case's control-flow context."""
    import jax
    import jax.numpy as jnp

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


GENERATOR = Generator("sites", None, Case, draw, build=build_site)
