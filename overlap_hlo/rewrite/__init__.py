"""Layer 3, rewrite machinery: the base pass and its driver, the site log, the IR
builders the emitters share, and pipeline text -> PassManager.

Imports from the layers below; the passes (overlap_hlo.passes) sit above it and
register themselves with `register`.
"""
