"""overlap-hlo: overlap tensor-parallel collectives with the matmuls that need them.

Rewrites all_gather -> dot_general, dot_general -> reduce_scatter, dot_general ->
all_reduce and all_to_all -> dot_general in StableHLO modules into collective_permute
steps beside partial dots (Wang et al., ASPLOS 2023).

Layers, each importing only from those before it: ir and plan (IR helpers; pure ring
and cost models), groups (replica groups as rings), rewrite (base pass, sites,
pipeline, builders), passes, api (parse, rewrite, jax integration), targets (host CPU,
TPU ahead of time, schedule model, report), tools (the command lines).
"""
from overlap_hlo.api import (InputError, NoCollectives, Overlapped, SitesLeftUnchanged,
                             no_collectives_note, overlap, parse, remarks, rewrite_exported,
                             rewrite_lowered, rewrite_module, rewrite_source,
                             rewrite_summary, serialize, unchanged_summary)
from overlap_hlo.ir.locations import Where
from overlap_hlo.plan.cost import PROFILES, Estimate, Hardware
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE, PipelineError, registered_passes
from overlap_hlo.rewrite.rewrite_pass import DEFAULT_THRESHOLD_MIB
from overlap_hlo.rewrite.site import Site, statistics

__all__ = [
    "DEFAULT_PIPELINE", "DEFAULT_THRESHOLD_MIB", "PROFILES", "Estimate", "Hardware",
    "InputError", "NoCollectives", "Overlapped", "PipelineError", "Site", "SitesLeftUnchanged", "Where",
    "no_collectives_note", "overlap", "parse", "registered_passes", "remarks", "rewrite_exported",
    "rewrite_lowered", "rewrite_module", "rewrite_source", "rewrite_summary", "serialize",
    "statistics",
    "unchanged_summary",
]
