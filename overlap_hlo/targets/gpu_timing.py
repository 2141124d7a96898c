"""Time a GPU schedule's kernels with the analytic model, not with XLA's estimates.

Compiled without a GPU, XLA autotunes no GEMM, so its latency-hiding scheduler's
estimates for them can be far off (a 1024x4096x1024 bf16 dot at 731 us on H100). Here
every kernel is priced on the cost profile (`overlap_hlo.plan.cost.Hardware`), as the
pass's own estimates are:

- a GEMM (a dot, or a fusion around one: XLA's Triton GEMM fusions) on the roofline
  `Hardware.dot_us`: 2 x result elements x contracted size FLOPs at the peak for its
  operands' element type x matmul efficiency, or the bytes of its operands and result
  at cost.MEMORY_EFFICIENCY x the memory bandwidth, whichever is longer;
- any other kernel (a fusion, a copy, an elementwise op) as memory traffic: the bytes
  it writes (its result; an in-place dynamic-update-slice writes only the update) and
  reads (each operand, at most as much as it writes, as a slice reads; a reduction
  reads its operands whole), at the same bandwidth;
- what runs no kernel (parameters, constants, tuples, bitcasts, buffer allocations)
  takes no time. Launch overheads are not priced.

Every figure is a model, not a measurement. Collectives and permutes are timed by
`schedule.Timing` on the profile's links.
"""
from __future__ import annotations

from dataclasses import dataclass

from overlap_hlo.targets.hlo_proto import Instruction, ModuleProto
from overlap_hlo.targets.schedule import Timing, contains_matmul

# xla.PrimitiveType -> the cost profiles' element type names.
ELEMENT_NAMES = {2: "int8", 10: "f16", 11: "f32", 12: "f64", 16: "bf16", 19: "f8", 20: "f8"}
NO_KERNEL = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                       "partition-id", "replica-id", "after-all", "opt-barrier",
                       "while", "call", "conditional", "iota"})
NO_KERNEL_CALLS = frozenset({"AllocateBuffer"})


@dataclass(frozen=True)
class GpuTiming(Timing):
    """`Timing` with GPU kernels priced on `hardware` (the module docstring)."""

    def compute_us(self, instr: Instruction, proto: ModuleProto | None = None) -> float:
        if proto is None or instr.opcode in NO_KERNEL or (
                instr.opcode == "custom-call" and instr.custom_call_target in NO_KERNEL_CALLS):
            return 0.0
        if contains_matmul(proto, instr):
            dot = _dot(proto, instr)
            if dot is not None:
                return self.hardware.dot_us(gemm_flops(proto, dot), _traffic(proto, instr),
                                            element_name(proto.operands(dot)[0]))
        return self.hardware.memory_us(kernel_bytes(proto, instr))


def gemm_flops(proto: ModuleProto, dot: Instruction) -> float:
    """2 x result elements x the product of the lhs contracting dimensions."""
    lhs = proto.operands(dot)[0].shape.dims
    contracted = 1
    for d in dot.contracting:
        contracted *= lhs[d]
    elements = 1
    for d in dot.shape.dims:
        elements *= d
    return 2.0 * elements * contracted


def element_name(instr: Instruction) -> str:
    return ELEMENT_NAMES.get(instr.shape.element_type, "default")


def kernel_bytes(proto: ModuleProto, instr: Instruction) -> int:
    """What a non-GEMM kernel writes and reads (the module docstring)."""
    root = _root(proto, instr)
    written = instr.shape.nbytes
    if root.opcode == "dynamic-update-slice" and len(root.operand_ids) > 1:
        written = proto.operands(root)[1].shape.nbytes
    operands = [o.shape.nbytes for o in proto.operands(instr)]
    if root.opcode in ("reduce", "reduce-window"):
        return written + sum(operands)
    return written + sum(min(n, written) for n in operands)


def _traffic(proto: ModuleProto, instr: Instruction) -> int:
    return instr.shape.nbytes + sum(o.shape.nbytes for o in proto.operands(instr))


def _root(proto: ModuleProto, instr: Instruction) -> Instruction:
    if instr.opcode == "fusion":
        called = proto.called(instr)
        if called:
            return called[0].root
    return instr


def _dot(proto: ModuleProto, instr: Instruction) -> Instruction | None:
    """The dot of a GEMM instruction (itself, or the first inside its fusion)."""
    if instr.opcode == "dot":
        return instr
    for comp in proto.called(instr):
        for inner in comp.instructions:
            found = _dot(proto, inner) if inner.opcode in ("dot", "fusion") else None
            if found is not None:
                return found
    return None
