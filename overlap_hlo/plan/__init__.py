"""Layer 1, pure models (no MLIR): ring plans and their index algebra, a ring's physical
order on a slice's links, and the analytic cost model.

Imports nothing from overlap_hlo outside this package.
"""
