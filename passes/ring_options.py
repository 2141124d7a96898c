"""The options of the passes that build all_gather rings, each declared once on the
passes that read it: whether rings that sum over a contracting gathered dim are built
for TPU (`SummingRingOptions`: the gather and all_to_all passes), and the gather ring's
own form (`GatherRingOptions`: overlap-all-gather-matmul)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from overlap_hlo.ir.unsupported import Kind, Unsupported
from overlap_hlo.plan.cost import SiteShape

# Ring rounds per loop iteration: rounds that fill no iteration are emitted inline,
# so an unroll near the group size would inline every round.
MAX_UNROLL = 16


@dataclass(frozen=True)
class SummingRingOptions:
    """Mixed into a RewritePass (whose fields `builds_tpu_summing_rings` reads): the
    decision on a TPU ring that sums over a contracting dim."""

    summing_ring_refusal: ClassVar[str] = ""   # the remark of one left unchanged
    model_decides_summing_rings: ClassVar[bool] = True   # else only when asked

    tpu_summing_rings: bool | None = field(default=None, metadata={
        "tried": ((None, ""), (True, "summing rings")), "tried_on": ("TPU",),
        "help": "overlap-all-gather-matmul: build rings that sum over a contracting "
                "gathered dim (FSDP) for TPU too; false: leave them unchanged there. "
                "Default: the cost model decides them where it decides the site, with a "
                "tpu-* profile whose price of them was checked against libtpu (v5e, v5p, "
                "v6e; on v4 it predicted forms faster that compiled slower) and the slice "
                "known (device-coords, set by --tpu), else they are "
                "left unchanged; overlap-report also tries them and keeps them only where "
                "the compiled schedule is faster. overlap-all-to-all-matmul builds its "
                "summed chunks on TPU only when this is true"})

    def builds_tpu_summing_rings(self) -> bool:
        """Whether a ring that sums over a contracting gathered dim is built for TPU:
        `tpu_summing_rings` when given, else when the cost model decides with a profile
        whose price of such rings was checked (`Hardware.decides_summing_rings`) and
        knows the slice (`device_coords`: without it the original's collective gets
        two links, not the cube's three, and the model chose rings that compiled
        slower)."""
        if self.tpu_summing_rings is not None:
            return self.tpu_summing_rings
        return (self.model_decides_summing_rings and self.threshold_mib is None
                and self.hardware is not None
                and self.device_coords is not None
                and self.profile.decides_summing_rings)

    def refusal(self, shape: SiteShape) -> Unsupported | None:
        if shape.sum_bytes and self.form.tied_sums and not self.builds_tpu_summing_rings():
            return Unsupported(self.summing_ring_refusal, kind=Kind.TPU_SUMMING_RING)
        return super().refusal(shape)


@dataclass(frozen=True)
class GatherRingOptions(SummingRingOptions):
    """The all_gather ring's options; an unset `unroll` takes the platform's default."""

    unroll: int | None = field(default=None, metadata={
        "metavar": "N", "minimum": 1,
        "help": "all_gather ring rounds per loop iteration, 1 to 16 (the remainder is "
                "emitted after the loop); default 1, but 2 on TPU and GPU (the loop then "
                "alternates two buffers instead of copying the shard it carries; on GPU a ring "
                "that sums over a contracting gathered dim keeps 1). A reduce_scatter ring runs "
                "one round per iteration"})
    f32_sums: bool = field(default=False, metadata={
        "help": "overlap-all-gather-matmul: sum the partial products of a contracting "
                "gathered dim in f32 when the result is a narrower float (default: in the "
                "result's type, as XLA's windowed einsum does, but always in f32 for f16 "
                "and 8-bit floats); costs an f32 buffer of the result's size"})
    own_shard_last: bool = field(default=False, metadata={
        "tried": ((False, ""), (True, "own shard last")),
        "tried_with": {"tpu_summing_rings": True},
        "help": "overlap-all-gather-matmul, the TPU form of a two-stream ring that sums: "
                "multiply the device's own shard last, beside the shard both streams "
                "reach last (every dot over two shards, round 0's shifts bare), instead "
                "of first (one product of the sum's size more); overlap-report tries both"})
    unroll_given: bool = field(init=False, repr=False, compare=False)   # not a default

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "unroll_given", self.unroll is not None)
        if self.unroll is None:
            object.__setattr__(self, "unroll", self.form.gather_unroll)
        if self.unroll < 1:
            raise ValueError(f"pass '{self.name}': unroll must be >= 1, got {self.unroll}")
        if self.unroll > MAX_UNROLL:
            raise ValueError(f"pass '{self.name}': unroll must be at most {MAX_UNROLL}, got "
                             f"{self.unroll}")
