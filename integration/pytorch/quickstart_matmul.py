"""Microsoft BitBLAS QuickStart spellings against bitblas (runs on the GPU if present, else CPU).

    python integration/pytorch/quickstart_matmul.py
"""
import torch

from bitblas.ops.matmul import Matmul, MatmulConfig
from bitblas.ops.matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig
from bitblas.quantization import quantize_weight
from bitblas.utils import auto_detect_nvidia_target

device = "cuda" if torch.cuda.is_available() else "cpu"
target = auto_detect_nvidia_target()
print("target:", target)

# Dense fp16 matmul, BitBLAS style: op(input, weight, output)
matmul = Matmul(config=MatmulConfig(M=1024, N=1024, K=1024, in_dtype="float16", out_dtype="float16",
                                    accum_dtype="float16", layout="nt"), target=target)
inp = torch.rand((1024, 1024), dtype=torch.float16, device=device)
weight = torch.rand((1024, 1024), dtype=torch.float16, device=device)
output = torch.empty((1024, 1024), dtype=torch.float16, device=device)
matmul(inp, weight, output)
ref = inp.float() @ weight.float().T
print("dense max rel err:", ((output.float() - ref).abs().max() / ref.abs().max()).item())

# GPTQ-style int4 weight-only dequantize (uint4, group 128, quantized zeros)
cfg = MatmulWeightOnlyDequantizeConfig(M=[1, 32, 64], N=1024, K=1024, in_dtype="float16", out_dtype="float16",
                                       bit=4, storage_dtype="int8", source_format="uint", with_scaling=True,
                                       with_zeros=True, group_size=128, zeros_type="quantized")
op = MatmulWeightOnlyDequantize(config=cfg, target=target)
w = torch.randn(1024, 1024) * 0.05
q = quantize_weight(w, "uint4", group_size=128, with_zeros=True, zeros_mode="quantized")
W, scale, zeros = [t.to(device) for t in op.transform_weight(q.codes, q.scale, q.zeros)]
x = torch.randn(32, 1024, dtype=torch.float16, device=device)
y = op(x, W, scale, zeros)
wd = (q.codes.float() - q.zeros.float().repeat_interleave(128, 1)) * q.scale.float().repeat_interleave(128, 1)
ref = x.float().cpu() @ wd.T
print("w4a16 max rel err:", ((y.float().cpu() - ref).abs().max() / ref.abs().max()).item())
