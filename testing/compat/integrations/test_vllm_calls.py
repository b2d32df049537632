"""The calls vLLM's BitBLAS integration makes, in its order, on CPU tensors (``cuda`` under -m gpu),
checked against dequantize-then-matmul. Mirrors (read, not copied) vllm/model_executor/layers/
quantization/{gptq_bitblas.py, bitblas.py}, kernels/mixed_precision/bitblas.py and
utils/bitblas_utils.py:

* symmetric GPTQ (``gptq_bitblas``, BitBLASLinearKernel): W_dtype int4 with scales, the raw GPTQ
  codes (``q + 8``) through ``weight_transform``, ``op(x, qweight, scales)``;
* GPTQ checkpoints in BitBLAS format (``bitblas``, BitBLASLinearMethod): W_dtype uint4 with
  ``zeros_mode="quantized"`` zero points packed [groups, N * bits / 8] (BitBLAS's / GPTQ's
  qzeros layout), loaded into parameters shaped by ``retrieve_weight_shape()``, then
  ``op(x_2d, qweight, scales, zeros)``; asymmetric and symmetric (zero point 8) checkpoints.

vLLM tunes each new operator (ENABLE_TUNING) unless ``global_operator_cache`` (loaded from the
database on first use) has it: the tests save an untuned operator into a fresh database first, so
the operator comes from ``load_from_database`` as on a second vLLM start.
"""
import numpy as np
import pytest
import torch

import bitblas
from gptq_data import make_gptq, unpack_fields
from test_fast_decoding import bb_lop3_permutate

OPT_FEATURES = [1, 16, 32, 64, 128, 256, 512, 1024]     # vLLM's BITBLAS_OPTIMIZE_FEATURES
MINIMUM_BITBLAS_VERSION = "0.1.0"


@pytest.fixture
def database(tmp_path):
    from bitblas.cache import global_operator_cache
    old = bitblas.get_database_path()
    bitblas.set_database_path(str(tmp_path / "db"))
    global_operator_cache.clear()
    yield bitblas.get_database_path()
    global_operator_cache.clear()
    bitblas.set_database_path(None)
    if bitblas.get_database_path() != old:
        bitblas.set_database_path(old)


def _seed_database(config, path, target):
    """A previous run's operator in the database (vLLM would have tuned and saved it)."""
    from bitblas import Matmul
    from bitblas.cache import global_operator_cache
    global_operator_cache.add(config, Matmul(config, target=target, enable_tuning=False))
    global_operator_cache.save_into_database(path, target)
    global_operator_cache.clear()


def _version_ok():
    from packaging import version
    return (version.parse(bitblas.__version__) >= version.parse(MINIMUM_BITBLAS_VERSION)
            and not bitblas.__version__ < MINIMUM_BITBLAS_VERSION)      # bitblas_utils compares strings too


def _get_or_create_bitblas_operator(config, enable_tuning, database_path, target):
    # kernels/mixed_precision/bitblas.py: BitBLASLinearKernel._get_or_create_bitblas_operator
    from bitblas import Matmul
    from bitblas.cache import global_operator_cache
    if global_operator_cache.size() == 0:
        global_operator_cache.load_from_database(database_path, target)
    bitblas_matmul = global_operator_cache.get(config)
    if bitblas_matmul is None:
        bitblas_matmul = Matmul(config, target=target, enable_tuning=False)
        if enable_tuning:
            bitblas_matmul.hardware_aware_finetune(topk=20)
            global_operator_cache.add(config, bitblas_matmul)
            global_operator_cache.save_into_database(database_path, target)
    return bitblas_matmul, True if global_operator_cache.get(config) is bitblas_matmul else False


def unpack_gptq_qweight(qweight, bits):
    """utils/bitblas_utils.py: unpack_gptq_qweight: the codes of the int8 view of the words."""
    return unpack_fields(qweight.view(torch.int8), bits)


@pytest.mark.parametrize("group_size", [128, -1])
def test_vllm_gptq_bitblas_symmetric(group_size, device, database):
    assert _version_ok()
    from bitblas import MatmulConfig
    from bitblas.cache import get_database_path
    K, N, bits = 512, 256, 4
    gs = K if group_size == -1 else group_size
    ckpt, ref_w = make_gptq(K, N, gs, bits, sym=True, v2=False, seed=1)

    # _configure_bitblas_matmul (quant_method "gptq", is_sym)
    config = MatmulConfig(M=OPT_FEATURES, N=N, K=K, A_dtype="float16", W_dtype=f"int{bits}", out_dtype="float16",
                          accum_dtype="float16", storage_dtype="int8", with_scaling=True, with_zeros=False,
                          group_size=group_size, with_bias=False, layout="nt", zeros_mode="quantized")
    BITBLAS_DATABASE_PATH = get_database_path()
    BITBLAS_TARGET = bitblas.auto_detect_nvidia_target()
    _seed_database(config, BITBLAS_DATABASE_PATH, BITBLAS_TARGET)
    op, cached = _get_or_create_bitblas_operator(config, True, BITBLAS_DATABASE_PATH, BITBLAS_TARGET)
    assert cached, "the operator should come from load_from_database, not a new tuning run"

    # process_weights_after_loading -> repack_bitblas_from_gptq(qweight, scales, None)
    b_q_weight, scales = ckpt["qweight"].to(device), ckpt["scales"].to(device)
    qweight = b_q_weight.T.contiguous().view(torch.int8)
    intweight = unpack_gptq_qweight(qweight, bits).contiguous()
    if op.weight_transform is not None:
        qweight = op.weight_transform(intweight.cpu()).to(device)
    scales = scales.T.contiguous()

    # apply_gptq_bitblas_linear
    for m in (1, 5):
        x = torch.randn(2, m, K, dtype=torch.float16).to(device)
        out_shape = x.shape[:-1] + (N,)
        output = op(x, qweight, scales).view(out_shape)
        ref = x.double().cpu() @ ref_w.T
        torch.testing.assert_close(output.double().cpu(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("sym", [False, True], ids=["asym", "sym"])
def test_vllm_bitblas_format_checkpoint(sym, device, database):
    """GPTQ in BitBLAS format: the checkpoint is what Microsoft BitBLAS's GPTQ -> BitBLAS conversion
    writes (its ``weight_transform``: the codes packed, then its LOP3Permutate, here written from its
    TIR; zero points through ``general_compress`` along N), not our own transform: vLLM hands those
    bytes to the operator as they are."""
    from bitblas import MatmulConfig
    from bitblas.cache import get_database_path
    from bitblas.quantization.utils import general_compress
    K, N, bits, group_size = 512, 256, 4, 128
    ckpt, ref_w = make_gptq(K, N, group_size, bits, sym=sym, v2=False, seed=2)
    BITBLAS_TARGET = bitblas.auto_detect_nvidia_target()
    BITBLAS_DATABASE_PATH = bitblas.cache.get_database_path()
    pack_factor = 8 // bits                     # BitBLASConfig: int8 storage

    # BitBLASLinearMethod._configure_bitblas_matmul (quant_method "gptq")
    config = MatmulConfig(N=N, K=K, A_dtype="float16", W_dtype=f"uint{bits}", out_dtype="float16",
                          accum_dtype="float16", storage_dtype="int8", with_scaling=True, with_zeros=True,
                          group_size=group_size, with_bias=False, layout="nt", zeros_mode="quantized")
    _seed_database(config, get_database_path(), BITBLAS_TARGET)
    op, cached = _get_or_create_bitblas_operator(config, True, BITBLAS_DATABASE_PATH, BITBLAS_TARGET)
    assert cached

    # create_weights_gptq: parameters shaped from the operator
    input_groups = K // group_size
    qweight = torch.empty(op.retrieve_weight_shape(), dtype=torch.int8, device=device)
    scales = torch.empty(N, input_groups, dtype=torch.float16, device=device)
    zeros = torch.empty(input_groups, N // pack_factor, dtype=torch.int8, device=device)
    assert op.propagate_b == 0        # weight_propagation attribute: no tile permutation

    # the checkpoint (a GPTQ -> BitBLAS conversion, as BitBLAS's Linear.repack_from_gptq does)
    intweight = unpack_gptq_qweight(ckpt["qweight"].T.contiguous().view(torch.int8), bits)
    ck_qweight = torch.from_numpy(bb_lop3_permutate(general_compress(intweight.cpu().numpy().astype(np.int8), bits),
                                                    bits, "float16"))
    assert op.fast_decoding and torch.equal(op.weight_transform(intweight.cpu()), ck_qweight)
    qz = ckpt["qzeros"]
    intzeros = unpack_fields(qz, bits) + 1                                   # [G, N], GPTQ v1: stored z - 1
    ck_zeros = torch.from_numpy(general_compress(intzeros.to(torch.int8).numpy(), bits, storage_dtype=np.int8))
    # the weight loader copies each tensor into its parameter
    qweight.copy_(ck_qweight)
    scales.copy_(ckpt["scales"].T)
    zeros.copy_(ck_zeros)

    # apply_gptq
    for m in (1, 7):
        x = torch.randn(m, K, dtype=torch.float16).to(device)
        x_2d = x.view(-1, x.shape[-1])
        output_2d = op(x_2d, qweight, scales, zeros)
        output = output_2d.view(x.shape[:-1] + (output_2d.shape[1],))
        ref = x.double().cpu() @ ref_w.T
        torch.testing.assert_close(output.double().cpu(), ref, rtol=2e-2, atol=2e-2)
