"""The user calls of Microsoft BitBLAS's docs/QuickStart.md examples, one test per example.

The documented calls (config fields, ``transform_weight``, the ``scale=`` / ``zeros=`` keywords,
``Linear.load_and_transform_weight`` and a ``./model.pth`` state-dict round trip) are what is checked,
with the example's tolerances. Tensors are made on the ``device`` fixture; each test runs in a
fresh temporary working directory.
"""
import pytest
import torch

import bitblas
from reference_packers import autogptq_quantlinear
from compat_marks import out_of_scope


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_quickstart_w_int4_a_fp16(device):
    """docs/QuickStart.md, "W_INT4 A_FP16 mixed-precision matrix multiplication" """
    bitblas.set_log_level("Debug")
    config = bitblas.MatmulConfig(M=1, N=1024, K=1024, A_dtype="float16", W_dtype="int4", accum_dtype="float16",
                                  out_dtype="float16", layout="nt", with_bias=False, group_size=None,
                                  with_scaling=False, with_zeros=False, zeros_mode=None)
    op = bitblas.Matmul(config=config)
    x = torch.rand((1, 1024), dtype=torch.float16).to(device)
    w = torch.randint(0, 7, (1024, 1024), dtype=torch.int8).to(device)
    out = op(x, op.transform_weight(w))
    expected = (x.double() @ w.double().T).half()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-0)


def test_quickstart_scaling_and_zeros(device):
    """docs/QuickStart.md, the uint4 example with scaling and 'original' zero points"""
    K = N = 1024
    group_size = 128
    config = bitblas.MatmulConfig(M=1, N=N, K=K, A_dtype="float16", W_dtype="uint4", accum_dtype="float16",
                                  out_dtype="float16", layout="nt", with_bias=False, group_size=group_size,
                                  with_scaling=True, with_zeros=True, zeros_mode="original")
    op = bitblas.Matmul(config=config)
    scaling = torch.rand((N, K // group_size), dtype=torch.float16).to(device)
    zeros = torch.rand((N, K // group_size), dtype=torch.float16).to(device)
    x = torch.rand((1, K), dtype=torch.float16).to(device)
    w = torch.randint(0, 7, (N, K), dtype=torch.int8).to(device)
    out = op(x, op.transform_weight(w), scale=scaling, zeros=zeros)
    # the example's reference: each weight element (w - zero point) * scale, rounded to float16
    per_col = torch.arange(K, device=w.device) // group_size
    w_ref = (w.half() - zeros[:, per_col]) * scaling[:, per_col]
    expected = (x.float() @ w_ref.float().T).half()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


def test_quickstart_bitblas_linear(device):
    """docs/QuickStart.md, "bitblas.Linear module for PyTorch"

    The example ends at the forward; here its output is also compared with the reference, as in the
    first example (rtol=1e-2, atol=1e0), and with the output before the state-dict round trip."""
    bitblas.set_log_level("Debug")
    model = bitblas.Linear(in_features=1024, out_features=1024, bias=False, A_dtype="float16", W_dtype="int4",
                           accum_dtype="float16", out_dtype="float16", group_size=None, with_scaling=False,
                           with_zeros=False, zeros_mode=None, opt_M=[1, 16, 32, 64, 128])
    codes = torch.randint(-7, 7, (1024, 1024), dtype=torch.int8).to(device)
    model.load_and_transform_weight(codes)
    x = torch.randn(1, 1024, dtype=torch.float16).to(device)
    before = model(x)

    torch.save(model.state_dict(), "./model.pth")
    model.load_state_dict(torch.load("./model.pth"))
    model.eval()
    out = model(x)
    assert torch.equal(out, before)
    torch.testing.assert_close(out, (x.double() @ codes.double().T).half(), rtol=1e-2, atol=1e0)


def test_quickstart_repack_from_autogptq(device):
    """docs/QuickStart.md, repacking an auto_gptq QuantLinear into bitblas.Linear (skipped without auto_gptq)"""
    QuantLinear = autogptq_quantlinear()

    bitblas.set_log_level("Debug")
    K = N = 1024
    group_size = 128
    _, fake_quant, scales, _ = bitblas.quantization.gen_quant4(K, N, group_size)
    gptq_layer = QuantLinear(bits=4, group_size=group_size, infeatures=K, outfeatures=N, bias=False)
    gptq_layer.pack(fake_quant, scales.T, torch.full((K // group_size, N), 7, dtype=torch.int32).T, g_idx=None)
    layer = bitblas.Linear(in_features=K, out_features=N, bias=False, A_dtype="float16", W_dtype="uint4",
                           accum_dtype="float16", out_dtype="float16", group_size=group_size, with_scaling=True,
                           with_zeros=True, zeros_mode="quantized")
    layer.repack_from_gptq(gptq_layer)

    x = torch.rand(1, K, dtype=torch.float16, device=device)
    gptq_layer, layer = gptq_layer.to(device), layer.to(device)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), gptq_layer(x), rtol=1e-0, atol=1e-1)


@out_of_scope("bitblas.FlashAtten")
def test_quickstart_flashatten():
    """docs/QuickStart.md, the FlashAtten example"""
