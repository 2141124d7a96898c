"""overlap-stack-in-place on the lit input's scanned loop (lit_tests/stack-in-place.mlir):
what it builds computes the same with the stack's new start poisoned, and a failure
inside the pass is reported, the module left as it was."""
import sys

import numpy as np
import pytest

import overlap_hlo
from harness import ROOT
from overlap_hlo.targets import cpu

PASS = "overlap-stack-in-place"
ONLY = f"builtin.module({PASS})"
CASES = (ROOT / "lit_tests" / "stack-in-place.mlir").read_text().split("// -----")


def case(name: str) -> str:
    """The lit input's case `name`, its function renamed @main."""
    (text,) = [c for c in CASES if f"func.func @{name}(" in c]
    return text.replace(f"func.func @{name}(", "func.func @main(")


STACKED = case("stacked")


def results(module) -> np.ndarray:
    """@stacked run on one host device, its uninitialised buffers poisoned (NaN)."""
    cpu.poison_buffers(module)
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    (out,) = cpu.run_per_device(overlap_hlo.serialize(module), 1, 1, [x])
    return out[0]


@pytest.mark.parametrize("name", ["stacked", "stacked_through_call"])
def test_the_stack_assembled_in_place_holds_what_the_copy_wrote(name):
    source = case(name)
    original, rewritten = overlap_hlo.parse(source), overlap_hlo.parse(source)
    overlap_hlo.rewrite_module(rewritten, ONLY)
    main = overlap_hlo.serialize(rewritten).split("func.func private")[0]
    assert "tensor<1x8x4xf32>" not in main and "func.call" not in main   # the copy went
    assert main.count("AllocateBuffer") == 1   # the stack's: the ring's own went too
    want = results(original)
    assert want.shape == (2, 8, 4) and not np.isnan(want).any()
    np.testing.assert_array_equal(results(rewritten), want)


def test_a_failure_inside_the_pass_is_reported_and_leaves_the_module(monkeypatch):
    module_of_pass = sys.modules[overlap_hlo.registered_passes()[PASS].__module__]

    def broken(stacked):
        raise RuntimeError("forced")

    monkeypatch.setattr(module_of_pass, "assemble_in_stack", broken)
    module = overlap_hlo.parse(STACKED)
    before = overlap_hlo.serialize(module)
    sites = overlap_hlo.rewrite_module(module, ONLY)
    (left,) = sites
    assert (left.pattern, left.applied, left.kind) == (PASS, False, "internal error")
    assert "forced" in left.reason
    assert overlap_hlo.serialize(module) == before


def test_a_result_that_does_not_verify_is_reported_and_leaves_the_module(monkeypatch):
    """The pass logs no sites of its own: its runs are verified all the same."""
    module_of_pass = sys.modules[overlap_hlo.registered_passes()[PASS].__module__]
    real = module_of_pass.assemble_in_stack

    def mistyped(stacked):
        wrong = stacked.update.operands[1].type   # the slice's type, not the stack's
        real(stacked)
        stacked.loop.regions[1].blocks[0].arguments[stacked.slot].set_type(wrong)

    monkeypatch.setattr(module_of_pass, "assemble_in_stack", mistyped)
    module = overlap_hlo.parse(STACKED)
    before = overlap_hlo.serialize(module)
    (left,) = overlap_hlo.rewrite_module(module, ONLY)
    assert (left.pattern, left.applied, left.kind) == (PASS, False, "internal error")
    assert "Error" not in left.reason and "tensor<1x8x4xf32>" in left.reason   # the verifier
    assert overlap_hlo.serialize(module) == before


def test_a_buffer_that_changes_slot_in_a_loop_is_left_unchanged():
    """lit_tests/stack-in-place.mlir @buffer_changes_slot: no chain, so no attempt (an
    attempt would not verify and be reported as an internal error)."""
    case = next(c for c in (ROOT / "lit_tests" / "stack-in-place.mlir").read_text().split(
        "// -----") if "@buffer_changes_slot" in c)
    module = overlap_hlo.parse(case)
    before = overlap_hlo.serialize(module)
    assert overlap_hlo.rewrite_module(module, ONLY) == []
    assert overlap_hlo.serialize(module) == before
