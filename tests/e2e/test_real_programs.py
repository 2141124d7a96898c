"""The re-created real programs of benchmarks/real_programs.py: every rewrite computes
what the original does, and every collective still beside a matmul afterwards is
explained (a site left unchanged with a remark, or the all_gather half of an all_reduce
whose reduce half became a ring)."""
import re

import pytest

from benchmarks import real_programs as rp

OPTION_SETS = {"defaults": {}, "bidirectional, unroll=2": {"bidirectional": True, "unroll": 2}}
# Programs whose collectives beside matmuls all go (the all_gather half of an
# all_reduce aside), under both option sets.
ALL_GONE = {"sequence-parallel-mlp", "scanned-layers-grad", "fsdp-grad", "moe", "int8-mlp"}


def _line_col(text: str) -> tuple[int, int]:
    line, col = re.search(r":(\d+):(\d+)", text).groups()
    return int(line), int(col)


@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("program", rp.PROGRAMS, ids=lambda p: p.name)
def test_real_program(program, options):
    out = rp.run(program, OPTION_SETS[options])
    assert out.max_error <= program.tolerance, out.max_error
    assert out.before, "the program has collectives beside matmuls"
    remarked = {_line_col(r) for r in out.remarks}
    rings = {_line_col(loc) for loc in out.applied_all_reduces}
    for left in out.after:
        where = _line_col(left.location)
        gather_half = left.name == "stablehlo.all_gather" and where in rings
        assert gather_half or where in remarked, (left, out.remarks)
    if program.name in ALL_GONE:
        assert all(c.name == "stablehlo.all_gather" and _line_col(c.location) in rings
                   for c in out.after), out.after


def test_moved_bytes_count_an_all_reduce_twice():
    program = next(p for p in rp.PROGRAMS if p.name == "megatron-mlp")
    out = rp.run(program, {})
    (reduce,) = out.before
    (gather,) = out.after    # the gather half the ring leaves
    assert reduce.name == "stablehlo.all_reduce" and gather.name == "stablehlo.all_gather"
    assert reduce.bytes == 2 * gather.bytes and out.share == pytest.approx(0.5)
