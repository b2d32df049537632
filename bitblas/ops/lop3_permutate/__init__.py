"""Microsoft BitBLAS module path; see bitblas.ops.layout_ops."""
from ..layout_ops import LOP3PermutateConfig, LOP3Permutate

__all__ = ["LOP3PermutateConfig", "LOP3Permutate"]
