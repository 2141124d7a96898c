"""overlap-fuzz's generator of reduce_scatters that sum in a wider type than their
operand: hand-written per-device modules, checked against numpy's f32 sum."""
from __future__ import annotations

import random
import traceback
import warnings
from dataclasses import dataclass

from .fuzz_common import Generator, _deviation, tolerance


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


GENERATOR = Generator("promoted", 0.04, PromotedCase, draw_promoted,
                      run=run_promoted)
