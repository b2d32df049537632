"""Microsoft BitBLAS module path; see bitblas.ops.layout_ops."""
from ..layout_ops import QuantCompressConfig, QuantCompress

__all__ = ["QuantCompressConfig", "QuantCompress"]
