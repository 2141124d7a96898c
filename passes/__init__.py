"""The rewrite passes of overlap-hlo, one module per pass, registered in this order."""
from overlap_hlo.rewrite.pipeline import register

from .all_gather_matmul import OverlapAllGatherMatmul
from .all_to_all_matmul import OverlapAllToAllMatmul
from .matmul_all_reduce import OverlapMatmulAllReduce
from .matmul_reduce_scatter import OverlapMatmulReduceScatter
from .sequence_parallel import OverlapSequenceParallel
from .stack_in_place import OverlapStackInPlace

ALL_PASSES = (OverlapAllGatherMatmul, OverlapMatmulReduceScatter, OverlapMatmulAllReduce,
              OverlapSequenceParallel, OverlapAllToAllMatmul, OverlapStackInPlace)
for _cls in ALL_PASSES:
    register(_cls)
