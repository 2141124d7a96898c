"""Layer 1, IR helpers: MLIR compatibility across jaxlib versions, locations, dominance
and uniformity, views through reshapes and transposes, dot dimensions, normalisation.

Imports nothing from overlap_hlo outside this package.
"""
