"""Run one GEMV kernel a few times (for ncu) and write its CUDA source: profile_gemv.py OUTDIR [R,W,U,VB]."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import bitblas  # noqa: E402
from benchmark.matmul import _rand_arg  # noqa: E402
from bitblas.build import build_plan, cuda_source  # noqa: E402
from bitblas.plan import make_plan  # noqa: E402
from bitblas.schedule import GEMVHint  # noqa: E402

out_dir = sys.argv[1]
hint = GEMVHint(*(int(x) for x in sys.argv[2].split(","))) if len(sys.argv) > 2 else None
cfg = bitblas.MatmulConfig(N=8192, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True)
plan = make_plan(cfg, "cuda", 1)
open(os.path.join(out_dir, "gemv.cu"), "w").write(cuda_source(plan, hint=hint))
fn = build_plan(plan, hint=hint)
args = [_rand_arg(s, 1, None) if s.role != "output" else torch.empty(1, 8192, dtype=torch.half, device="cuda")
        for s in plan.args]
for _ in range(5):
    fn(*args)
torch.cuda.synchronize()
print("ok")
