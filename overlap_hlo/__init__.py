"""overlap-hlo: overlap tensor-parallel collectives with the matmuls that need them.

Rewrites all_gather -> dot_general and dot_general -> reduce_scatter in StableHLO
modules into loops of collective_permute steps (Wang et al., ASPLOS 2023).
"""
from .api import (InputError, Overlapped, SitesLeftUnchanged, overlap, parse, remarks,
                  rewrite_exported, rewrite_lowered, rewrite_module, rewrite_source,
                  serialize, unchanged_summary)
from .cost import PROFILES, Estimate, Hardware
from .pipeline import DEFAULT_PIPELINE, PipelineError, registered_passes
from .rewrite_pass import DEFAULT_THRESHOLD_MIB, Site, statistics

__all__ = [
    "DEFAULT_PIPELINE", "DEFAULT_THRESHOLD_MIB", "PROFILES", "Estimate", "Hardware",
    "InputError", "Overlapped", "PipelineError", "Site", "SitesLeftUnchanged", "overlap",
    "parse", "registered_passes", "remarks", "rewrite_exported", "rewrite_lowered",
    "rewrite_module", "rewrite_source", "serialize", "statistics", "unchanged_summary",
]
