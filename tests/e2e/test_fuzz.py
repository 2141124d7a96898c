"""A short differential-fuzzing budget in the suite (the long runs: overlap-fuzz)."""
import dataclasses
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import overlap_hlo
from overlap_hlo.tools import (fuzz, fuzz_api, fuzz_block, fuzz_common, fuzz_exchange,
                               fuzz_huge, fuzz_promoted, fuzz_sites, fuzz_wrapped)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_programs_agree(seed):
    case = fuzz_sites.draw(random.Random(seed), seed)
    outcome, detail = fuzz.run(case)
    # Programs JAX or XLA:CPU itself rejects say nothing about the rewrite.
    assume(outcome not in ("not generated", "original fails"))
    expected = ("rewritten",) if case.context == "plain" else ("rewritten", "unchanged")
    assert outcome in expected, f"{outcome}: {detail}\n{case.describe()}"


def plain_case(kind: str) -> fuzz_sites.Case:
    """A one-axis f32 site on 4 devices: (16, 8) @ (8, 12), dim 0 gathered or scattered."""
    return fuzz_sites.Case(mesh=(4,), axes=("x",), kind=kind, batch=(), contracting=(8,),
                           lhs_free=(16,), rhs_free=(12,), lhs_order=(1, 0),
                           rhs_order=(0, 1), operand=0, role="free", index=0,
                           dtype="float32", shardy=True, bidirectional=False, unroll=1,
                           seed=3)


@pytest.mark.parametrize("kind,context,expected", [
    ("gather", "cond", "rewritten"),           # the ring hoisted out of the branch
    ("gather", "device_loop", None),           # either, but never a wrong result
    ("gather", "barrier", "unchanged"),
    ("gather", "other_user", "rewritten"),
    ("scatter", "cond", "unchanged"),
    ("scatter", "device_loop", "unchanged"),
    ("scatter", "barrier", "unchanged"),
    ("scatter", "other_user", None),          # the dot is kept for its other user
    ("gather", "called", "rewritten"),         # the nested jax.jit is inlined
    ("scatter", "called", "rewritten"),
    ("gather", "uniform_cond", "rewritten"),   # a second dot inside a uniform branch
    ("scatter", "uniform_cond", "rewritten"),  # the dot before the branch
    ("scatter", "biased_read", "rewritten"),   # the biased sum, read after: assembled
    ("gather", "called_under_cond", "unchanged"),   # a ring would deadlock
    ("scatter", "called_under_cond", "unchanged"),
])
def test_contexts(kind, context, expected):
    case = dataclasses.replace(plain_case(kind), context=context)
    if context == "called_under_cond":   # a pipeline stage: a branch on another axis
        case = dataclasses.replace(case, mesh=(2, 4), axes=("y",))
    outcome, detail = fuzz.run(case)
    assert outcome in ((expected,) if expected else ("rewritten", "unchanged")), detail


def test_f8_summing_ring():
    case = dataclasses.replace(plain_case("gather"), dtype="float8_e4m3fn", role="contracting",
                               contracting=(16,), bidirectional=True)
    assert fuzz.run(case)[0] == "rewritten"


@pytest.mark.parametrize("target", ["tpu", "gpu"])
@pytest.mark.parametrize("role", ["contracting", "free"])
def test_target_forms_run_with_their_buffers_poisoned(target, role):
    """TPU and GPU forms (the TPU summing ring included): their uninitialised buffers
    become NaN on the host, and the results still agree."""
    case = dataclasses.replace(plain_case("gather"), role=role, bidirectional=True,
                               target=target, contracting=(16,) if role == "contracting"
                               else (8,))
    assert fuzz.run(case)[0] == "rewritten"


@pytest.mark.parametrize("seed", [2, 3])
def test_tpu_summing_ring_layouts(seed):
    """The fuzzer's TPU summing rings put the own shard first (even seeds) or last (odd;
    4 devices, two streams): both agree with the original, buffers poisoned."""
    case = dataclasses.replace(plain_case("gather"), role="contracting", contracting=(16,),
                               bidirectional=True, target="tpu", seed=seed)
    assert fuzz.run(case)[0] == "rewritten"


@pytest.mark.parametrize("seed", range(3))
def test_promoted_reduce_scatters(seed):
    case = fuzz_promoted.draw_promoted(random.Random(seed), seed)
    outcome, detail = fuzz.run(case)
    assert outcome == "rewritten", f"{detail}\n{case.describe()}"


def test_api_call_sequences_match_jax_jit():
    case = fuzz_api.ApiCase((("python", 0.5, 1, None), ("python", 3.0, 1, None),
                             ("weak", 0.5, 1, None), ("bfloat16", 0.5, 2, None),
                             ("float32", 0.25, 2, "highest"), ("float32", 0.25, 2, None)),
                            0)
    outcome, detail = fuzz.run(case)
    assert outcome == "rewritten", detail
    assert detail == "6 calls, 5 executables (jax.jit: 5)"


@pytest.mark.parametrize("kind", ["gather", "scatter"])
def test_huge_cases_are_checked_on_the_ir(kind):
    case = fuzz_huge.HugeCase(kind, group=8, rows=2 ** 29, bidirectional=True, unroll=2)
    assert fuzz.run(case) == ("rewritten", "IR only: 64-bit offsets")


def test_fuzz_script_reports_its_figures(capsys):
    assert fuzz.main(["--cases", "3", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "3 cases in" in out and "0 mismatched, 0 crashed" in out
    assert out.rstrip().endswith("3 passed, 0 failed")


def test_every_generator_module_is_registered_once():
    """Each tools/fuzz_<name>.py that declares a GENERATOR is on GENERATORS' one line per
    generator, under its own name and case class; only fuzz_sites takes the rest."""
    import importlib
    import pathlib

    folder = pathlib.Path(fuzz.__file__).parent
    declared = [importlib.import_module(f"overlap_hlo.tools.{path.stem}").GENERATOR
                for path in sorted(folder.glob("fuzz_*.py"))
                if "GENERATOR =" in path.read_text()]
    assert sorted(g.name for g in declared) == sorted(g.name for g in fuzz.GENERATORS)
    assert len({g.name for g in fuzz.GENERATORS}) == len(fuzz.BY_CASE) == len(declared)
    assert [g.name for g in fuzz.GENERATORS if g.share is None] == ["sites"]
    assert sum(g.share for g in fuzz.GENERATORS if g.share is not None) < 1


def test_draw_any_reaches_every_generator():
    rng = random.Random(5)
    drawn = {fuzz.BY_CASE[type(fuzz.draw_any(rng, i))].name for i in range(400)}
    assert drawn == {g.name for g in fuzz.GENERATORS}


def test_a_generator_builds_or_runs_its_cases():
    with pytest.raises(TypeError, match="exactly one"):
        fuzz_common.Generator("both", 0.1, object, fuzz_sites.draw,
                              build=fuzz_sites.build_site, run=fuzz_huge.run_huge)
    with pytest.raises(TypeError, match="exactly one"):
        fuzz_common.Generator("neither", 0.1, object, fuzz_sites.draw)


def test_a_dot_behind_a_transpose_inside_a_sum_is_reported():
    """psum_scatter(x @ w + 1) where the einsum ends in a transpose: the add's leaf is a
    transpose of the dot, which the ring does not follow: left unchanged, and said."""
    case = fuzz_sites.Case(mesh=(4,), axes=("x",), kind="scatter", batch=(),
                           contracting=(2,), lhs_free=(4, 5), rhs_free=(12,),
                           lhs_order=(0, 2, 1), rhs_order=(1, 0), operand=1, role="free",
                           index=2, dtype="float32", shardy=True, bidirectional=True,
                           unroll=1, seed=3, context="biased_read")
    outcome, detail = fuzz.run(case)
    assert outcome == "unchanged" and "not followed inside a sum" in detail


@pytest.mark.parametrize("template", sorted(fuzz_exchange.EXCHANGES))
def test_all_to_all_exchanges_agree(template):
    """An all_to_all beside a dot, each template on a group of 4 of a 2-D mesh, in f32."""
    case = fuzz_exchange.ExchangeCase((2, 4), "y", template, (2, 3, 2, 3), "float32", True,
                                      7)
    assert fuzz.run(case)[0] == "rewritten"


def test_an_ill_conditioned_bf16_block_is_judged_against_f32():
    """A layer norm over two features amplifies the ring's other summation order (bf16,
    two streams): 0.24 off the original, yet 0.26 off the f32 result where the original
    is 0.079 off it. Judged against f32, not called a mismatch (found by
    `overlap-fuzz --seed 20261212`, case 104)."""
    case = fuzz_block.BlockCase(mesh=(8,), axis="x", batch_axis=None, layers=2,
                                norm="layer", activation="relu", sizes=(4, 2, 2, 2),
                                scanned=False, dtype="bfloat16", shardy=True,
                                seed=20261272783740, bidirectional=True, unroll=1)
    outcome, detail = fuzz.run(case)
    assert outcome == "rewritten" and "against f32" in detail, detail


def test_a_wrong_block_is_a_mismatch_against_f32_too():
    np = pytest.importorskip("numpy")
    want = [np.linspace(-1, 1, 16).reshape(4, 4)]
    reference = [want[0] + 0.01]                    # the original 1% off the f32 result
    swapped = [want[0][::-1].copy()]                # blocks written in the wrong place
    assert fuzz.judge(want, want, "bfloat16", lambda: reference)[0]
    assert not fuzz.judge(swapped, want, "bfloat16", lambda: reference)[0]
    assert not fuzz.judge(swapped, want, "bfloat16")[0]          # no reference
    off = [want[0] + 0.035]                         # within 4x the original's 0.01
    assert fuzz.judge(off, want, "bfloat16", lambda: reference)[0]
    assert not fuzz.judge(off, want, "float32", None)[0]


@pytest.mark.parametrize("form,kind,variant,expected", [
    ("between", "psum", "dropout", "rewritten"),
    ("linear", "psum", "from_a_term", "rewritten"),
    ("nonlinear", "psum", "maximum", "unchanged"),
    ("zero_size", "all_to_all", "", "unchanged"),
    ("multi_platform", "all_to_all", "", "rewritten"),
    ("two_collectives", "psum", "", "rewritten"),
    ("predicate", "all_gather", "replicated", "rewritten"),
    ("nested_jit", "psum", "", "rewritten"),
])
def test_wrapped_sites(form, kind, variant, expected):
    case = fuzz_wrapped.WrappedCase(form, kind, variant, 4, (1, 2, 1), "float32",
                                    form != "predicate", seed=11)
    outcome, detail = fuzz.run(case)
    assert outcome == expected, f"{outcome}: {detail}"


def test_a_collective_next_to_a_dot_without_a_record_is_silent():
    """The fuzzer's check fails a case whose site has no record (here: none given)."""
    case = fuzz_wrapped.WrappedCase("nested_jit", "psum", "", 4, (1, 1, 1), "float32",
                                    True, seed=2)
    jitted, inputs = fuzz.build(case)
    text = jitted.lower(*inputs).as_text()
    assert len(fuzz.silent_sites(text, [])) == 1
    sites = overlap_hlo.remarks(text, threshold_mib=0)
    assert fuzz.silent_sites(text, sites) == []
