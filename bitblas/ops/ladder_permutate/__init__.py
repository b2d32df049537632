"""Microsoft BitBLAS module path; see bitblas.ops.layout_ops."""
from ..layout_ops import LadderPermutateConfig, LadderPermutate

__all__ = ["LadderPermutateConfig", "LadderPermutate"]
