"""The calls of the program in Microsoft BitBLAS issue #28 (int8 x int8 with a per-channel float16
scale [N, 1], a raw int8 weight without transform_weight), on the ``device`` fixture, checked
against ``(input @ weight.T) * scaling.T``."""
import torch


def test_issue28_program(device):
    import bitblas
    import torch
    bitblas.set_log_level("DEBUG")
    in_features = 4096
    out_features = 4096
    matmul_config = bitblas.MatmulConfig(
        M=1, N=out_features, K=in_features, A_dtype="int8", W_dtype="int8", accum_dtype="int32",
        out_dtype="float16", layout="nt", with_bias=False, group_size=None, with_scaling=True,
        with_zeros=False, zeros_mode=None,
    )
    matmul = bitblas.Matmul(config=matmul_config)
    scaling = torch.rand((4096, 1), dtype=torch.float16).to(device)
    input_tensor = torch.randint(0, 7, (1, 4096), dtype=torch.int8).to(device)
    weight_tensor = torch.randint(0, 7, (4096, 4096), dtype=torch.int8).to(device)
    output_tensor = matmul(input_tensor, weight_tensor, scale=scaling)

    ref = (input_tensor.double() @ weight_tensor.double().T) * scaling.double().T
    assert output_tensor.dtype == torch.float16 and output_tensor.shape == (1, 4096)
    torch.testing.assert_close(output_tensor.double(), ref, rtol=1e-3, atol=1e-2)


def test_issue28_scale_forms(device):
    """The same operator with the scale as float32 / bfloat16 / float16, shaped [N] or [N, 1]."""
    import bitblas
    cfg = bitblas.MatmulConfig(M=1, N=64, K=128, A_dtype="int8", W_dtype="int8", accum_dtype="int32",
                               out_dtype="float16", with_scaling=True, group_size=None, zeros_mode=None)
    op = bitblas.Matmul(cfg)
    A = torch.randint(-8, 8, (1, 128), dtype=torch.int8).to(device)
    W = torch.randint(-8, 8, (64, 128), dtype=torch.int8).to(device)
    s = torch.rand(64, dtype=torch.float32) + 0.5
    ref = (A.double().cpu() @ W.double().cpu().T) * s.double()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in ((64,), (64, 1)):
            sd = s.to(dtype)
            out = op(A, W, scale=sd.reshape(shape).to(device))
            want = (A.double().cpu() @ W.double().cpu().T) * sd.double()
            torch.testing.assert_close(out.double().cpu(), want, rtol=1e-3, atol=1e-2)
            assert torch.allclose(out.double().cpu(), ref, rtol=1e-2, atol=1e-1)
