"""The kernel-choice table: which kernel every untuned operator picks, and what the tuner would try.

Issue 23 refactors kernel selection (one template registry, one selector) under the constraint
"no behaviour change". This module computes, for a large fixed set of cases, everything that
selection decides without a GPU or a compile:

* ``cuda``: for (target, config, N x K, M mode, rows), the kernel an untuned ``Matmul`` runs for
  ``rows`` rows (``Matmul.choice``, i.e. ``bitblas.kernels.select``): the path (``fused`` kernel, or ``dequant-gemm``: decode, then
  the dense GEMM), the rows its plan is built for (None: symbolic in M) and its hint (for the
  dequant-gemm path, the dense GEMM's hint); plus ``default_hint`` of the plan of exactly ``rows``
  rows. With ``rows`` = M for a static M.
* ``cpu``: the same for CPU tensors (plan rows, hint), and the CPU tuner's candidate list.
* ``tune``: for (target with its DeviceSpec, config, N x K, bucket), whether ``tune`` leaves the
  bucket to decode-then-GEMM (``composite_serves``); the tuner's candidate list in order
  (``bitblas.tune.space.candidates``: its length, a digest and the count per hint class); and the
  list ``tune_bucket`` would compile and measure (the bucket's default kernel first, then the
  cost model's top 20 as ``select_topk`` keeps them), captured by running the real ``tune_bucket``
  with its compile step replaced by one that stops it.
* ``nvfp4``: NVFP4 x NVFP4 operators (``ops/nvfp4.NVFP4Matmul``): decode-then-GEMM or the GEMV, its
  rows per launch and the hints.

The local GPU's SM count enters two defaults (``Arch.sm_count``); it is pinned to 132
(its value without a GPU, and an H100's / H200's) while the table is computed, so the table is
the same on every machine.

What it calls today, and what a refactor that replaces these must re-point (the adapters here
change, the table does not): ``Matmul.choice`` (``bitblas.kernels.select``),
``kernels.default_hint``, ``plan.make_plan``, ``tune.space.candidates`` (as ``tune.tuner``
imports it), ``tune.tuner.tune_bucket`` / ``_compile_all`` / ``composite_serves``,
``ops.nvfp4.NVFP4Matmul`` (``uses_gemm``, ``_gemm_hint``, ``gemv_rows``, ``gemv_plan``) and
``arch._LOCAL_SMS`` (the local GPU's SM count).

``python -m testing.choice_table --write`` (from the repository root) regenerates the table file;
``--show CASE`` prints one case in full (the whole candidate list for ``tune`` cases), for
comparing two commits. The test is ``testing/test_choice_table.py``.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gzip
import hashlib
import json
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "choice_table.json.gz")
FORMAT_VERSION = 1

# -- the cases -------------------------------------------------------------------------------------
# CUDA targets as users give them: dicts with the devices' shared memory per block (A100, L40S,
# H100/H200), and TVM's H100 tag (48 KB of shared memory: today no wgmma kernel, see issue 23).
TARGETS = {
    "sm_80": {"kind": "cuda", "arch": "sm_80", "max_shared_memory_per_block": 166912,
              "max_threads_per_block": 1024, "thread_warp_size": 32},
    "sm_89": {"kind": "cuda", "arch": "sm_89", "max_shared_memory_per_block": 101376,
              "max_threads_per_block": 1024, "thread_warp_size": 32},
    "sm_90a": {"kind": "cuda", "arch": "sm_90a", "max_shared_memory_per_block": 232448,
               "max_threads_per_block": 1024, "thread_warp_size": 32},
    "tag-h100": "nvidia/nvidia-h100",
}

# What query_device reads from an A100 / L40S / H200 (the tuner's search space and cost model).
_SPECS = {
    "sm_80": dict(name="A100", arch="sm_80", sm_count=108, smem_per_sm=167936, smem_per_block=166912,
                  regs_per_sm=65536, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=40 * 2 ** 20,
                  dram_bandwidth=2.0e12, clock_hz=1.41e9),
    "sm_89": dict(name="L40S", arch="sm_89", sm_count=142, smem_per_sm=102400, smem_per_block=101376,
                  regs_per_sm=65536, max_threads_per_sm=1536, max_blocks_per_sm=24, l2_bytes=96 * 2 ** 20,
                  dram_bandwidth=0.86e12, clock_hz=2.52e9),
    "sm_90a": dict(name="H200", arch="sm_90", sm_count=132, smem_per_sm=233472, smem_per_block=232448,
                   regs_per_sm=65536, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=50 * 2 ** 20,
                   dram_bandwidth=4.8e12, clock_hz=1.98e9),
}

_F16 = dict(A_dtype="float16", out_dtype="float16")
_BF16 = dict(A_dtype="bfloat16", out_dtype="bfloat16")
_I8 = dict(A_dtype="int8", out_dtype="float16", with_scaling=True, with_act_scaling=True)
_I32 = dict(out_dtype="int32")
_S = dict(with_scaling=True)
_G128 = dict(with_scaling=True, group_size=128)

# (id, MatmulConfig fields besides M, N, K): every weight format, one or two scale / zero modes,
# every activation dtype.
CONFIGS: Tuple[Tuple[str, dict], ...] = (
    ("f16.f16", dict(_F16, W_dtype="float16")),
    ("f16.f16.nn.bias", dict(_F16, W_dtype="float16", layout="nn", with_bias=True)),
    ("f16.u4.g128.zo", dict(_F16, W_dtype="uint4", **_G128, with_zeros=True, zeros_mode="original")),
    ("f16.u4.g128.zq", dict(_F16, W_dtype="uint4", **_G128, with_zeros=True, zeros_mode="quantized")),
    ("f16.u4.g64.zr", dict(_F16, W_dtype="uint4", with_scaling=True, group_size=64, with_zeros=True,
                           zeros_mode="rescale")),
    ("f16.u4.pc", dict(_F16, W_dtype="uint4", **_S)),
    ("f16.u4.none", dict(_F16, W_dtype="uint4")),
    ("f16.i4.g128", dict(_F16, W_dtype="int4", **_G128)),
    ("f16.i4.pc.bias", dict(_F16, W_dtype="int4", **_S, with_bias=True)),
    ("f16.i8.pc", dict(_F16, W_dtype="int8", **_S)),
    ("f16.u8.g128", dict(_F16, W_dtype="uint8", **_G128)),
    ("f16.i2.g128", dict(_F16, W_dtype="int2", **_G128)),
    ("f16.u2.g128.zo", dict(_F16, W_dtype="uint2", **_G128, with_zeros=True)),
    ("f16.i1.g128", dict(_F16, W_dtype="int1", **_G128)),
    ("f16.u1.pc", dict(_F16, W_dtype="uint1", **_S)),
    ("f16.nf4.g64", dict(_F16, W_dtype="nf4", with_scaling=True, group_size=64)),
    ("f16.fp4.g128", dict(_F16, W_dtype="fp4_e2m1", **_G128)),
    ("f16.e4m3.pc", dict(_F16, W_dtype="float8_e4m3", **_S)),
    ("f16.e5m2.pc", dict(_F16, W_dtype="float8_e5m2", **_S)),
    ("f16.nvfp4", dict(_F16, W_dtype="nvfp4", with_scaling=True, group_size=16)),
    ("bf16.bf16", dict(_BF16, W_dtype="bfloat16")),
    ("bf16.u4.g128.zo", dict(_BF16, W_dtype="uint4", **_G128, with_zeros=True)),
    ("bf16.i4.g128", dict(_BF16, W_dtype="int4", **_G128)),
    ("bf16.i8.pc", dict(_BF16, W_dtype="int8", **_S)),
    ("bf16.i2.g128", dict(_BF16, W_dtype="int2", **_G128)),
    ("bf16.nf4.g64", dict(_BF16, W_dtype="nf4", with_scaling=True, group_size=64)),
    ("f32.u4.g128", dict(A_dtype="float32", out_dtype="float32", W_dtype="uint4", **_G128)),
    ("i8.i8.i32", dict(A_dtype="int8", W_dtype="int8", **_I32)),
    ("i8.i8.pc", dict(_I8, W_dtype="int8")),
    ("i8.i8.g128", dict(_I8, W_dtype="int8", group_size=128)),
    ("i8.i4.pc", dict(_I8, W_dtype="int4")),
    ("i8.u4.pc", dict(_I8, W_dtype="uint4")),
    ("i8.i2.g128", dict(_I8, W_dtype="int2", group_size=128)),
    ("i8.i1.i32", dict(A_dtype="int8", W_dtype="int1", **_I32)),
    ("e4m3.e4m3.pc", dict(A_dtype="float8_e4m3", W_dtype="float8_e4m3", out_dtype="float16", **_S,
                          with_act_scaling=True)),
    ("e5m2.e4m3.pc", dict(A_dtype="float8_e5m2", W_dtype="float8_e4m3", out_dtype="bfloat16", **_S,
                          with_act_scaling=True)),
    ("e4m3.e5m2.as", dict(A_dtype="float8_e4m3", W_dtype="float8_e5m2", out_dtype="float16",
                          with_act_scaling=True)),
    ("e4m3.i4.g128", dict(A_dtype="float8_e4m3", W_dtype="int4", out_dtype="bfloat16", **_G128,
                          with_act_scaling=True)),
    ("e4m3.u2.pc", dict(A_dtype="float8_e4m3", W_dtype="uint2", out_dtype="float16", **_S)),
    ("i4.i4.i32", dict(A_dtype="int4", W_dtype="int4", **_I32)),
    ("i4.i2.i32", dict(A_dtype="int4", W_dtype="int2", **_I32)),
    ("u4.u4.i32", dict(A_dtype="uint4", W_dtype="uint4", **_I32)),
)

SHAPES = ((4096, 4096), (8192, 8192), (28672, 8192), (1024, 4096), (1000, 1536))
ROWS = (1, 2, 8, 9, 16, 17, 24, 32, 48, 64, 65, 128, 1024, 4096)   # calls of a dynamic-M operator
STATIC_M = (1, 9, 48, 65, 1024)                                     # static-M operators, called with M rows

# The tuner: fewer cases (listing and ranking ~2000 candidates takes ~50 ms a bucket).
TUNE_TARGETS = ("sm_80", "sm_89", "sm_90a")
TUNE_CONFIGS = ("f16.f16", "f16.u4.g128.zo", "f16.i4.pc.bias", "f16.i8.pc", "f16.i2.g128", "f16.nf4.g64",
                "bf16.u4.g128.zo", "i8.i8.pc", "i8.i4.pc", "e4m3.e4m3.pc", "i4.i4.i32")
# (N, K): (buckets of a dynamic-M operator, static Ms)
TUNE_SHAPES = {(4096, 4096): ((1, 8, 16, 48, 128, 4096), (1024,)),
               (1000, 1536): ((1, 4096), ())}
TOPK = 20

NVFP4_SHAPES = ((4096, 4096), (28672, 8192), (1024, 4096))
NVFP4_ROWS = (1, 2, 7, 8, 9, 16, 17, 64, 1024)

SMS = 132     # the local GPU's SM count (bitblas.arch) while the table is computed


def _case_id(*parts) -> str:
    return "/".join(str(p) for p in parts)


def _mode(M) -> str:
    return "Mdyn" if M is None else f"M{M}"


# -- computing -------------------------------------------------------------------------------------
class _Hints:
    """Hints interned as plain dicts (``hint_to_dict``): the table stores indices into a list."""

    def __init__(self):
        self.dicts: List[dict] = []
        self._index: Dict[str, int] = {}

    def __call__(self, hint) -> Optional[int]:
        if hint is None:
            return None
        from bitblas.schedule import hint_to_dict
        d = hint_to_dict(hint)
        key = json.dumps(d, sort_keys=True)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.dicts)
            self.dicts.append(d)
        return i


@contextlib.contextmanager
def _pinned_sms():
    from bitblas import arch
    saved = list(arch._LOCAL_SMS)
    arch._LOCAL_SMS[:] = [SMS]
    try:
        yield
    finally:
        arch._LOCAL_SMS[:] = saved


class _Stop(Exception):
    def __init__(self, cands):
        super().__init__("compile step reached")
        self.cands = list(cands)


@contextlib.contextmanager
def _no_compile(seen: list):
    """``tune_bucket`` up to its first compile: that step raises :class:`_Stop` with what it was
    given; the candidate lists the tuner asks for are appended to ``seen``."""
    from bitblas.tune import tuner

    def stop(config, kind, cands, *args, **kwargs):
        raise _Stop(cands)

    def recorded(*args, **kwargs):
        out = saved[1](*args, **kwargs)
        seen.append(list(out))
        return out

    def dequant_default(config, rows, hint, target):
        """The decode-then-GEMM default (built in tune_bucket, not by _compile_all): recorded, not built."""
        seen.append(("dequant-gemm", rows, hint))
        return {"ok": False, "error": "not built", "seconds": 0.0, "path": None}

    saved = tuner._compile_all, tuner.candidates, tuner._dequant_gemm_entry
    tuner._compile_all, tuner.candidates, tuner._dequant_gemm_entry = stop, recorded, dequant_default
    try:
        yield
    finally:
        tuner._compile_all, tuner.candidates, tuner._dequant_gemm_entry = saved


def _cand_rows(hints: _Hints, cands) -> List[list]:
    return [[c.plan_m, hints(c.hint)] for c in cands]


def _hint_key(hint) -> str:
    """The hint's class and fields (what ``hint_to_dict`` holds; a few times cheaper to make)."""
    return f"{type(hint).__name__}{sorted(vars(hint).items())}"


def _digest(cands) -> dict:
    """A candidate list as its length, a digest of the (plan rows, hint) pairs in order and the
    count of each hint class."""
    text = "\n".join(f"{c.plan_m} {_hint_key(c.hint)}" for c in cands)
    classes = collections.Counter(type(c.hint).__name__ for c in cands)
    return {"n": len(cands), "sha": hashlib.sha256(text.encode()).hexdigest()[:16],
            "classes": dict(sorted(classes.items()))}


def _configs():
    from bitblas import MatmulConfig
    for cid, fields in CONFIGS:
        for N, K in SHAPES:
            for M in (None,) + STATIC_M:
                yield cid, N, K, M, MatmulConfig(M=M, N=N, K=K, **fields)


def _cuda_cases(hints: _Hints, out: dict, cpu: dict) -> None:
    from bitblas import Matmul
    from bitblas.build import cuda_target
    from bitblas.plan import make_plan
    from bitblas.kernels import default_hint
    from bitblas.tune.space import candidates
    targets = {name: cuda_target(t) for name, t in TARGETS.items()}
    for cid, N, K, M, cfg in _configs():
        rows_list = ROWS if M is None else (M,)
        for tname, tgt in targets.items():
            op = Matmul(cfg, target=tgt)
            kc = op._kc
            for rows in rows_list:
                c = op.choice("cuda", rows)
                path = "dequant-gemm" if c.template == "dequant-gemm" else "fused"
                m, hint = c.rows, c.hint
                plan_default = default_hint(make_plan(kc, "cuda", rows), tgt)
                out[_case_id(tname, cid, f"{N}x{K}", _mode(M), f"r{rows}")] = [path, m, hints(hint),
                                                                              hints(plan_default)]
        op = Matmul(cfg, target="llvm")
        kc = op._kc
        base = _case_id("cpu", cid, f"{N}x{K}", _mode(M))
        for rows in rows_list:
            c = op.choice("cpu", rows)
            cpu[_case_id(base, f"r{rows}")] = [c.rows, hints(c.hint)]
        cpu[_case_id(base, "candidates")] = _digest(candidates(kc, "cpu", rows_list[-1]))


def _tune_cases(hints: _Hints, out: dict, seen: list) -> None:
    from bitblas import MatmulConfig
    from bitblas.build import cuda_target
    from bitblas.hardware import DeviceSpec
    from bitblas.ops.compat import kernel_config
    from bitblas.tune.space import candidates
    from bitblas.tune.tuner import composite_serves, tune_bucket
    fields = dict(CONFIGS)
    for tname in TUNE_TARGETS:
        tgt = cuda_target(TARGETS[tname])
        spec = DeviceSpec(**_SPECS[tname])
        for cid in TUNE_CONFIGS:
            for (N, K), (buckets, static) in TUNE_SHAPES.items():
                for M in (None,) + static:
                    cfg = kernel_config(MatmulConfig(M=M, N=N, K=K, **fields[cid]))
                    for bucket in (buckets if M is None else (M,)):
                        past = composite_serves(cfg, "cuda", bucket, tgt)
                        entry = {"composite": past is not None}
                        seen.clear()
                        try:
                            res = tune_bucket(cfg, "cuda", bucket, tgt, spec, topk=TOPK, parallel=False,
                                              workdir="unused: the compile step stops the run", past_gemv=past)
                        except _Stop as stop:
                            entry.update(_digest(seen[0]))
                            dq = [x for x in seen[1:] if isinstance(x, tuple)]    # the decode-then-GEMM default
                            entry["measured"] = ([[dq[0][1], ["dequant-gemm", hints(dq[0][2])]]] if dq else []) + \
                                _cand_rows(hints, stop.cands)
                        else:    # a bucket past the GEMV that no fused tile takes: skipped, nothing built
                            if not (past and res.skipped and res.hint is None):     # pragma: no cover
                                raise RuntimeError("tune_bucket ran past its compile step")
                            entry.update(_digest(seen[0]))
                            entry["skipped"] = True
                        out[_case_id(tname, cid, f"{N}x{K}", _mode(M), f"b{bucket}")] = entry


def _nvfp4_cases(hints: _Hints, out: dict) -> None:
    from bitblas import MatmulConfig
    from bitblas.build import cuda_target
    from bitblas.ops.nvfp4 import NVFP4Matmul
    from bitblas.plan import make_plan
    from bitblas.kernels import default_hint
    targets = {name: cuda_target(t) for name, t in TARGETS.items()}
    for N, K in NVFP4_SHAPES:
        cfg = MatmulConfig(M=None, N=N, K=K, A_dtype="nvfp4", W_dtype="nvfp4", with_scaling=True,
                           group_size=16, with_act_scaling=True, out_dtype="bfloat16")
        for tname, tgt in targets.items():
            nv = NVFP4Matmul(cfg, lambda tgt=tgt: tgt)
            for rows in NVFP4_ROWS:
                if nv.uses_gemm(rows):
                    entry = ["dequant-gemm", None, [None, hints(nv._gemm_hint(rows))]]
                else:
                    step = nv.gemv_rows()       # launches of ``step`` rows, then the rest
                    entry = ["gemv", step] + [[r, hints(default_hint(nv.gemv_plan(r), tgt))]
                                              for r in sorted({min(rows, step), rows % step} - {0})]
                out[_case_id(tname, "nvfp4.nvfp4", f"{N}x{K}", "Mdyn", f"r{rows}")] = entry
        out[_case_id("cpu", "nvfp4.nvfp4", f"{N}x{K}", "Mdyn", "any")] = [
            "cpu", None, [None, hints(default_hint(make_plan(nv._kcfg, "cpu", None)))]]


def compute() -> dict:
    """The table as it is today (plain JSON data)."""
    import logging
    hints = _Hints()
    cuda, cpu, tune, nvfp4 = {}, {}, {}, {}
    quiet = logging.getLogger("bitblas")
    level = quiet.level
    quiet.setLevel(logging.WARNING)     # DeviceSpec / tuner info lines
    try:
        seen = []
        with _pinned_sms(), _no_compile(seen):
            _cuda_cases(hints, cuda, cpu)
            _tune_cases(hints, tune, seen)
            _nvfp4_cases(hints, nvfp4)
    finally:
        quiet.setLevel(level)
    return {"version": FORMAT_VERSION, "generated_by": "python -m testing.choice_table --write",
            "hints": hints.dicts, "cuda": cuda, "cpu": cpu, "tune": tune, "nvfp4": nvfp4}


# -- comparing -------------------------------------------------------------------------------------
SECTIONS = ("cuda", "cpu", "tune", "nvfp4")


def _resolve(value, hints: List[dict], section: str):
    """A stored value with hint indices replaced by the hint dicts (comparable across tables)."""
    if section == "cuda":
        path, m, h, pd = value
        return {"path": path, "rows": m, "hint": hints[h], "plan_default": hints[pd]}
    if section == "cpu":
        if isinstance(value, dict):
            return value
        return {"rows": value[0], "hint": hints[value[1]]}
    if section == "nvfp4":
        return {"path": value[0], "rows": value[1], "kernels": [{"rows": r, "hint": hints[h]} for r, h in value[2:]]}
    v = dict(value)
    if "measured" in v:
        v["measured"] = [{"rows": m, "path": "dequant-gemm", "hint": hints[h[1]]} if isinstance(h, list)
                         else {"rows": m, "hint": hints[h]} for m, h in v["measured"]]
    return v


def entries(table: dict, sections=SECTIONS) -> Iterator[Tuple[str, str, object]]:
    """(section, case id, resolved value) of every case of a table (of ``sections``)."""
    for section in sections:
        for case, value in table[section].items():
            yield section, case, _resolve(value, table["hints"], section)


def count_cases(table: dict) -> Dict[str, int]:
    return {s: len(table[s]) for s in SECTIONS}


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 400 else text[:400] + " ..."


def _narrow(a, b):
    """``a`` and ``b`` with the dict fields they share unchanged left out (a hint's class kept);
    lists as their first three differing items ``[i]`` (and ``len`` where the lengths differ)."""
    if isinstance(a, list) and isinstance(b, list):
        x, y = {}, {}
        if len(a) != len(b):
            x["len"], y["len"] = len(a), len(b)
        for i in [i for i in range(max(len(a), len(b))) if a[i:i + 1] != b[i:i + 1]][:3]:
            x[f"[{i}]"], y[f"[{i}]"] = _narrow(a[i] if i < len(a) else "<none>", b[i] if i < len(b) else "<none>")
        return x, y
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return a, b
    x, y = {}, {}
    for k in sorted(set(a) | set(b)):
        if k in a and k in b and a[k] == b[k] and k != "class":
            continue
        x[k], y[k] = _narrow(a.get(k, "<none>"), b.get(k, "<none>"))
    if set(x) == {"class"}:       # only the kept class: the values are equal
        return {}, {}
    return x, y


def diff(before: dict, after: dict, sections=SECTIONS, limit: int = 12) -> Tuple[int, List[str]]:
    """(number of cases of ``sections`` that differ, lines describing them: how many per target and
    config, then the first ``limit``: the case, its fields that differ before and after)."""
    old = {(s, c): v for s, c, v in entries(before, sections)}
    new = {(s, c): v for s, c, v in entries(after, sections)}
    lines, where = [], collections.Counter()
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key, "<no such case>"), new.get(key, "<no such case>")
        if a == b:
            continue
        where["/".join(key[1].split("/")[:2])] += 1
        if sum(where.values()) <= limit:
            a, b = _narrow(a, b)
            lines += [f"{key[0]} {key[1]}", f"  before: {_short(a)}", f"  after:  {_short(b)}"]
    n = sum(where.values())
    if n:
        top = where.most_common(16)
        lines.insert(0, "differing cases per target/config: " + ", ".join(f"{k} {v}" for k, v in top)
                     + (f" and {len(where) - len(top)} more" if len(where) > len(top) else ""))
        if n > limit:
            lines.append(f"... and {n - limit} more")
    return n, lines


# -- the file --------------------------------------------------------------------------------------
def _grouped(flat: dict) -> dict:
    """{case id: value} as {case id up to its last part: {last part: value}} (a smaller file)."""
    out: Dict[str, dict] = {}
    for case, value in flat.items():
        head, _, last = case.rpartition("/")
        out.setdefault(head, {})[last] = value
    return out


def _flat(grouped: dict) -> dict:
    return {f"{head}/{last}": value for head, group in grouped.items() for last, value in group.items()}


def load(path: str = TABLE_PATH) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        table = json.load(f)
    if table.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: table format {table.get('version')!r}, this code reads {FORMAT_VERSION}")
    return {k: _flat(v) if k in SECTIONS else v for k, v in table.items()}


def write(table: dict, path: str = TABLE_PATH) -> int:
    """Write ``table`` (gzip, mtime 0: the same table gives the same bytes); returns its size."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = json.dumps({k: _grouped(v) if k in SECTIONS else v for k, v in table.items()},
                      separators=(",", ":")).encode()
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
        f.write(data)
    os.replace(tmp, path)
    return os.path.getsize(path)


def _check_source() -> None:
    """Refuse to describe another checkout's bitblas (e.g. the editable install of another tree)."""
    import bitblas
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(bitblas.__file__)))
    if os.path.realpath(here) != os.path.realpath(pkg):
        sys.exit(f"bitblas is imported from {pkg}, not from this checkout ({here}); run "
                 "`python -m testing.choice_table` from the repository root")


def _show(case: str) -> None:
    """Print one case of the current code in full; a tune case with its whole candidate list."""
    table = compute()
    hits = [(s, v) for s, c, v in entries(table) if c == case]
    if not hits:
        sys.exit(f"no case {case!r}; cases look like {next(iter(table['cuda']))!r}")
    for section, value in hits:
        print(section, case)
        print(json.dumps(value, indent=1, sort_keys=True))
        if section == "tune":
            from bitblas import MatmulConfig
            from bitblas.hardware import DeviceSpec
            from bitblas.ops.compat import kernel_config
            from bitblas.schedule import hint_to_dict
            from bitblas.tune.space import candidates
            tname, cid, shape, mode, b = case.split("/")
            N, K = map(int, shape.split("x"))
            M = None if mode == "Mdyn" else int(mode[1:])
            cfg = kernel_config(MatmulConfig(M=M, N=N, K=K, **dict(CONFIGS)[cid]))
            with _pinned_sms():
                for c in candidates(cfg, "cuda", int(b[1:]), DeviceSpec(**_SPECS[tname])):
                    print(c.plan_m, json.dumps(hint_to_dict(c.hint), sort_keys=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m testing.choice_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"regenerate {os.path.relpath(TABLE_PATH)}")
    p.add_argument("--show", metavar="CASE", help="print one case of the current code in full")
    args = p.parse_args(argv)
    _check_source()
    if args.show:
        _show(args.show)
        return 0
    table = compute()
    counts = count_cases(table)
    if args.write:
        size = write(table)
        print(f"wrote {TABLE_PATH}: {sum(counts.values())} cases {counts}, {len(table['hints'])} distinct hints, "
              f"{size} bytes")
        return 0
    n, lines = diff(load(), table)
    print("\n".join(lines))
    print(f"{n} of {sum(counts.values())} cases differ from {TABLE_PATH}")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
