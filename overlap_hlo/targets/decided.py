"""overlap() with each site decided by the compiled whole program for a named target.

    step = overlap_hlo.targets.decided.overlap(jax.jit(train_step), "v5p:2x2x2")
    state, loss = step(state, batch)      # step.report: what the compiled schedule chose

The target is a TPU slice ("v5p:2x2x2") or a GPU target ("h100:8", a `gpu.Target`).
`overlap_hlo.overlap` decides each site by the analytic cost model, one site at a time.
This one compiles each new signature's lowering for the target, the original and the
report's candidates (`report.build`: the cost model's choice, each form, each pass's
fastest, the slower sites kept), and rewrites the lowering with the options and pipeline
of the module whose schedule is fastest, or leaves it as it is when none beats the
original. A scan body's sites are one site each, so a layer pattern is decided once.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

from overlap_hlo import api
from overlap_hlo.ir.unsupported import Kind
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.targets import gpu, report, tpu


class Decided(api.Overlapped):
    """An `api.Overlapped` deciding by the compiled program for `decide_for`. The lowering
    runs where JAX put it: a decision made for a TPU slice may run on host CPU devices,
    in the forms that backend runs. `.report` is the last lowering's `report.Report`;
    `.sites` its sites' records."""

    def __init__(self, jitted, decide_for: str | tpu.Topology | gpu.Target,
                 pipeline: str | None = DEFAULT_PIPELINE, **options):
        super().__init__(jitted, pipeline, **options)
        self.decide_for = _named(decide_for)
        self.report: report.Report | None = None
        self._reports: OrderedDict[bytes, report.Report] = OrderedDict()   # by digest, LRU

    def _rewrite(self, lowered, stacklevel: int):
        rep = self.report = self._decide(lowered)
        if rep.built_with is None:          # the original kept
            api._report(rep.records, stacklevel + 1, lowered.compiler_ir("stablehlo"),
                        self.name)
            return api._carrying_sites(lowered, rep.records)
        options, pipeline = rep.built_with
        if "target" not in self.options:   # the forms of the backend the lowering runs on
            options = {key: value for key, value in options.items() if key != "target"}
        return api._rewrite_lowered(lowered, pipeline, options, stacklevel + 1, self.name,
                                    lambda sites: _with_reasons(sites, rep.records))

    def _decide(self, lowered) -> report.Report:
        """The report on `lowered`'s module: built once per module (the same module
        lowered again, `lower()` after a call, compiles nothing for the target)."""
        module = api.serialize(lowered.compiler_ir("stablehlo"), bytecode=True)
        key = hashlib.sha256(module).digest()
        rep = self._reports.get(key)
        if rep is None:   # compiled from the bytecode already written for the key
            rep = self._reports[key] = report.build(module, self.decide_for, self.pipeline,
                                                    **self.options)
            if len(self._reports) > api.MAX_EXECUTABLES:
                self._reports.popitem(last=False)
        else:
            self._reports.move_to_end(key)
        return rep


def _named(decide_for):
    """A GPU target for a GPU name ("h100:8"); a TPU slice's name or an object as given."""
    if isinstance(decide_for, str):
        try:
            gpu.parse(decide_for)
        except gpu.UnknownTarget:
            return decide_for   # a TPU slice, checked when it is compiled for
        return gpu.target(decide_for)
    return decide_for


def _with_reasons(sites: list, decided: list) -> list:
    """`sites`, each one the compiled schedule kept unchanged as its record says why."""
    kept = {site.location: site for site in decided if site.kind is Kind.KEPT}
    return [kept.get(site.location, site) if not site.applied else site for site in sites]


def overlap(fn, decide_for: str | tpu.Topology | gpu.Target,
            pipeline: str | None = DEFAULT_PIPELINE, **options) -> Decided:
    """`fn` (a function or a `jax.jit` of one) with its collectives decomposed where the
    compiled program for `decide_for` is faster (options as for `overlap_hlo.overlap`;
    `target`, the forms built, defaults to the backend the lowering runs on)."""
    return Decided(fn, decide_for, pipeline, **options)
