"""The exception that leaves a candidate site unchanged."""
from __future__ import annotations


class Unsupported(Exception):
    """A site the passes leave unchanged; the message says why.

    `kind` groups reasons in pass statistics ("below threshold-mib", "not profitable");
    by default the message itself. `detail`, `estimate` and `dots` (the locations of the
    site's dots) are known once the site was matched.
    """

    def __init__(self, message: str, kind: str | None = None, detail: str = "",
                 estimate=None, dots=()):
        super().__init__(message)
        self.kind = kind or message
        self.detail = detail
        self.estimate = estimate
        self.dots = dots
