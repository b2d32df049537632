"""benchmark/matmul.py's hint parsers (CPU)."""
import pytest

from benchmark.matmul import parse_hint_specs, parse_hints
from bitblas.schedule import GEMVHint, MMAHint, WGMMAHint


def test_parse_hint_specs():
    got = parse_hint_specs("WGMMAHint(BN=64,stages=8,consumers=1); WGMMAHint(persistent=false);"
                           "MMAHint(BM=128,BN=128,WM=64,WN=64,BK=64,stages=3)")
    assert got == [WGMMAHint(BN=64, stages=8, consumers=1), WGMMAHint(persistent=False),
                   MMAHint(BM=128, BN=128, WM=64, WN=64, BK=64, stages=3)]
    assert parse_hint_specs("") == []


@pytest.mark.parametrize("bad", ["Nope(BN=1)", "WGMMAHint BN=64", "GEMVHint(rows_per_warp=x)"])
def test_parse_hint_specs_rejects(bad):
    with pytest.raises((SystemExit, ValueError)):
        parse_hint_specs(bad)


def test_dequant_gemm_spec():
    """--hints 'DequantGemm(...)': the decode-then-GEMM path with the dense GEMM's default or the given
    WGMMAHint; refused, naming the reason, where the path does not take the plan (sm_80: no wgmma;
    unquantized weights: nothing to decode)."""
    from benchmark.matmul import DequantGemmSpec
    from bitblas import MatmulConfig
    from bitblas.plan import make_plan
    from choice_table import TARGETS
    got = parse_hint_specs("DequantGemm(); DequantGemm(BN=128,stages=6)")
    assert got == [DequantGemmSpec(), DequantGemmSpec(WGMMAHint(BN=128, stages=6))]
    assert repr(got[0]) == "DequantGemm()" and "BN=128" in repr(got[1])
    plan = make_plan(MatmulConfig(N=1024, K=1024, A_dtype="float16", W_dtype="uint4", group_size=128,
                                  with_scaling=True), "cuda", 256)
    with pytest.raises(ValueError, match="wgmma"):
        got[0].build(plan, TARGETS["sm_80"])
    fn = got[1].build(plan, TARGETS["sm_90a"])          # compiles both kernels (nvcc; no GPU needed)
    assert type(fn).__name__ == "DequantGemm" and fn.hint == WGMMAHint(BN=128, stages=6)
    fp16 = make_plan(MatmulConfig(N=1024, K=1024, A_dtype="float16", W_dtype="float16"), "cuda", 256)
    with pytest.raises(ValueError, match="nothing to decode"):
        got[0].build(fp16, TARGETS["sm_90a"])


def test_default_variant_spec():
    """--hints 'Default(...)': the row's default hint (a dynamic-M operator's bucket tile at 128 rows,
    its GEMV hint at 4) with the named fields replaced; a field the default's hint lacks is refused,
    naming it and the hint's fields."""
    import bitblas
    from benchmark.matmul import DefaultVariant
    from bitblas import MatmulConfig
    from bitblas.schedule import FusedWgmmaHint
    from choice_table import TARGETS
    got = parse_hint_specs("Default(k_ctas=1,tail_box=false); Default(stages=2)")
    assert got == [DefaultVariant((("k_ctas", 1), ("tail_box", False))), DefaultVariant((("stages", 2),))]
    assert repr(got[0]) == "Default(k_ctas=1,tail_box=False)"
    op = bitblas.Matmul(MatmulConfig(N=4096, K=4096, A_dtype="float16", W_dtype="uint4", group_size=128,
                                     with_scaling=True), target=TARGETS["sm_90a"])
    default = op.choice("cuda", 128).hint
    assert isinstance(default, FusedWgmmaHint) and default.k_ctas == 2 and default.tail_box
    h = got[0].resolve(op, "cuda", 128)
    assert h.k_ctas == 1 and not h.tail_box and h.row_tile == default.row_tile and h.overlap == default.overlap
    assert got[1].resolve(op, "cuda", 4).stages == 2
    with pytest.raises(ValueError, match="k_ctas"):
        got[0].resolve(op, "cuda", 4)                 # the GEMV's hint has no k_ctas


def test_row_plan_is_the_operators():
    """A --hints row is built on the plan of the kernel that serves the row by default: symbolic in M
    for a dynamic-M operator's rows past the GEMV, exactly m rows for the GEMV's rows and a static-M
    operator."""
    import bitblas
    from benchmark.matmul import row_plan
    from bitblas import MatmulConfig
    from choice_table import TARGETS
    w4 = dict(N=1024, K=1024, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True)
    dyn = bitblas.Matmul(MatmulConfig(**w4), target=TARGETS["sm_90a"])
    assert row_plan(dyn, "cuda", 128).m is None and row_plan(dyn, "cuda", 4096).m is None
    assert row_plan(dyn, "cuda", 4).m == 4
    static = bitblas.Matmul(MatmulConfig(M=128, **w4), target=TARGETS["sm_90a"])
    assert row_plan(static, "cuda", 128).m == 128


def test_parse_gemv_hints():
    assert parse_hints("4,1,4,16;32,4,2,16,4,0,2,1") == [GEMVHint(4, 1, 4, 16), GEMVHint(32, 4, 2, 16, 4, 0, 2, 1)]


def _fake_benches(monkeypatch, interrupt_at=None):
    """benchmark.matmul's timing functions replaced by fakes (no GPU); the row ``interrupt_at`` (0-based
    call to bench_row) raises KeyboardInterrupt like a Ctrl-C."""
    import benchmark.matmul as bm
    calls = []

    def row(fmt, layer, N, K, m, check=True, hint=None, device="cuda", graph_ms=None):
        calls.append(fmt)
        if interrupt_at is not None and len(calls) > interrupt_at:
            raise KeyboardInterrupt
        return dict(format=fmt, layer=layer, N=N, K=K, m=m, kernel="GEMV", us=10.0 + len(calls), tbps=1.0,
                    tflops=1.0, bytes=1, build_s=0.0, rel_err=1e-4)

    def base(name):
        return lambda N, K, m, **kw: dict(kernel=name, us=20.0, tbps=0.5, tflops=0.5)
    monkeypatch.setattr(bm, "bench_row", row)
    monkeypatch.setattr(bm, "bench_cublas", base("cublas-fp16"))
    monkeypatch.setattr(bm, "bench_int4pack", base("torch-int4pack-bf16"))
    monkeypatch.setattr(bm, "bench_int_mm", lambda N, K, m, **kw: dict(kernel="torch-int_mm", error="RuntimeError: m")
                        if m <= 16 else dict(kernel="torch-int_mm", us=30.0, tbps=0.5, tflops=0.5))
    monkeypatch.setattr(bm.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bm.torch.cuda, "get_device_properties", lambda i: type("P", (), {"name": "FakeGPU"})())
    monkeypatch.setattr(bm.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bm, "copy_bandwidth", lambda nbytes, device="cuda": 4.0)
    return bm


def test_rows_print_as_they_finish_and_are_saved(monkeypatch, tmp_path, capsys):
    import json
    bm = _fake_benches(monkeypatch)
    out = tmp_path / "rows.json"
    bm.main(["--formats", "w4a16-g128,w4a16-g128-zeros", "--shapes", "gemm4k", "--m", "1,16", "--json", str(out),
             "--no-progress"])
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * (2 + 2)              # per m: cuBLAS, int4pack, two formats
    assert [r["format"] for r in rows[:4]] == ["fp16(torch)", "int4(torch)", "w4a16-g128", "w4a16-g128-zeros"]
    assert rows[2]["vs_cublas"] == 20.0 / rows[2]["us"]
    assert text.count("w4a16-g128-zeros") >= 2 and "| format" in text


def test_row_line_names_the_formats_baseline(monkeypatch, tmp_path, capsys):
    """A format compared with another baseline than cuBLAS fp16 (w8a8: torch._int_mm) prints that
    ratio on its line too, the one docs/performance.md shows; where _int_mm refuses (16 rows) and
    for the float formats the line keeps the cuBLAS ratio only."""
    bm = _fake_benches(monkeypatch)
    bm.main(["--formats", "w8a8,w4a16-g128", "--shapes", "gemm4k", "--m", "16,64", "--json", str(tmp_path / "r.json"),
             "--no-progress"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  w")]
    w8 = {int(ln.split("m=")[1].split()[0]): ln for ln in lines if ln.lstrip().startswith("w8a8")}
    import json
    row = next(r for r in json.loads((tmp_path / "r.json").read_text())["rows"] if r["format"] == "w8a8" and r["m"] == 64)
    assert row["vs_base"] == 30.0 / row["us"] and row["base"] == "torch-int_mm"
    assert f"{row['vs_base']:.2f}x torch-int_mm" in w8[64] and f"{row['vs_cublas']:.2f}x cuBLAS" in w8[64]
    assert "torch-int_mm" not in w8[16]
    assert all("torch-" not in ln for ln in lines if ln.lstrip().startswith("w4a16"))


def test_interrupted_run_keeps_finished_rows(monkeypatch, tmp_path, capsys):
    import json
    bm = _fake_benches(monkeypatch, interrupt_at=3)
    out = tmp_path / "rows.json"
    bm.main(["--formats", "w4a16-g128,w4a16-g128-zeros", "--shapes", "gemm4k", "--m", "1,16", "--json", str(out),
             "--no-progress"])
    rows = json.loads(out.read_text())["rows"]
    ours = [r for r in rows if not r["format"].endswith(")")]
    assert len(ours) == 3 and "interrupted: " in capsys.readouterr().out


def test_plot_with_matplotlib(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    bm = _fake_benches(monkeypatch)
    png = tmp_path / "plot.png"
    bm.main(["--formats", "w4a16-g128", "--shapes", "small", "--m", "1", "--json", "", "--plot", str(png),
             "--no-progress"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_cpu_benchmark_small(tmp_path, capsys):
    """benchmark.cpu on a small shape: one row per (threads, format, m), both baselines timed, the
    reference check run, the JSON written with the load average and every sample."""
    import json
    from benchmark.cpu import main
    out = tmp_path / "cpu.json"
    assert main(["--formats", "w4a16-g128", "--shapes", "256x512", "--m", "1,3", "--threads", "1", "--rounds", "2",
                 "--sample-ms", "2", "--hot", "--json", str(out)]) == 0
    res = json.load(open(out))
    assert len(res["rows"]) == 2 and res["load_start"] and res["load_end"] and res["physical_cores"] >= 1
    for r in res["rows"]:
        assert r["threads"] == 1 and r["bitblas_ms"] > 0 and r["torch_fp32_ms"] > 0 and r["torch_bf16_ms"] > 0
        assert len(r["samples"]["bitblas"]) == 2 and r["rel_err"] is not None
    assert "w4a16-g128" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--formats", "nope", "--shapes", "64x64", "--json", ""])


def test_baseline_falls_back_to_cublas(monkeypatch, tmp_path):
    """w8a8 is compared with torch._int_mm; where that refuses the shape (m <= 16), with cuBLAS fp16."""
    import json
    bm = _fake_benches(monkeypatch)
    out = tmp_path / "rows.json"
    bm.main(["--formats", "w8a8", "--shapes", "gemm4k", "--m", "1,32", "--json", str(out), "--no-progress"])
    data = json.loads(out.read_text())
    ours = {r["m"]: r for r in data["rows"] if r["format"] == "w8a8"}
    assert ours[1]["base"] == "cublas-fp16" and ours[1]["base_us"] == 20.0
    assert ours[32]["base"] == "torch-int_mm" and ours[32]["base_us"] == 30.0
    assert data["command"].startswith("python -m benchmark.matmul --formats w8a8") and data["copy_tbps"] == 4.0


def test_resume_times_only_the_missing_rows(monkeypatch, tmp_path, capsys):
    """A run cut short, then --resume: the finished rows are kept, only the rest are timed."""
    import json
    out = tmp_path / "rows.json"
    argv = ["--formats", "w4a16-g128,w4a16-g128-zeros", "--shapes", "gemm4k", "--m", "1,16", "--json", str(out),
            "--no-progress"]
    bm = _fake_benches(monkeypatch, interrupt_at=3)
    bm.main(argv)
    first = json.loads(out.read_text())["rows"]
    assert len([r for r in first if not r["format"].endswith(")")]) == 3
    bm = _fake_benches(monkeypatch)
    calls = []
    orig = bm.bench_row
    monkeypatch.setattr(bm, "bench_row", lambda *a, **k: calls.append(a[0]) or orig(*a, **k))
    bm.main(argv + ["--resume"])
    rows = json.loads(out.read_text())["rows"]
    ours = [r for r in rows if not r["format"].endswith(")")]
    assert calls == ["w4a16-g128-zeros"]                        # the one row the cut run missed
    assert sorted((r["format"], r["m"]) for r in ours) == sorted(
        (f, m) for f in ("w4a16-g128", "w4a16-g128-zeros") for m in (1, 16))
    assert ours[:3] == [r for r in first if not r["format"].endswith(")")]
    assert len([r for r in rows if r["format"] == "fp16(torch)"]) == 2      # baselines not repeated
