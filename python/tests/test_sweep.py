"""pdsim.sweep against `pdsim sweep`'s sweep.csv, and on executors: a
thread pool, a process pool and a local Ray instance give the local
sweep's rows, value for value."""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

import pdsim
from conftest import pdsim_cli

# 3 decode counts x 3 bandwidths x 2 rates x 2 seeds = 36 points.
GRID = "scenarios/sweeps/glm-decode-bandwidth.toml"
ZIPPED = "scenarios/sweeps/glm-split-4-ranks.toml"
REQUESTS = 60


def check_frame(frame: pd.DataFrame, text: str) -> None:
    """Every cell of the frame is the CSV text's: numbers parsed exactly,
    an empty cell NaN."""
    lines = text.splitlines()
    assert list(frame.columns) == lines[0].split(",")
    assert len(frame) == len(lines) - 1
    for i, line in enumerate(lines[1:]):
        for name, cell in zip(frame.columns, line.split(",")):
            v = frame.at[i, name]
            if cell == "":
                assert isinstance(v, float) and math.isnan(v), (i, name)
            elif isinstance(v, str):
                assert v == cell, (i, name)
            else:
                assert float(v) == float(cell), (i, name, v, cell)


@pytest.mark.parametrize("sweep", [GRID, ZIPPED])
def test_sweep_gives_the_cli_sweep_csv(cli: Path, tmp_path: Path, sweep: str) -> None:
    pdsim_cli(cli, "sweep", sweep, "--requests", str(REQUESTS), "--out", str(tmp_path), "--quiet")
    want = (tmp_path / "sweep.csv").read_text()
    text = pdsim.sweep_csv(sweep, requests=REQUESTS, jobs=2)
    assert text == want
    frame = pdsim.sweep(sweep, requests=REQUESTS)
    check_frame(frame, want)
    assert frame["digest"].map(type).eq(str).all()


def test_sweep_as_text_and_dict(tmp_path: Path) -> None:
    base = pdsim.sweep_csv(GRID, requests=REQUESTS)
    text = Path(GRID).read_text().replace('"../glm-5.3-flash-1p1d.toml"', '"scenarios/glm-5.3-flash-1p1d.toml"')
    assert pdsim.sweep_csv(text, requests=REQUESTS) == base
    spec = {
        "scenario": "scenarios/glm-5.3-flash-1p1d.toml",
        "seeds": [1, 2],
        "axes": {"decode.count": [1, 2, 4], "link.bandwidth_gb_s": [1, 10, 100],
                 "workload.arrival.rate_per_s": [4.0, 8.0]},
    }
    assert pdsim.sweep_csv(spec, requests=REQUESTS) == base


def test_executors_give_the_local_sweep() -> None:
    local = pdsim.sweep_csv(GRID, requests=REQUESTS)
    assert len(local.splitlines()) == 37
    with ThreadPoolExecutor(3) as pool:
        assert pdsim.sweep_csv(GRID, requests=REQUESTS, executor=pool) == local
    # Another process gets each point's resolved scenario as text.
    with ProcessPoolExecutor(2) as pool:
        assert pdsim.sweep_csv(ZIPPED, requests=REQUESTS, executor=pool) == pdsim.sweep_csv(ZIPPED, requests=REQUESTS)


def test_a_bad_sweep_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(f'scenario = "{Path(GRID).resolve().parent / "../glm-5.3-flash-1p1d.toml"}"\n[axes]\n"decode.count" = [1, 0]\n')
    with pytest.raises(pdsim.PdsimError) as e:
        pdsim.sweep(bad)
    assert e.value.file == str(bad) and e.value.line == 3 and e.value.field == 'axes."decode.count"'


@pytest.fixture(scope="module")
def ray_local():
    if os.environ.get("PDSIM_REQUIRE_RAY") != "1":
        pytest.importorskip("ray")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_a_36_point_sweep_on_local_ray_is_the_local_sweep(ray_local) -> None:
    from pdsim.ray import RayExecutor

    local = pdsim.sweep(GRID, requests=REQUESTS)
    on_ray = pdsim.sweep(GRID, requests=REQUESTS, executor=RayExecutor())
    assert len(on_ray) == 36
    pd.testing.assert_frame_equal(on_ray, local, check_exact=True)
    assert pdsim.sweep_csv(GRID, requests=REQUESTS, executor=RayExecutor()) == pdsim.sweep_csv(GRID, requests=REQUESTS)
