"""benchmark/report.py on the JSON of a real (tiny, CPU) run of benchmark/matmul.py."""
import json

import pytest

from benchmark import matmul as bm
from benchmark import report


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The JSON of ``python -m benchmark.matmul --device cpu`` on one tiny layer (kernels built and timed)."""
    path = tmp_path_factory.mktemp("bench") / "cpu.json"
    argv = ["--device", "cpu", "--formats", "w4a16-g128", "--shapes", "tiny", "--m", "1,3", "--json", str(path),
            "--no-progress"]
    bm.main(argv)
    return path, argv, json.loads(path.read_text())


def test_cpu_run_json_records_the_run(cpu_run):
    path, argv, data = cpu_run
    assert data["command"] == "python -m benchmark.matmul " + " ".join(argv)
    assert data["kind"] == "cpu" and data["device"] and data["date"].endswith("UTC")
    assert data["copy_tbps"] > 0
    ours = [r for r in data["rows"] if r["format"] == "w4a16-g128"]
    base = [r for r in data["rows"] if r["format"] == "fp16(torch)"]
    assert [r["m"] for r in ours] == [1, 3] and [r["m"] for r in base] == [1, 3]
    for r, b in zip(ours, base):
        assert r["rel_err"] < 1e-2                      # the benchmark checked our output
        assert r["base_us"] == b["us"] and r["base"] == b["kernel"] == "torch-linear-fp16"
        assert r["floor_us"] == pytest.approx(r["bytes"] / (data["copy_tbps"] * 1e6))


def _table(text, fmt):
    sec = text.split(f"## {fmt}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in sec.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_report_tables_come_from_the_json(cpu_run, capsys):
    path, argv, data = cpu_run
    assert report.main([str(path), "--floor-rows", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(report.TITLE)
    assert data["command"] in text and data["device"] in text and data["date"] in text
    lines = _table(text, "w4a16-g128")
    ours = [r for r in data["rows"] if r["format"] == "w4a16-g128"]
    assert len(lines) == len(ours)
    for line, r in zip(lines, ours):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == str(r["m"]) and cells[0] == f"tiny ({r['N']}×{r['K']})"
        assert cells[3] == report._us(r["us"]) and cells[5] == report._us(r["base_us"])
        assert cells[6] == f"{r['base_us'] / r['us']:.2f}×"
        if r["m"] <= 1:
            assert cells[7] == report._us(r["floor_us"]) and cells[8].endswith("%")
        else:
            assert cells[7] == cells[8] == ""           # above --floor-rows: no floor
    assert "## fp16(torch)" not in text                  # baselines sit beside our rows, not in tables


def test_report_floor_at_a_given_rate(cpu_run, capsys):
    """--floor-tbps: every floor is the row's bytes over that rate, and the page says so; a rate
    that is not positive is refused naming it."""
    path, argv, data = cpu_run
    assert report.main([str(path), "--floor-rows", "1", "--floor-tbps", "4.25"]) == 0
    text = capsys.readouterr().out
    assert "over 4.25 TB/s (`--floor-tbps 4.25`" in text
    ours = [r for r in data["rows"] if r["format"] == "w4a16-g128" and r["m"] <= 1]
    assert ours
    for line, r in zip(_table(text, "w4a16-g128"), ours):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[7] == report._us(r["bytes"] / 4.25e6) and cells[8] == report._pct(r["bytes"] / 4.25e6 / r["us"])
    assert report.main([str(path), "--floor-tbps", "0"]) == 2
    assert "floor_tbps=0.0" in capsys.readouterr().err


def test_report_merges_runs(cpu_run, capsys):
    path = str(cpu_run[0])
    assert report.main([path, path]) == 0
    text = capsys.readouterr().out
    assert "Run 1:" in text and "Run 2:" in text
    assert all(line.rstrip().endswith("| 2 |") for line in _table(text, "w4a16-g128"))   # the later run's rows


def test_report_merges_a_layer_across_shape_sets(cpu_run, tmp_path, capsys):
    """The same layer timed under another shape set (``--shapes brief`` against ``--shapes square-8k``:
    layer "brief/square-8k" against "square-8k/square-8k") is one row of the page, the later run's."""
    path, argv, data = cpu_run
    other = dict(data, rows=[dict(r, layer="other-set/" + r["layer"].split("/")[-1]) for r in data["rows"]])
    b = tmp_path / "other.json"
    b.write_text(json.dumps(other))
    assert report.main([str(path), str(b)]) == 0
    lines = _table(capsys.readouterr().out, "w4a16-g128")
    assert len(lines) == len([r for r in data["rows"] if r["format"] == "w4a16-g128"])
    assert all(line.rstrip().endswith("| 2 |") for line in lines)


def test_report_rejects_other_json(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps([1, 2]))
    assert report.main([str(bad)]) == 2
    assert "x.json" in capsys.readouterr().err


def test_host_overhead_cpu(tmp_path, capsys):
    """benchmark/host_overhead.py on the CPU: every path timed, torch's F.linear beside ours."""
    from benchmark import host_overhead
    out = tmp_path / "host.json"
    host_overhead.main(["--device", "cpu", "--no-zeros", "--iters", "20", "--repeats", "2", "--modes", "kernel,py-nop",
                        "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    got = {(r["case"], r["mode"]) for r in rows}
    for case in ("F.linear", "Linear()", "Linear.forward", "torch.ops (op)", "Matmul(...)", "bound(x)"):
        assert (case, "kernel") in got
    assert ("Linear()", "py-nop") in got and ("F.linear", "py-nop") not in got
    assert all(r["host_us"] > 0 for r in rows)
    assert "torch.ops (op)" in capsys.readouterr().out


def _nvfp4_json(path, commit, us, rate=2.7):
    """A benchmark.nvfp4 JSON as main() writes it (run metadata, then rows; floor_us at 4.25 TB/s)."""
    rows = [dict(kind="gemv", M=7168, K=16384, L=1, hint="default R2W8U1S3+pdl", us=us, floor_us=15.5,
                 torch_us=2000.0),
            dict(kind="gemv-hint", M=7168, K=16384, L=1, hint="R4W4U1S3+pdl", us=1.0, floor_us=15.5),
            dict(kind="gemv", M=7168, K=2048, L=4, hint="default R4W4U1S3+pdl", us=10.0, floor_us=8.0,
                 torch_us=1000.0),
            dict(kind="gemm", M=4096, N=8192, K=8192, path="decode+wgmma", us=800.0, cublas_fp16_us=780.0),
            dict(kind="w-only", fmt="nvfp4 x float16", M=1, N=8192, K=8192, kernel="GEMV", us=12.0, floor_us=8.5)]
    path.write_text(json.dumps(dict(device="NVIDIA H200", kind="cuda", torch="2.11", bitblas="0.2.0", commit=commit,
                                    date="2026-11-27 13:30 UTC", command="python -m benchmark.nvfp4 --no-sweep",
                                    copy_tbps=rate, rows=rows)))
    return str(path)


def test_report_nvfp4_table(tmp_path, capsys):
    """benchmark.nvfp4's JSON: one table (its hint sweep left out), floors rescaled to the rate asked
    for, the batched GEMV's geometric mean, the later run's rows where two runs share a row."""
    a = _nvfp4_json(tmp_path / "a.json", "aaa", us=19.0)
    b = _nvfp4_json(tmp_path / "b.json", "bbb", us=18.6)
    assert report.main([a, b, "--floor-tbps", "4.25"]) == 0
    text = capsys.readouterr().out
    assert "commit aaa" in text and "commit bbb" in text and "python -m benchmark.nvfp4 --no-sweep" in text
    table = _table(text, "nvfp4 × nvfp4 (`python -m benchmark.nvfp4`)")
    assert len(table) == 4 and not any("R4W4U1S3" in line and "16384" in line for line in table)
    gemv = next(line for line in table if "K=16384" in line)
    assert "| 18.60 |" in gemv and "| 2000.0 | 107.53× | 15.50 | 83% | 2 |" in gemv
    assert "| 800.0 | cublas-fp16 | 780.0 | 0.97× |" in next(line for line in table if line.startswith("| gemm"))
    gm = ((18.6 / 15.5) * (10.0 / 8.0)) ** 0.5
    assert f"geometric mean of time / byte floor over 2 shapes: {gm:.3f}." in text
    assert report.main([b]) == 0                    # at the run's own copy rate: floors scaled by 4.25 / 2.7
    table = _table(capsys.readouterr().out, "nvfp4 × nvfp4 (`python -m benchmark.nvfp4`)")
    assert f"| {15.5 * 4.25 / 2.7:.2f} |" in next(line for line in table if "K=16384" in line)


def test_report_base_page_round_trip(cpu_run, tmp_path, capsys):
    """--base: a page this script wrote gives itself back (its runs, rows, cells and format order),
    and again from that; the runs of the JSON files given with it replace its rows of the same key,
    and a run of the page left with no row is dropped (the rest renumbered)."""
    path, argv, data = cpu_run
    later = dict(data, commit="later", rows=[r for r in data["rows"] if r["m"] == 1])
    b = tmp_path / "later.json"
    b.write_text(json.dumps(later))
    assert report.main([str(path), str(b), "--floor-tbps", "4.25"]) == 0
    page = capsys.readouterr().out
    assert "Run 1:" in page and "Run 2:" in page and "commit later" in page
    p = tmp_path / "page.md"
    p.write_text(page)
    assert report.main(["--base", str(p), "--floor-tbps", "4.25"]) == 0
    again = capsys.readouterr().out
    assert again == page
    p.write_text(again)
    assert report.main(["--base", str(p), "--floor-tbps", "4.25"]) == 0
    assert capsys.readouterr().out == page
    # a new run replacing the rows of run 2 ("later"): that run is dropped, run 1 stays as run 1
    newer = dict(later, commit="newer", rows=[dict(r, us=r["us"] / 2) if "(torch)" not in r["format"] else r
                                              for r in later["rows"]])
    n = tmp_path / "newer.json"
    n.write_text(json.dumps(newer))
    assert report.main(["--base", str(p), str(n), "--floor-tbps", "4.25"]) == 0
    text = capsys.readouterr().out
    assert "commit later" not in text and "commit newer" in text and "Run 2:" in text and "Run 3:" not in text
    lines = _table(text, "w4a16-g128")
    one = next(line for line in lines if line.startswith("| tiny") and "| 1 |" in line.split("`")[0])
    r1 = next(r for r in newer["rows"] if r["format"] == "w4a16-g128" and r["m"] == 1)
    assert f"| {report._us(r1['us'])} |" in one and one.rstrip().endswith("| 2 |")
    # the page's row of 3 rows (run 1) is carried as the page showed it
    three = next(line for line in lines if line.split("|")[2].strip() == "3")
    assert three in page.splitlines() and three.rstrip().endswith("| 1 |")


def test_report_nvfp4_gemm_same_data(tmp_path, capsys):
    """The GEMM row names cuBLAS on our decoded operands beside the randn baseline where the run
    measured it (benchmark.nvfp4's cublas_same_data_us), and a page written with it round-trips."""
    a = tmp_path / "a.json"
    d = json.loads(open(_nvfp4_json(a, "aaa", us=19.0)).read())
    d["rows"][3]["cublas_same_data_us"] = 720.0
    a.write_text(json.dumps(d))
    assert report.main([str(a), "--floor-tbps", "4.25"]) == 0
    page = capsys.readouterr().out
    gemm = next(line for line in _table(page, "nvfp4 × nvfp4 (`python -m benchmark.nvfp4`)") if line.startswith("| gemm"))
    assert "| 800.0 | cublas-fp16; on our decoded operands 720.0 µs (0.90×) | 780.0 | 0.97× |" in gemm
    p = tmp_path / "page.md"
    p.write_text(page)
    assert report.main(["--base", str(p), "--floor-tbps", "4.25"]) == 0
    assert capsys.readouterr().out == page


def test_report_base_page_nvfp4_rows(tmp_path, capsys):
    """--base carries benchmark.nvfp4's table too (a later run's row of the same shape replaces the
    page's), and refuses a file that is not such a page."""
    a = _nvfp4_json(tmp_path / "a.json", "aaa", us=19.0)
    assert report.main([a, "--floor-tbps", "4.25"]) == 0
    page = capsys.readouterr().out
    p = tmp_path / "page.md"
    p.write_text(page)
    assert report.main(["--base", str(p), "--floor-tbps", "4.25"]) == 0
    assert capsys.readouterr().out == page
    b = _nvfp4_json(tmp_path / "b.json", "bbb", us=18.6)
    assert report.main(["--base", str(p), b, "--floor-tbps", "4.25"]) == 0
    text = capsys.readouterr().out
    gemv = next(line for line in _table(text, "nvfp4 × nvfp4 (`python -m benchmark.nvfp4`)") if "K=16384" in line)
    assert "| 18.60 |" in gemv
    bad = tmp_path / "bad.md"
    bad.write_text("# not a page\n")
    assert report.main(["--base", str(bad)]) == 2
    assert "not a page" in capsys.readouterr().err
