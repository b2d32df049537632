"""The calls GPTQModel's BitBLAS backend makes (gptqmodel/nn_modules/qlinear/bitblas.py: version
check, target normalisation and TVM_TARGET, global_operator_cache, Matmul(enable_tuning=...),
``lib`` / ``torch_func``, ``retrieve_weight_shape``, ``weight_transform``, ``general_compress`` for
zero points, the forward), mirrored in its order on CPU tensors (``cuda`` under -m gpu) and checked
against dequantize-then-matmul. GPTQModel hands BitBLAS GPTQ v2 checkpoints (zero points as is)."""
import os
import re

import pytest
import torch

import bitblas
from gptq_data import make_gptq, unpack_fields

MINIMUM_BITBLAS_VERSION = "0.1.0.post1"
BITBLAS_OPTIMIZE_FEATURES = [1, 16, 32, 64, 128, 256, 512, 1024]
BITBLAS_MAX_SUPPORTED_SM = 90


def _bitblas_target_arch(target):
    text = str(target)
    try:
        from bitblas import tvm
        return str(tvm.target.Target(text).arch)
    except Exception:
        m = re.search(r"\bsm_(\d+)[a-z]*\b", text)
        return f"sm_{m.group(1)}" if m else None


def _normalize_bitblas_target(target):
    arch = _bitblas_target_arch(target)
    m = re.search(r"sm_(\d+)", arch or "")
    if m is None:
        return target
    sm = int(m.group(1))
    if sm > BITBLAS_MAX_SUPPORTED_SM:
        return f"cuda -arch=sm_{BITBLAS_MAX_SUPPORTED_SM}"
    return f"cuda -arch=sm_{sm}" if arch != f"sm_{sm}" else target


def unpack_gptq_qzeros(qzeros, bits, is_gptq_v2=False):
    """The zero points of GPTQ qzeros words (v1 stores z - 1)."""
    zeros = unpack_fields(qzeros.view(torch.int32), bits)
    return zeros if is_gptq_v2 else zeros + 1


def unpack_gptq_qweight(qweight, bits):
    """The codes of the int8 view of GPTQ qweight words."""
    return unpack_fields(qweight.view(torch.int8), bits)


@pytest.fixture
def gptqmodel_env(tmp_path, monkeypatch):
    """import_bitblas(): version gate, log level, target (normalised, exported as TVM_TARGET),
    a per-version database path."""
    from packaging import version
    from bitblas.cache import global_operator_cache
    assert version.parse(bitblas.__version__) >= version.parse(MINIMUM_BITBLAS_VERSION)
    bitblas.set_log_level("INFO")
    old = bitblas.get_database_path()
    bitblas.set_database_path(str(tmp_path / "db"))
    target = _normalize_bitblas_target(f"cuda -arch=sm_{BITBLAS_MAX_SUPPORTED_SM}")
    monkeypatch.setenv("TVM_TARGET", f"{target}")
    database_path = f"{bitblas.cache.get_database_path()}_{bitblas.__version__}"
    global_operator_cache.clear()
    yield target, database_path
    global_operator_cache.clear()
    bitblas.set_log_level("WARNING")
    bitblas.set_database_path(None)
    if bitblas.get_database_path() != old:
        bitblas.set_database_path(old)


class _GPTQv2Module(torch.nn.Module):
    """A GPTQ v2 layer (qzero_format 2) as GPTQModel hands it to BitblasLinear.repack_from_gptq."""

    def __init__(self, tensors, bias=None):
        super().__init__()
        for k in ("qweight", "qzeros", "scales", "g_idx"):
            self.register_buffer(k, tensors[k])
        self.register_buffer("bias", bias)          # moves with .to(device), as the layer's bias does

    def qzero_format(self):
        return 2


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
def test_gptqmodel_bitblas_linear(sym, device, gptqmodel_env):
    from bitblas import Matmul, MatmulConfig
    from bitblas.cache import global_operator_cache
    from bitblas.quantization.utils import general_compress
    target, database_path = gptqmodel_env
    assert os.environ["TVM_TARGET"] == "cuda -arch=sm_90"
    assert str(bitblas.auto_detect_nvidia_target().attrs["arch"]) == "sm_90"     # TVM_TARGET honoured
    K, N, bits, group_size = 256, 128, 4, 64
    tensors, ref_w = make_gptq(K, N, group_size, bits, sym=sym, v2=True, seed=3)
    bias = torch.randn(N, dtype=torch.float16)
    gptq_module = _GPTQv2Module(tensors, bias).to(device)

    # BitblasQuantizationConfig / _configure_bitblas_matmul
    with_zeros = not sym                   # with_zeros = not is_sym and zeros_mode == "quantized"
    W_dtype = f"uint{bits}" if sym is False else f"int{bits}"
    config = MatmulConfig(M=BITBLAS_OPTIMIZE_FEATURES, N=N, K=K, A_dtype="float16", W_dtype=W_dtype,
                          out_dtype="float16", accum_dtype="float32", storage_dtype="int8", with_scaling=True,
                          with_zeros=with_zeros, group_size=group_size, with_bias=False, layout="nt",
                          zeros_mode="quantized")
    # _get_or_create_bitblas_operator (enable_tuning=False, GPTQModel's default)
    if global_operator_cache.size() == 0:
        global_operator_cache.load_from_database(database_path, target)
    op = global_operator_cache.get(config)
    if op is None:
        op = Matmul(config, target=target, enable_tuning=False)
    # _ensure_runnable_bitblas_operator
    assert getattr(op, "lib", None) is not None or callable(getattr(op, "torch_func", None))
    # _initialize_buffers
    qweight = torch.empty(op.retrieve_weight_shape(), dtype=torch.int8)
    assert list(qweight.shape) == [N, K * bits // 8]

    # repack_from_gptq (v2 zero points: unpack adds 1, then minus 1)
    packed_weight = gptq_module.qweight.detach().T.contiguous().view(torch.int8)
    intweight = unpack_gptq_qweight(packed_weight, bits).contiguous()
    intzeros = None
    if with_zeros:
        intzeros = unpack_gptq_qzeros(gptq_module.qzeros.detach(), bits).contiguous() - 1
    # _load_bitblas_quant_state
    if op.weight_transform is not None:
        qweight = op.weight_transform(intweight.cpu()).to(device)
    else:
        qweight = torch.from_numpy(general_compress(intweight.cpu().numpy(), bits)).to(device)
    scales = gptq_module.scales.detach().T.contiguous().to(torch.float16)
    if with_zeros:
        qzeros = torch.from_numpy(general_compress(intzeros.contiguous().cpu().numpy(), bits)).to(
            device=device, dtype=torch.int8).contiguous()
    # forward
    x = torch.randn(3, 5, K, dtype=torch.float16).to(device)
    x_2d = x.reshape(-1, x.shape[-1])
    args = [x_2d, qweight, scales]
    if with_zeros:
        args.append(qzeros)
    out_2d = op(*args)
    plain = out_2d
    out_2d = out_2d + gptq_module.bias
    out = out_2d.view(*x.shape[:-1], N)
    ref = x.double().cpu() @ ref_w.T + bias.double()
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-2, atol=2e-2)

    # torch_func: BitBLAS's positional convention, output last, written in place
    out2 = torch.full((x_2d.shape[0], N), float("nan"), dtype=torch.float16, device=device)
    op.torch_func(*args, out2)
    assert torch.equal(out2, plain)
