"""`gpuscope export --parquet`: the analysed rank x step table, read back with pyarrow and
queried with DuckDB across two runs, agrees with the report."""

import json
import os
import subprocess
import sys

import duckdb
import pyarrow.parquet as pq
import pytest

import gpuscope

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "sample_traces")


def _export(path, out):
    proc = subprocess.run([sys.executable, "-m", "gpuscope", "export", path, "--parquet", out],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("sample", ["imbalanced/record", "comm/kineto"])
def test_table_matches_the_report(tmp_path, sample):
    path = os.path.join(SAMPLES, sample)
    out = str(tmp_path / "steps.parquet")
    proc = _export(path, out)
    rep = gpuscope.analyze(path)
    t = pq.read_table(out).to_pandas()
    frame = rep.table.frame
    assert len(t) == len(frame) and f"({len(t)} rows" in proc.stdout
    assert sorted(t["rank"].unique()) == sorted(r.rank for r in rep.ranks)
    by_step = {s.step: s for s in rep.steps}
    assert (t["label"] == [by_step[s].label for s in t["step"]]).all()
    assert set(t["verdict"]) == {rep.verdict.label}
    assert set(t.loc[t["straggler"], "rank"]) == set(rep.straggler_ranks)
    # the times are the analysed table's, in ms; the slowest rank per step is the report's step
    assert t["step_ms"].sum() == pytest.approx(frame["step_ns"].sum() / 1e6)
    slowest = t.groupby("step")["step_ms"].max()
    for s in rep.steps:
        assert slowest[s.step] == pytest.approx(s.step_ns / 1e6, rel=1e-6)
    assert json.loads(t["knobs_json"][0]) == json.loads(json.dumps(rep.knobs, default=str))
    meta = json.loads(pq.read_schema(out).metadata[b"gpuscope.report"])
    assert meta["verdict"] == rep.verdict.label and meta["stragglers"] == rep.straggler_ranks


def test_duckdb_over_a_folder_of_runs(tmp_path):
    for name in ("data", "imbalanced"):
        _export(os.path.join(SAMPLES, name, "record"), str(tmp_path / f"{name}.parquet"))
    rows = duckdb.sql(f"""
        SELECT run, verdict, count(*) AS n, round(avg(data_pct), 1) AS data_pct,
               bool_or(straggler) AS has_straggler
        FROM '{tmp_path}/*.parquet' GROUP BY run, verdict ORDER BY run""").fetchall()
    got = {os.path.basename(os.path.dirname(r[0])): r for r in rows}
    assert got["data"][1] == "data-bound" and got["data"][3] > 30
    assert got["imbalanced"][1] == "imbalanced" and got["imbalanced"][4] is True


def test_export_needs_an_output_and_a_readable_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpuscope", "export",
                           os.path.join(SAMPLES, "comm", "record")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--parquet" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gpuscope", "export", str(tmp_path),
                           "--parquet", str(tmp_path / "x.parquet")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and not (tmp_path / "x.parquet").exists()
