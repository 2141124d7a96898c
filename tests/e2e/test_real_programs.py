"""The re-created real programs of benchmarks/real_programs.py: every rewrite computes
what the original does, and every collective still beside a matmul afterwards is
explained: a site left unchanged with a remark, or the half of a split all_reduce that
has no dot to overlap (the all_gather after a dot's reduce ring, the reduce_scatter
before the ring of the dots that read it)."""
import re

import pytest

from benchmarks import real_programs as rp

OPTION_SETS = {"defaults": {}, "bidirectional, unroll=2": {"bidirectional": True, "unroll": 2}}
# Programs whose collectives beside matmuls all go (a split all_reduce's exposed half
# aside), under both option sets.
ALL_GONE = {"sequence-parallel-mlp", "scanned-layers-grad", "fsdp-grad", "moe", "int8-mlp",
            "megatron-mlp", "gptj-block"}


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
    split = {_line_col(loc) for loc in out.applied_all_reduces}
    for left in out.after:
        assert _half(left, split) or _line_col(left.location) in remarked, (left, out.remarks)
    if program.name in ALL_GONE:
        assert all(_half(c, split) for c in out.after), out.after


def _half(collective, split: set) -> bool:
    return collective.name in ("stablehlo.all_gather", "stablehlo.reduce_scatter") and \
        _line_col(collective.location) in split


def test_moved_bytes_count_an_all_reduce_twice():
    program = next(p for p in rp.PROGRAMS if p.name == "megatron-mlp")
    out = rp.run(program, {})
    (reduce,) = out.before
    (gather,) = out.after    # the gather half the ring leaves
    assert reduce.name == "stablehlo.all_reduce" and gather.name == "stablehlo.all_gather"
    assert reduce.bytes == 2 * gather.bytes and out.share == pytest.approx(0.5)
