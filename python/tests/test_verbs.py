"""validate, transfer and steptime against the command line, and the
errors: a scenario refused names its file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pdsim
from conftest import pdsim_cli

GLM = "scenarios/glm-5.3-flash-1p1d.toml"
LLAMA = "scenarios/llama-3.1-8b-1p1d.toml"


def test_validate_gives_the_resolved_scenario(cli: Path) -> None:
    assert pdsim.validate(LLAMA) == json.loads(pdsim_cli(cli, "validate", LLAMA, "--json"))


def test_a_refused_scenario_names_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    # Its step-time files are named relative to the scenario's folder.
    steptimes = (Path(LLAMA).parent / "steptimes").resolve()
    text = Path(LLAMA).read_text().replace("rate_per_s = 20.0", "rate_per_s = -3.0")
    text = text.replace('file = "steptimes/', f'file = "{steptimes}/')
    bad.write_text(text)
    line = 1 + text[: text.index("rate_per_s = -3.0")].count("\n")
    with pytest.raises(pdsim.ScenarioError) as e:
        pdsim.validate(bad)
    assert (e.value.file, e.value.line, e.value.field) == (str(bad), line, "workload.arrival.rate_per_s")
    assert str(e.value) == f"{bad}:{line}: workload.arrival.rate_per_s: {e.value.message}"
    assert isinstance(e.value, ValueError)
    # The same text, given as a string: the file is <string>, the line the
    # same.
    with pytest.raises(pdsim.ScenarioError) as e:
        pdsim.run(text)
    assert (e.value.file, e.value.line, e.value.field) == ("<string>", line, "workload.arrival.rate_per_s")


def test_an_unknown_field_and_a_bad_override_are_named(tmp_path: Path) -> None:
    with pytest.raises(pdsim.ScenarioError) as e:
        pdsim.validate("seed = 1\nspeed = 2\n")
    assert (e.value.line, e.value.field) == (2, "speed")
    with pytest.raises(pdsim.ScenarioError) as e:
        pdsim.run(LLAMA, overrides={"decode.count": 0})
    assert e.value.field == "decode.count" and e.value.line is None
    with pytest.raises(pdsim.ScenarioError, match="cannot read"):
        pdsim.validate(tmp_path / "missing.toml")


def test_a_bad_trace_row_is_placed(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 1, "input_length": "x"}\n')
    scenario = (
        f'include = ["{Path(LLAMA).resolve()}"]\n'
        f'[workload]\ntrace = {{ format = "mooncake", path = "{trace}" }}\n'
    )
    with pytest.raises(pdsim.PdsimError) as e:
        pdsim.validate(scenario)
    assert (e.value.file, e.value.line) == (str(trace), 2), str(e.value)


@pytest.mark.parametrize("n,k,bw", [(8192, 0, None), (8192, 4352, 1.0), (1000, 0, 25.0)])
def test_transfer_gives_the_cli_json(cli: Path, n: int, k: int, bw: float | None) -> None:
    args = ["transfer", GLM, "--prompt-tokens", str(n), "--decode-cached-tokens", str(k), "--json"]
    if bw is not None:
        args += ["--bandwidth-gb-s", str(bw)]
    got = pdsim.transfer(GLM, n, decode_cached_tokens=k, bandwidth_gb_s=bw)
    assert got == json.loads(pdsim_cli(cli, *args))


def test_transfer_worked_number() -> None:
    # The GLM-like model: 13,045,120 x cdiv(8192 - 1, 2176) + 36,927,488
    # = 13,045,120 x 4 + 36,927,488 = 89,107,968 bytes; at 1 GB/s 89.107968
    # ms, plus the scenario's link latency.
    t = pdsim.transfer(GLM, 8192, bandwidth_gb_s=1)
    assert t["payload_bytes"] == 13_045_120 * 4 + 36_927_488 == 89_107_968
    assert t["delay_ns"] == 89_107_968 + round(t["latency_us"] * 1000)
    with pytest.raises(pdsim.PdsimError, match="prompt_tokens: must be >= 1"):
        pdsim.transfer(GLM, 0)


@pytest.mark.parametrize(
    "role,counts",
    [("prefill", {"prefill_tokens": 1000}), ("decode", {"decode_seqs": 64, "context_tokens": 131072})],
)
def test_steptime_gives_the_cli_json(cli: Path, role: str, counts: dict[str, int]) -> None:
    args = ["steptime", LLAMA, "--role", role, "--json"]
    for k, v in counts.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    want = json.loads(pdsim_cli(cli, *args))
    got = pdsim.steptime(LLAMA, role=role, **counts)
    assert got["role"] == role
    assert {k: got[k] for k in ("step_us", "terms", "rounding_us")} == want
    with pytest.raises(pdsim.PdsimError, match="role"):
        pdsim.steptime(LLAMA, prefill_tokens=10)
