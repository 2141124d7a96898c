"""Dimension bookkeeping for `stablehlo.dot_general`."""
from __future__ import annotations

from dataclasses import dataclass

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo


@dataclass(frozen=True)
class DotDims:
    """Batch and contracting dims of both operands, and their ranks."""

    batch: tuple[tuple[int, ...], tuple[int, ...]]
    contracting: tuple[tuple[int, ...], tuple[int, ...]]
    ranks: tuple[int, int]

    @classmethod
    def of(cls, dot: ir.Operation) -> DotDims:
        dn = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
        return cls(
            (tuple(dn.lhs_batching_dimensions), tuple(dn.rhs_batching_dimensions)),
            (tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)),
            (dot.operands[0].type.rank, dot.operands[1].type.rank))

    def free(self, operand: int) -> list[int]:
        used = set(self.batch[operand]) | set(self.contracting[operand])
        return [d for d in range(self.ranks[operand]) if d not in used]

    def classify(self, operand: int, dim: int) -> tuple[str, int | None, int | None]:
        """Where `dim` of operand `operand` goes: (kind, result dim, other operand's dim).

        kind is "batch", "contracting" or "free"; contracting dims have no result dim,
        free dims no paired dim in the other operand.
        """
        other = 1 - operand
        if dim in self.contracting[operand]:
            i = self.contracting[operand].index(dim)
            return "contracting", None, self.contracting[other][i]
        if dim in self.batch[operand]:
            i = self.batch[operand].index(dim)
            return "batch", i, self.batch[other][i]
        offset = len(self.batch[0]) + (len(self.free(0)) if operand == 1 else 0)
        return "free", offset + self.free(operand).index(dim), None

    def result_source(self, result_dim: int) -> list[tuple[int, int]]:
        """The (operand, dim) pairs that produce `result_dim` of the dot's result."""
        nb, nfree0 = len(self.batch[0]), len(self.free(0))
        if result_dim < nb:
            return [(0, self.batch[0][result_dim]), (1, self.batch[1][result_dim])]
        if result_dim < nb + nfree0:
            return [(0, self.free(0)[result_dim - nb])]
        return [(1, self.free(1)[result_dim - nb - nfree0])]


def flops(dot: ir.Operation) -> float:
    """2 x result elements x contracted elements."""
    dims = DotDims.of(dot)
    lhs = dot.operands[0].type.shape
    contracted = 1
    for d in dims.contracting[0]:
        contracted *= lhs[d]
    result = 1
    for size in dot.results[0].type.shape:
        result *= size
    return 2.0 * result * contracted


def tensor_bytes(tensor_type: ir.RankedTensorType) -> float:
    """Bytes of a static tensor (sub-byte elements count a byte; an element type
    without a width, 4)."""
    elt = tensor_type.element_type
    bits = elt.width if hasattr(elt, "width") else 32
    count = 1
    for size in tensor_type.shape:
        count *= size
    return count * max(bits, 8) / 8


def traffic(dot: ir.Operation, sliced: set[int]) -> tuple[float, float]:
    """(bytes of the operands read whole, bytes of the `sliced` operands and the
    result) of a dot whose ring slices operands `sliced`: what the cost model's
    roofline prices."""
    def size(value: ir.Value) -> float:
        return tensor_bytes(ir.RankedTensorType(value.type))

    whole = sum(size(dot.operands[i]) for i in range(2) if i not in sliced)
    cut = sum(size(dot.operands[i]) for i in sliced) + size(dot.results[0])
    return whole, cut
