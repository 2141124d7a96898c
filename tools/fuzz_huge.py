"""overlap-fuzz's generator of gathers and scatters whose dims exceed int32: hand-written
modules, rewritten and checked on the IR (never run)."""
from __future__ import annotations

import random
import traceback
import warnings
from dataclasses import dataclass

from .fuzz_common import Generator


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


def draw_huge(rng: random.Random, seed: int) -> HugeCase:
    """A huge gather or scatter (`seed` unused: every draw takes one)."""
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


GENERATOR = Generator("huge", 0.05, HugeCase, draw_huge, run=run_huge)
