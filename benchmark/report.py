"""docs/performance.md from the JSON of ``python -m benchmark.matmul``: one table per weight format.

    python -m benchmark.report results.json [more.json ...] > docs/performance.md

Each table has one line per (layer, rows): our kernel and its time, the torch baseline timed in the
same run (cuBLAS fp16 ``F.linear``; ``torch._int_mm`` for int8 activations, ``torch._scaled_mm``
for float8 ones) and its time, the ratio (torch µs / ours: above 1 is faster than torch), and for
up to ``--floor-rows`` rows (memory-bound: the time is the bytes moved) the byte floor, the row's
bytes over the copy rate measured in the same run (or over ``--floor-tbps``, a rate given for the
card: a copy's mixed reads and writes run below the rate at which a GEMV reads, e.g. 2.77 TB/s
against the 4.25 the project cites for the H200), with the share of it reached. Several files are
merged (a later file's row replaces an earlier one's for the same format, layer and rows); the page
names the command, device, commit and date of each run it uses. The JSON of ``python -m
benchmark.nvfp4`` adds one table: the NVFP4 x NVFP4 batched GEMV, GEMM and NVFP4-weight rows.

``--base PAGE`` starts from a page this script wrote (its runs and rows as the page shows them,
:func:`unpack`), so that the page stays whole when the JSON of its earlier runs is gone: the given
files' rows replace the page's rows of the same key, and the page's runs left with no row are dropped.

    python -m benchmark.report --base docs/performance.md --floor-tbps 4.25 new.json > page.md
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

__all__ = ["render", "unpack", "main"]

# the first lines of the page; the README and docs/architecture.md link here
TITLE = "# Performance"


def _describe(fmt: str) -> str:
    """'A float16 × W uint4, group 128, scales, zeros' for a benchmark.matmul format name."""
    from benchmark.matmul import FORMATS
    kw = FORMATS.get(fmt)
    if kw is None:
        return fmt
    parts = [f"A {kw['A_dtype']} × W {kw['W_dtype']}"]
    g = kw.get("group_size")
    if kw.get("with_scaling"):
        parts.append(f"scales per group of {g}" if g else "scales per output channel")
    if kw.get("with_zeros"):
        parts.append(f"zero points ({kw.get('zeros_mode', 'original')})")
    if kw.get("with_act_scaling"):
        parts.append("per-token activation scales")
    parts.append(f"out {kw.get('out_dtype', 'float16')}")
    if kw.get("fast_decoding") is False:
        parts.append("natural code order (fast_decoding=False)")
    return ", ".join(parts)


# benchmark.nvfp4's rows (``kind``): the batched GEMV, the GEMM, NVFP4 weights x float16 at one row
NVFP4_KINDS = ("gemv", "gemm", "w-only")


def _nvfp4_key(r: dict) -> Tuple:
    return (NVFP4_KINDS.index(r["kind"]), r["M"], r.get("N", 0), r["K"], r.get("L", 1))


def _source_name(src) -> str:
    """A JSON path as given, or a loaded run's ``path`` (:func:`unpack`)."""
    return src if isinstance(src, str) else src.get("path", "?")


def _load(sources: Sequence):
    """(runs, benchmark.matmul rows by (format, layer, N, K, m), benchmark.nvfp4 rows by
    :func:`_nvfp4_key`), each row with its run's number; a later file's row replaces an earlier one's.
    ``sources``: JSON paths, or loaded objects with their ``path`` (:func:`unpack`'s runs). Runs of a
    base page (``from_page``) left without a row are dropped and the rest renumbered."""
    runs, rows, nv = [], {}, {}
    for src in sources:
        if isinstance(src, dict):
            data, path = src, _source_name(src)
        else:
            path = src
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{path}: not a benchmark.matmul / benchmark.nvfp4 JSON (expected an object with a "
                             "'rows' list)")
        runs.append(dict(data, path=path, rows=None))
        for r in data["rows"]:
            if "kind" in r:                  # benchmark.nvfp4; its hint sweep left out
                if r["kind"] in NVFP4_KINDS:
                    nv[_nvfp4_key(r)] = (len(runs), r)
                continue
            if r.get("format", "").endswith("(torch)") or r.get("hint"):
                continue                     # baselines appear beside each of our rows; hint trials left out
            # the layer as the page shows it: "square-8k/square-8k" and "brief/square-8k" are one layer
            rows[(r["format"], r["layer"].split("/")[-1], r["N"], r["K"], r["m"])] = (len(runs), r)
    used = {i for i, _ in rows.values()} | {i for i, _ in nv.values()}
    used = [i for i in range(1, len(runs) + 1) if i in used or not runs[i - 1].get("from_page")]
    new = {old: k for k, old in enumerate(used, 1)}
    runs = [runs[i - 1] for i in used]
    rows = {k: (new[i], r) for k, (i, r) in rows.items()}
    nv = {k: (new[i], r) for k, (i, r) in nv.items()}
    return runs, rows, nv


_RUN = re.compile(r"^Run(?: (?P<n>\d+))?: (?P<device>.*?), (?P<date>[^,]*), commit (?P<commit>\S+), "
                  r"torch (?P<torch>\S+), (?:copy rate (?P<rate>[0-9.eE+-]+) TB/s|no copy rate recorded) "
                  r"\(`(?P<file>[^`]*)`\):$")
_LAYER = re.compile(r"^(?P<name>.*) \((?P<N>\d+)×(?P<K>\d+)\)$")
_NV_SHAPE = re.compile(r"^M=(?P<M>\d+)(?: N=(?P<N>\d+))? K=(?P<K>\d+)(?: L=(?P<L>\d+))?(?: \((?P<fmt>.*)\))?$")


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _num(cell: str) -> Optional[float]:
    try:
        return float(cell)
    except ValueError:
        return None


def unpack(text: str) -> List[dict]:
    """The runs of a page :func:`render` wrote, as benchmark JSON objects (``path``: the run's file
    name) whose rows carry the cells the page shows them with (``page_cells``, rendered as they are,
    their run column renumbered; ``page_section``: the format's place on the page, which render keeps):
    render(unpack(page)) gives the page back at the page's floor rate, but for runs no row uses
    (``from_page``: dropped) and the batched GEMV's geometric mean (from the times and floors as shown)."""
    lines = text.splitlines()
    runs: List[dict] = []
    fmt = None
    nvfp4 = False
    sections = 0
    for i, line in enumerate(lines):
        m = _RUN.match(line)
        if m:
            cmd = next((x.strip() for x in lines[i + 1:i + 3] if x.startswith("    ")), "")
            runs.append(dict(device=m["device"], date=m["date"], commit=m["commit"], torch=m["torch"],
                             copy_tbps=float(m["rate"]) if m["rate"] else None, command=cmd, path=m["file"],
                             from_page=True, rows=[]))
            continue
        if line.startswith("## "):
            sections += 1
            nvfp4 = line.startswith("## nvfp4 × nvfp4")
            fmt = None if nvfp4 else line[3:].strip()
            continue
        if not line.startswith("| ") or line.startswith("| layer") or line.startswith("| row |"):
            continue
        cells = _cells(line)
        many = len(runs) > 1
        run = int(cells.pop()) if many else 1
        if not runs or not 1 <= run <= len(runs):
            raise ValueError(f"page line {i + 1}: run {run} not among the page's {len(runs)} runs")
        if nvfp4:
            s = _NV_SHAPE.match(cells[1])
            if cells[0] not in NVFP4_KINDS or s is None:
                raise ValueError(f"page line {i + 1}: not an nvfp4 row: {line!r}")
            r = dict(kind=cells[0], M=int(s["M"]), K=int(s["K"]), page_cells=cells)
            if s["N"]:
                r["N"] = int(s["N"])
            if s["L"]:
                r["L"] = int(s["L"])
            if s["fmt"]:
                r["fmt"] = s["fmt"]
            if _num(cells[3]) is not None:
                r["us"] = _num(cells[3])
            if _num(cells[7]) is not None:    # the floor as shown (at the page's rate)
                r["floor_us"] = _num(cells[7])
        elif fmt is not None:
            lay = _LAYER.match(cells[0])
            if lay is None:
                raise ValueError(f"page line {i + 1}: no 'layer (N×K)' in {line!r}")
            r = dict(format=fmt, layer=lay["name"], N=int(lay["N"]), K=int(lay["K"]), m=int(cells[1]),
                     page_cells=cells, page_section=sections)
        else:
            continue
        runs[run - 1]["rows"].append(r)
    if not runs:
        raise ValueError("no 'Run ...:' lines: not a page benchmark.report wrote")
    return runs


def _nvfp4_section(runs, nv, floor_tbps: Optional[float], many: bool) -> List[str]:
    """The NVFP4 x NVFP4 table: the batched GEMV on issue 25's permuted layouts (beside torch's decode
    + bmm), the GEMM (beside cuBLAS float16) and NVFP4 weights x float16 activations at one row; the
    byte floors (the bytes benchmark.nvfp4 counts) at ``floor_tbps`` or each run's copy rate, and the
    batched GEMV's geometric mean of time / floor."""
    from benchmark.nvfp4 import HBM_TBPS      # the rate benchmark.nvfp4's floor_us is at
    out = ["## nvfp4 × nvfp4 (`python -m benchmark.nvfp4`)", "",
           "The batched GEMV (`bitblas.ops.nvfp4_gemv` on issue 25's permuted layouts; the torch baseline "
           "decodes both operands, then `torch.bmm`), the GEMM through `Matmul` (cuBLAS float16 on the same "
           "shape with randn operands, and where measured on our decoded operands: the tensor cores' clock "
           "follows the data), NVFP4 weights × float16 activations at one row.", ""]
    head = ["row", "shape", "kernel", "µs", "torch baseline", "torch µs", "vs torch", "byte floor µs",
            "% floor"] + (["run"] if many else [])
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" if h in ("row", "shape", "kernel", "torch baseline") else "---:"
                              for h in head) + "|")
    ratios = []
    for k in sorted(nv):
        run_i, r = nv[k]
        kind = r["kind"]
        shape = (f"M={r['M']} K={r['K']} L={r['L']}" if kind == "gemv"
                 else f"M={r['M']} N={r['N']} K={r['K']}" + (f" ({r['fmt']})" if r.get("fmt") else ""))
        if r.get("page_cells"):              # carried from a page (--base): as it showed them
            cells = list(r["page_cells"])
            if kind == "gemv" and r.get("us") and r.get("floor_us"):
                ratios.append(r["us"] / r["floor_us"])
        elif "us" not in r:
            cells = [kind, shape, "error", str(r.get("error", "?"))[:120].replace("|", "/"), "", "", "", "", ""]
        else:
            rate = floor_tbps or runs[run_i - 1].get("copy_tbps")
            floor = r["floor_us"] * HBM_TBPS / rate if r.get("floor_us") and rate else None
            base, base_us = (("decode + torch.bmm", r.get("torch_us")) if kind == "gemv" else
                             ("cublas-fp16", r.get("cublas_fp16_us")) if kind == "gemm" else ("", None))
            if kind == "gemm" and r.get("cublas_same_data_us"):
                # the tensor cores' clock follows the data: cuBLAS on the same decoded operands as ours too
                same = r["cublas_same_data_us"]
                base += f"; on our decoded operands {_us(same)} µs ({same / r['us']:.2f}×)"
            kernel = r.get("hint", "").replace("default ", "") if kind == "gemv" else r.get("path") or r.get("kernel")
            if kind == "gemv" and floor:
                ratios.append(r["us"] / floor)
            cells = [kind, shape, f"`{kernel}`", _us(r["us"]), base, _us(base_us) if base_us else "",
                     f"{base_us / r['us']:.2f}×" if base_us else "", _us(floor) if floor else "",
                     _pct(floor / r["us"]) if floor else ""]
        if many:
            cells.append(str(run_i))
        out.append("| " + " | ".join(cells) + " |")
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out += ["", f"Batched GEMV: geometric mean of time / byte floor over {len(ratios)} shapes: {gm:.3f}."]
    return out + [""]


def _us(v) -> str:
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def render(paths: Sequence, floor_rows: int = 64, floor_tbps: Optional[float] = None) -> str:
    """The markdown page for these JSON files (or loaded runs, :func:`unpack`'s); ``floor_tbps``: the
    byte floors' rate (TB/s) instead of each run's measured copy rate."""
    if floor_tbps is not None and not floor_tbps > 0:
        raise ValueError(f"floor_tbps={floor_tbps!r}: a rate in TB/s > 0 is required")
    runs, rows, nv = _load(paths)
    if not rows and not nv:
        raise ValueError(f"no timed rows of ours in {', '.join(_source_name(p) for p in paths)}")
    many = len(runs) > 1
    out = [TITLE, "",
           "Generated by `python -m benchmark.report` from the JSON of `python -m benchmark.matmul` (and of "
           "`python -m benchmark.nvfp4`); "
           "do not edit by hand, re-run the benchmark and the script. Times are µs per call: on a GPU the median of "
           "CUDA-graph replays cycling over weight copies larger than the L2 (weights come from memory), with "
           "`--device cpu` the median of host-clock timings. "
           "**vs torch** is the torch baseline's time over ours (above 1: faster than torch). The **byte floor** "
           f"(up to {floor_rows} rows, where the time is the bytes moved) is the row's bytes (weights, scales, zeros, "
           "activations, output) over "
           + (f"{floor_tbps:g} TB/s (`--floor-tbps {floor_tbps:g}`, the card's rate; each run's measured copy rate, "
              "reads and writes of a 1 GB copy, is listed with it)" if floor_tbps
              else "the copy rate measured in the same run")
           + "; **% floor** is floor / ours.", ""]
    for i, run in enumerate(runs, 1):
        label = f"Run {i}" if many else "Run"
        out.append(f"{label}: {run.get('device', '?')}, {run.get('date', 'date not recorded')}, "
                   f"commit {run.get('commit') or '?'}, torch {run.get('torch', '?')}, "
                   + (f"copy rate {run['copy_tbps']:.3g} TB/s" if run.get("copy_tbps") else "no copy rate recorded")
                   + f" (`{os.path.basename(run['path'])}`):")
        cmd = run.get("command") or ("python -m benchmark.matmul " + " ".join(run.get("argv", [])[1:]))
        out += ["", f"    {cmd}", ""]
    # formats in the order of their first row; those a base page showed (--base) in its order, first
    section = {}
    for k, (_, r) in rows.items():
        if "page_section" in r:
            section[k[0]] = min(section.get(k[0], math.inf), r["page_section"])
    fmts = sorted(dict.fromkeys(k[0] for k in rows), key=lambda f: section.get(f, math.inf))
    for fmt in fmts:
        out += [f"## {fmt}", "", _describe(fmt) + ".", ""]
        head = ["layer (N×K)", "rows", "kernel", "µs", "torch baseline", "torch µs", "vs torch",
                "byte floor µs", "% floor"] + (["run"] if many else [])
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---:" if h in ("rows", "µs", "torch µs", "vs torch", "byte floor µs", "% floor")
                                  else "---" for h in head) + "|")
        keys = sorted((k for k in rows if k[0] == fmt), key=lambda k: (k[1], k[2], k[3], k[4]))
        for k in keys:
            run_i, r = rows[k]
            layer = f"{r['layer'].split('/')[-1]} ({r['N']}×{r['K']})"
            if r.get("page_cells"):          # carried from a page (--base): as it showed them
                cells = list(r["page_cells"])
            elif "us" not in r:
                cells = [layer, str(r["m"]), "error", str(r.get("error", "?"))[:120].replace("|", "/"),
                         "", "", "", "", ""]
            else:
                base_us = r.get("base_us")
                if base_us is None and r.get("vs_base"):
                    base_us = r["vs_base"] * r["us"]
                rate = floor_tbps or runs[run_i - 1].get("copy_tbps")
                floor = r.get("floor_us") if floor_tbps is None else None
                if floor is None and r.get("bytes") and rate:
                    floor = r["bytes"] / (rate * 1e6)
                show_floor = floor is not None and r["m"] <= floor_rows
                cells = [layer, str(r["m"]), f"`{str(r.get('kernel'))[:40]}`", _us(r["us"]),
                         r.get("base", "") or "", _us(base_us) if base_us else "",
                         f"{base_us / r['us']:.2f}×" if base_us else "",
                         _us(floor) if show_floor else "", _pct(floor / r["us"]) if show_floor else ""]
            if many:
                cells.append(str(run_i))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    if nv:
        out += _nvfp4_section(runs, nv, floor_tbps, many)
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="*", help="JSON files written by python -m benchmark.matmul --json (or python -m benchmark.nvfp4 --json)")
    ap.add_argument("--base", default=None,
                    help="a page this script wrote: its runs and rows first, the JSON files' rows replacing them")
    ap.add_argument("--floor-rows", type=int, default=64, help="show the byte floor up to this many rows (default 64)")
    ap.add_argument("--floor-tbps", type=float, default=None,
                    help="byte floors at this rate in TB/s (default: each run's measured copy rate)")
    args = ap.parse_args(argv)
    if not args.json and not args.base:
        ap.error("give JSON files, or --base PAGE")
    try:
        sources = list(args.json)
        if args.base:
            with open(args.base, encoding="utf-8") as fh:
                sources = unpack(fh.read()) + sources
        text = render(sources, args.floor_rows, args.floor_tbps)
    except (OSError, ValueError, KeyError) as e:
        print(f"benchmark.report: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
