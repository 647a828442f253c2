"""pdsim.run against `pdsim run`'s files for the same scenario and seed,
value for value, and the forms a scenario can take."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

import pdsim
from conftest import ROOT, pdsim_cli

PRESSURE = "scenarios/glm-5.3-flash-2p1d-pressure.toml"
LLAMA = "scenarios/llama-3.1-8b-1p1d.toml"


def same_as_csv(frame: pd.DataFrame, path: Path) -> int:
    """Checks every cell of ``frame`` against the CSV file: an int column's
    cell is its integer, a float column's the double nearest the file's
    text (``float`` rounds correctly) or NaN for an empty cell, a category
    the text or NaN for an empty cell. Returns the rows compared."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert list(frame.columns) == header
    assert len(frame) == len(body)
    for c, name in enumerate(header):
        col = frame[name]
        cells = [r[c] for r in body]
        if col.dtype == "int64":
            assert col.tolist() == [int(x) for x in cells], name
        elif col.dtype == "float64":
            for i, (v, x) in enumerate(zip(col.tolist(), cells)):
                assert (math.isnan(v) and x == "") or v == float(x), f"{name} row {i}: {v!r} against {x!r}"
        else:
            assert isinstance(col.dtype, pd.CategoricalDtype), name
            got = ["" if isinstance(v, float) and math.isnan(v) else v for v in col.astype(object).tolist()]
            assert got == cells, name
    return len(body)


@pytest.mark.parametrize("scenario,seed,requests", [(PRESSURE, 7, 300), (LLAMA, 3, 400)])
def test_run_gives_the_cli_files(cli: Path, tmp_path: Path, scenario: str, seed: int, requests: int) -> None:
    out = tmp_path / "run"
    pdsim_cli(cli, "run", scenario, "--seed", str(seed), "--requests", str(requests), "--out", str(out),
              "--no-trace", "--quiet")
    r = pdsim.run(scenario, seed=seed, requests=requests)
    # report.json whole: every statistic, bench, overload, ranks, links,
    # the resolved scenario, the digest.
    assert r.summary == json.loads((out / "report.json").read_text())
    assert r.bench == r.summary["bench"] and "median_ttft_ms" in r.bench
    assert same_as_csv(r.requests, out / "requests.csv") == requests
    assert same_as_csv(r.timeline, out / "timeline.csv") > 0


def test_columns_are_typed() -> None:
    r = pdsim.run(PRESSURE, requests=50)
    d = r.requests.dtypes
    assert d["id"] == "int64" and d["prompt_tokens"] == "int64" and d["transfer_bytes"] == "int64"
    assert d["ttft_ms"] == "float64" and d["arrival_ms"] == "float64"
    for name in ["outcome", "fail_reason", "prefill_rank", "decode_rank"]:
        assert isinstance(d[name], pd.CategoricalDtype), name
    t = r.timeline.dtypes
    assert (t["time_ms"], t["value"]) == ("float64", "int64")
    assert isinstance(t["entity"], pd.CategoricalDtype) and isinstance(t["metric"], pd.CategoricalDtype)
    # TTFT is first token less arrival, in ms: the columns share a unit.
    done = r.requests[r.requests["outcome"] == "completed"]
    gap = (done["first_token_ms"] - done["arrival_ms"] - done["ttft_ms"]).abs()
    assert gap.max() < 1e-6


def test_priorities_reach_the_requests_frame() -> None:
    # A workload's priority mix, drawn per request: the frame's `priority`
    # column (int64, as requests.csv's) has both values, the more weighted
    # one more often; without a mix every request has vLLM's default, 0.
    mix = [{"value": 0, "weight": 3}, {"value": -5, "weight": 1}]
    r = pdsim.run(LLAMA, requests=400, overrides={"workload.priorities": mix}, timeline=False)
    assert r.requests["priority"].dtype == "int64"
    counts = r.requests["priority"].value_counts().to_dict()
    assert set(counts) == {0, -5} and counts[0] > counts[-5] > 0, counts
    assert (pdsim.run(LLAMA, requests=100, timeline=False).requests["priority"] == 0).all()


def test_text_dict_and_overrides_are_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # TOML text and a dict name files relative to the working folder: here
    # the scenario's own, where its step-time files are.
    path = ROOT / LLAMA
    monkeypatch.chdir(path.parent)
    text = path.read_text()
    by_path = pdsim.run(path, requests=100, timeline=False)
    by_text = pdsim.run(text, requests=100, timeline=False)
    assert by_text.digest == by_path.digest
    assert by_text.summary["summary"] == by_path.summary["summary"]
    resolved = pdsim.validate(path)
    by_dict = pdsim.run(resolved, requests=100, timeline=False)
    assert by_dict.digest == by_path.digest
    # An override is the file with that field changed.
    over = pdsim.run(path, requests=100, overrides={"decode.count": 2, "link.bandwidth_gb_s": 10.0})
    changed = text.replace("[decode]\ncount = 1", "[decode]\ncount = 2").replace(
        "bandwidth_gb_s = 50.0", "bandwidth_gb_s = 10.0"
    )
    assert changed != text
    assert pdsim.run(changed, requests=100).digest == over.digest != by_path.digest
    assert pdsim.run(path, requests=100, seed=2).digest != by_path.digest


def test_without_a_timeline_nothing_else_changes() -> None:
    a = pdsim.run(PRESSURE, requests=100)
    b = pdsim.run(PRESSURE, requests=100, timeline=False)
    assert a.summary == b.summary
    assert len(b.timeline) == 0 and list(b.timeline.columns) == ["time_ms", "entity", "metric", "value"]
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_threads_run_at_once_and_agree() -> None:
    seeds = [1, 2, 3, 4]
    alone = [pdsim.run(PRESSURE, seed=s, requests=150, timeline=False).digest for s in seeds]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: pdsim.run(PRESSURE, seed=s, requests=150, timeline=False).digest, seeds))
    assert together == alone
    assert len(set(alone)) == 4


def test_import_loads_no_pandas() -> None:
    code = "import sys, pdsim; print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_percentiles_name_the_bench_fields() -> None:
    r = pdsim.run(LLAMA, requests=50, percentiles=[50, 99.9], timeline=False)
    assert "p99.9_ttft_ms" in r.bench and "p90_ttft_ms" not in r.bench
    with pytest.raises(pdsim.PdsimError, match="percentiles"):
        pdsim.run(LLAMA, requests=50, percentiles=[101])
