"""The rewrite passes of overlap-hlo, one module per pass."""
from .all_gather_matmul import OverlapAllGatherMatmul
from .matmul_reduce_scatter import OverlapMatmulReduceScatter

ALL_PASSES = (OverlapAllGatherMatmul, OverlapMatmulReduceScatter)
