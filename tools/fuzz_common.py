"""What overlap-fuzz's generators share: the record each declares (`Generator`), the
mesh axes and shapes they draw from, the element types, a mesh over the host devices, and
the comparison of a rewritten program's outputs with the original's (`judge`, within
`tolerance`)."""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

AXES = ("x", "y", "z")
MESHES = [(n,) for n in range(2, 9)] + [(2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (2, 2, 2)]
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Generator:
    """One generator, as its module declares it (GENERATOR) and tools/fuzz.py's
    GENERATORS lists it: its name (in the summary), its share of the cases (None for the
    fallback, fuzz_sites, which takes what the others leave), the class of its cases,
    `draw(rng, seed)`, and either `build(case)` -> (jitted shard_map program, inputs),
    which overlap-fuzz rewrites, runs and compares, or `run(case)` -> (outcome, detail)
    for a case that checks itself."""
    name: str
    share: float | None
    case: type
    draw: Callable[[random.Random, int], object]
    build: Callable | None = None
    run: Callable[[object], tuple[str, str]] | None = None

    def __post_init__(self):
        if (self.build is None) == (self.run is None):
            raise TypeError(f"generator {self.name}: build or run, exactly one")


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


def tolerance(dtype: str) -> float:
    """Largest accepted |rewritten - original| relative to the output's scale: f32 to
    rounding, narrower types four ulps (summation order and one more rounding differ)."""
    return {"float32": 1e-5, "bfloat16": 4 * 2 ** -7, "float16": 4 * 2 ** -10,
            "float8_e4m3fn": 4 * 2 ** -3}[dtype]


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
