"""The GEMV kernels: small-M CUDA kernels (1..64 rows) written directly as TIRx, one hint per kernel.

Modules, leaves first (each imports only those above it):

* ``decode``   -- register decoders of table and float8 formats (CUDA source text);
* ``int8``     -- the int8-activation decoders (codes to bytes for dp4a / mma s8);
* ``emit``     -- the shared emit helpers: plan facts the kernels share (weight vector bytes, the
  staged row's size), the CUDA helpers of a format, the kernel entry, step loop and K-warp reduction;
* ``hints``    -- one frozen hint per kernel body (:class:`GEMVRowsHint`, :class:`GEMVKSplitHint`,
  :class:`GEMVMmaHint`, :class:`GEMVWgmmaHint`), their base :class:`GEMVHint` and the mapping
  from the one hint the GEMV had before (``GEMVHint(mma=True, ...)``);
* ``rows``, ``ksplit``, ``mma``, ``mma_int8``, ``wgmma`` -- one kernel body each (and the checks
  that are that body's own);
* ``template`` -- which plans and hints the kernels take, the default hint (the kernel that wins,
  :func:`default_gemv_hint`), and the dispatch from a hint's class to its kernel body
  (:func:`kernel_script`, :func:`schedule_cuda_gemv`).

measurements: docs/performance.md
"""
from .emit import act_smem_bytes, decode_ops_per_weight, keeps_act_sum, span_vectors, vec_blocks, vec_bytes
from .mma import chunk_loop, mma_gemv_unsupported, row_chunks, row_class
from .mma_int8 import mma_int8_unsupported
from .hints import GEMV_HINTS, GEMVHint, GEMVKSplitHint, GEMVMmaHint, GEMVRowsHint, GEMVWgmmaHint
from .template import (ACT_SMEM_MAX_BYTES, GEMV_ACTIVATIONS, GEMV_MAX_ROWS, GEMV_MMA_MAX_ROWS,
                       WGMMA_GEMV_MIN_ROWS, default_gemv_hint,
                       gemv_arch_unsupported, gemv_default_takes, gemv_hint_unsupported, gemv_unsupported, kernel_script,
                       schedule_cuda_gemv)
from .wgmma import WgmmaGemvFn, permute_script, slab_codes, wgmma_gemv_unsupported, wgmma_rows

__all__ = ["GEMVHint", "GEMVRowsHint", "GEMVKSplitHint", "GEMVMmaHint", "GEMVWgmmaHint", "GEMV_HINTS",
           "default_gemv_hint", "gemv_unsupported", "gemv_arch_unsupported", "gemv_default_takes", "gemv_hint_unsupported", "schedule_cuda_gemv",
           "kernel_script", "GEMV_ACTIVATIONS", "GEMV_MAX_ROWS", "GEMV_MMA_MAX_ROWS", "WGMMA_GEMV_MIN_ROWS", "ACT_SMEM_MAX_BYTES",
           "vec_bytes", "vec_blocks", "span_vectors", "decode_ops_per_weight", "keeps_act_sum", "act_smem_bytes",
           "row_class", "row_chunks", "chunk_loop", "mma_gemv_unsupported", "mma_int8_unsupported",
           "wgmma_gemv_unsupported", "wgmma_rows", "slab_codes", "permute_script", "WgmmaGemvFn"]
