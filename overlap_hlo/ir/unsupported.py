"""The exception that leaves a candidate site unchanged, and the kinds its reasons are
counted under."""
from __future__ import annotations

import enum


class Kind(enum.StrEnum):
    """A group of reasons a site is left unchanged, as pass statistics, summaries and the
    report count them (the value is the text they print)."""

    NONE = ""                 # rewritten, or a reason counted by its own text
    BELOW_THRESHOLD = "below threshold-mib"
    NOT_PROFITABLE = "not profitable"
    ZERO_SIZE = "zero-size tensor"
    KEPT = "slower in the compiled schedule"          # the report kept the original's
    NAMED_KEPT = "named by keep-sites"
    INTERNAL_ERROR = "internal error"
    NOT_HANDLED = "form not handled"                  # no pattern of its pass matched
    CHANNELS_EXHAUSTED = "channel handles exhausted"
    DEVICE_COORDS = "device-coords"
    RING_TOO_LARGE = "ring too large"
    DIVERGENT = "divergent control flow"
    ACROSS_REGION = "dot across a region boundary"
    TPU_SUMMING_RING = "summing ring on TPU"
    VARIADIC_GATHER = "variadic all_gather"
    GATHER_OF_GATHER = "gather of a gather along another dim"
    IN_SCATTER_RING = "dot decomposed by a reduce_scatter ring"
    SCATTER_DIM_GATHERED = "scatter dim is the gathered dim"
    SHARED_DOT = "dot shared with another reduce_scatter"
    VIEW_IN_SUM = "dot behind a view inside a sum"
    RESHAPED_SCATTER_DIM = "reshape of the scattered dim"
    SUM_READ_ELSEWHERE = "sum read elsewhere"
    NO_DIVISIBLE_DIM = "no divisible dim"
    NOT_A_DOT_RESULT = "operand not a dot's result"
    SUM_OF_DOTS = "sum of dots"
    VIEW_BEFORE_DOT = "view before the dot"
    CONCAT_NOT_FREE = "concat dim not free"
    STRIDED_BLOCKS = "strided blocks"
    NOT_MOVED = "not moved onto the shard"
    MORE_BYTES = "more bytes to gather"


class Unsupported(Exception):
    """A site the passes leave unchanged; the message says why.

    `kind` groups reasons in pass statistics (Kind.BELOW_THRESHOLD, Kind.NOT_PROFITABLE);
    Kind.NONE where the message itself is the group. `detail`, `estimate` and `dots` (the
    locations of the site's dots) are known once the site was matched.
    """

    def __init__(self, message: str, kind: Kind = Kind.NONE, detail: str = "",
                 estimate=None, dots=()):
        super().__init__(message)
        if not isinstance(kind, Kind):
            raise TypeError(f"an Unsupported kind is a Kind, got {kind!r}")
        self.kind = kind
        self.detail = detail
        self.estimate = estimate
        self.dots = dots
