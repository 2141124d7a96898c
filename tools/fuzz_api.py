"""overlap-fuzz's generator of call sequences through overlap(): Python and JAX scalars,
static arguments and matmul-precision contexts, checked against jax.jit."""
from __future__ import annotations

import random
import traceback
import warnings
from dataclasses import dataclass

from .fuzz_common import Generator, _deviation, tolerance


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


GENERATOR = Generator("api", 0.04, ApiCase, draw_api, run=run_api)
