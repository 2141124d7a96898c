"""Base class of the rewrite passes: options, site log, channel handles, the driver.

A pass is a frozen dataclass whose fields are its options (`threshold_mib` is
spelled `threshold-mib` in pipeline text). Subclasses name the op their pattern is
rooted at and implement `rewrite_site`, which either rewrites through the
`PatternRewriter` and returns a description, raises `NoMatch` (not a candidate), or
raises `Unsupported` (a candidate left unchanged; the reason is logged).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from . import compat
from .collectives import Unsupported
from .locations import describe

DEFAULT_THRESHOLD_MIB = 1.0


class NoMatch(Exception):
    """The root op is not a site of this pass."""


@dataclass(frozen=True)
class Site:
    """One candidate site and what the pass decided about it."""

    location: str
    pattern: str
    applied: bool
    detail: str

    def format(self) -> str:
        verdict = "rewritten" if self.applied else "left unchanged"
        return f"{self.location}: remark: {self.pattern}: {verdict}: {self.detail}"


@dataclass
class SiteLog:
    """Sites seen by every pass of one pipeline run, in order, without repeats."""

    sites: list[Site] = field(default_factory=list)
    input_name: str | None = None

    def add(self, location: ir.Location, pattern: str, applied: bool, detail: str) -> None:
        site = Site(describe(location, self.input_name), pattern, applied, detail)
        if site not in self.sites:
            self.sites.append(site)


class ChannelAllocator:
    """Fresh channel handles above every handle already in the module."""

    def __init__(self, module_op: ir.Operation):
        self.last = 0

        def visit(op):
            if "channel_handle" in op.attributes:
                handle = stablehlo.ChannelHandle(op.attributes["channel_handle"]).handle
                self.last = max(self.last, handle)
            return ir.WalkResult.ADVANCE

        module_op.walk(visit)

    def __call__(self) -> int:
        self.last += 1
        return self.last


def mib(tensor_type: ir.RankedTensorType) -> float:
    elt = tensor_type.element_type
    bits = elt.width if hasattr(elt, "width") else 32
    count = 1
    for size in tensor_type.shape:
        count *= size
    return count * max(bits, 8) / 8 / 2**20


@dataclass(frozen=True)
class RewritePass:
    """Options shared by the overlap passes."""

    threshold_mib: float = field(default=DEFAULT_THRESHOLD_MIB, metadata={
        "help": "leave a site unchanged when its communicated tensor is smaller than "
                "this many MiB (0: rewrite every legal site)"})
    bidirectional: bool = field(default=False, metadata={
        "help": "two streams in opposite ring directions, about N/2 rounds "
                "(groups of 2 fall back to one stream)"})
    unroll: int = field(default=1, metadata={
        "help": "ring rounds per loop iteration (the remainder is emitted after the loop)"})

    name: ClassVar[str] = ""
    root: ClassVar[type] = object
    summary: ClassVar[str] = ""

    def __post_init__(self):
        if not self.threshold_mib >= 0:  # also rejects nan
            raise ValueError(f"pass '{self.name}': threshold-mib must be >= 0, "
                             f"got {self.threshold_mib}")
        if self.unroll < 1:
            raise ValueError(f"pass '{self.name}': unroll must be >= 1, got {self.unroll}")

    @classmethod
    def options(cls) -> dict[str, dataclasses.Field]:
        return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> RewritePass:
        """Build from pipeline-text options; raises ValueError on a bad one."""
        known = cls.options()
        values = {}
        for key, text in options.items():
            if key not in known:
                raise ValueError(f"pass '{cls.name}' has no option '{key}' "
                                 f"(options: {', '.join(known)})")
            values[known[key].name] = _convert(known[key], text, cls.name)
        return cls(**values)

    def rewrite_site(self, op, rewriter, channels: ChannelAllocator) -> str:
        raise NotImplementedError

    def run(self, module_op: ir.Operation, log: SiteLog) -> None:
        """Apply this pass's pattern to `module_op` with MLIR's greedy driver."""
        channels = ChannelAllocator(module_op)

        def pattern(op, rewriter):
            location = op.location  # read before the rewrite erases `op`
            try:
                with location:
                    detail = self.rewrite_site(op, rewriter, channels)
            except NoMatch:
                return True
            except Unsupported as reason:
                log.add(location, self.name, False, str(reason))
                return True
            log.add(location, self.name, True, detail)
            return False  # the bindings read a falsy result as "matched and rewrote"

        patterns = compat.RewritePatternSet()
        patterns.add(self.root, pattern)
        config = compat.GreedyRewriteConfig()
        config.enable_folding = False
        config.enable_constant_cse = False
        config.region_simplification_level = compat.GreedySimplifyRegionLevel.DISABLED
        config.use_top_down_traversal = True  # sites numbered in program order
        compat.apply_patterns_and_fold_greedily(module_op, patterns.freeze(), config)

    def check_size(self, tensor_type: ir.RankedTensorType) -> None:
        size = mib(tensor_type)
        if size < self.threshold_mib:
            raise Unsupported(f"communicated tensor {tensor_type} is {size:.3g} MiB, "
                              f"below threshold-mib={self.threshold_mib:g}")


def _convert(f: dataclasses.Field, text: str, pass_name: str):
    kind = f.type if isinstance(f.type, type) else eval_type_name(f.type)
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return kind(text)
    except ValueError:
        raise ValueError(f"pass '{pass_name}': option '{f.name.replace('_', '-')}' "
                         f"expects {kind.__name__}, got '{text}'") from None


def eval_type_name(name: str) -> type:
    """Field annotations are strings under `from __future__ import annotations`."""
    return {"float": float, "int": int, "bool": bool, "str": str}[name]


def require_supported_types(*types: ir.Type) -> None:
    """Static-shaped tensors of float or integer elements, or Unsupported."""
    for t in types:
        if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
            raise Unsupported(f"dynamic or unranked shape {t}")
        if not isinstance(t.element_type, (ir.FloatType, ir.IntegerType)):
            raise Unsupported(f"element type {t.element_type} is not a float or integer type")
