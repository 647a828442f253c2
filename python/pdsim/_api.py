"""pdsim.run, validate, transfer and steptime: the library calls of the
command line's verbs, and :class:`Result`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from . import _core

if TYPE_CHECKING:
    import pandas

#: A scenario: a path to a TOML file, TOML text, or a dict of the file's
#: tables (paths in TOML text or a dict are relative to the current folder).
Scenario = Union[str, "os.PathLike[str]", Mapping[str, Any]]


def _source(scenario: Scenario, overrides: Mapping[str, Any] | None) -> tuple[str, str, str | None, str]:
    """(kind, source, overrides as JSON, folder) as ``pdsim._core`` takes
    them. A ``str`` is TOML text when it has a newline or an ``=`` and is
    not the name of a file; otherwise it is a path."""
    if isinstance(scenario, Mapping):
        kind, source = "json", json.dumps(dict(scenario), allow_nan=False)
    elif isinstance(scenario, os.PathLike):
        kind, source = "path", os.fspath(scenario)
    elif isinstance(scenario, str):
        text = ("\n" in scenario or "=" in scenario) and not os.path.exists(scenario)
        kind, source = ("toml" if text else "path"), scenario
    else:
        raise TypeError(f"scenario: expected a path, TOML text or a dict, got {type(scenario).__name__}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError("overrides: expected a dict of dotted paths to values, e.g. {'decode.count': 2}")
    over = json.dumps(dict(overrides), allow_nan=False) if overrides else None
    return kind, source, over, os.getcwd()


def _frame(columns: list[tuple[str, str, bytes, list[str] | None]]) -> pandas.DataFrame:
    """A data frame of columns as ``pdsim._core`` hands them over."""
    import numpy as np
    import pandas as pd

    data: dict[str, Any] = {}
    for name, kind, raw, categories in columns:
        if kind == "category":
            codes = np.frombuffer(raw, dtype=np.int32)
            data[name] = pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=object))
        else:
            data[name] = np.frombuffer(raw, dtype=kind).copy()
    return pd.DataFrame(data)


class Result:
    """One simulated run: what ``pdsim run`` writes, as Python objects.

    The parts are made when first read (and kept): ``summary`` and
    ``bench`` from report.json's text, ``requests`` and ``timeline`` from
    the run's records and timelines, held in Rust until then.
    """

    __slots__ = ("_core", "_summary", "_requests", "_timeline")

    def __init__(self, core: _core.RunOutput) -> None:
        self._core = core
        self._summary: dict[str, Any] | None = None
        self._requests: pandas.DataFrame | None = None
        self._timeline: pandas.DataFrame | None = None

    @property
    def summary(self) -> dict[str, Any]:
        """report.json as a dict: ``summary`` (latency statistics in ms,
        throughputs, goodput, failures), ``bench``, ``overload``, ``ranks``,
        ``links``, the resolved ``scenario``, ``seed``, ``digest``, …"""
        if self._summary is None:
            self._summary = json.loads(self._core.report_json())
        return self._summary

    @property
    def bench(self) -> dict[str, Any]:
        """The run as ``vllm bench serve`` reports it: its result's keys
        (``mean_ttft_ms``, ``p99_tpot_ms``, ``request_throughput``, …)."""
        return self.summary["bench"]

    @property
    def seed(self) -> int:
        """The seed of every random stream."""
        return int(self.summary["seed"])

    @property
    def digest(self) -> str:
        """The digest of every request's outcome (hex), as report.json's."""
        return str(self.summary["digest"])

    @property
    def requests(self) -> pandas.DataFrame:
        """requests.csv as a data frame: one row per request, by id, with
        the file's columns: counts as int64, times in ms as float64 (NaN
        for a stage never reached), ``outcome``, ``fail_reason`` and the
        ranks as categories."""
        if self._requests is None:
            self._requests = _frame(self._core.requests())
        return self._requests

    @property
    def timeline(self) -> pandas.DataFrame:
        """timeline.csv as a data frame (``time_ms`` float64, ``entity`` and
        ``metric`` categories, ``value`` int64): a row per series per
        instant it changed. Empty when run with ``timeline=False``."""
        if self._timeline is None:
            self._timeline = _frame(self._core.timeline())
        return self._timeline

    def __repr__(self) -> str:
        s = self.summary["summary"]
        return (
            f"<pdsim.Result seed {self.seed}: {s['requests']} requests, {s['completed']} completed, "
            f"{s['failed']} failed; digest {self.digest}>"
        )


def run(
    scenario: Scenario,
    *,
    seed: int | None = None,
    requests: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    timeline: bool = True,
    percentiles: Sequence[float] | None = None,
) -> Result:
    """Simulate a scenario, as ``pdsim run`` does.

    ``scenario`` is a path, TOML text or a dict; ``overrides`` replaces
    fields by dotted path, as a sweep's axes name them
    (``{"decode.count": 2, "link.bandwidth_gb_s": 25}``). ``seed`` and
    ``requests`` replace the scenario's (``--seed``, ``--requests``);
    ``percentiles`` are those of the ``bench`` statistics
    (``--percentiles``, default 50, 90, 95, 99). ``timeline=False`` keeps
    no timeline (``--no-timeline``; nothing else changes).

    The same scenario and seed give the numbers of the command line's
    files. The GIL is released while the simulation runs.

    Raises :class:`ScenarioError` or :class:`PdsimError` for bad input.
    """
    kind, source, over, folder = _source(scenario, overrides)
    pct = None if percentiles is None else [float(p) for p in percentiles]
    core = _core.run(kind, source, over, folder, seed, requests, timeline, pct)
    return Result(core)


def validate(scenario: Scenario, *, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check a scenario as ``pdsim validate`` does (a trace read to its end)
    and return its resolved form (includes, presets and defaults filled
    in), as ``pdsim validate --json`` prints it.

    Raises :class:`ScenarioError` (with ``file``, ``line`` and ``field``)
    for a refused scenario, :class:`PdsimError` for a bad trace row (placed
    at its line).
    """
    kind, source, over, folder = _source(scenario, overrides)
    resolved, _notes = _core.validate(kind, source, over, folder)
    return json.loads(resolved)


def transfer(
    scenario: Scenario,
    prompt_tokens: int,
    *,
    decode_cached_tokens: int = 0,
    bandwidth_gb_s: float | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Price the KV handoff of one prompt with the scenario's model and link,
    as ``pdsim transfer --json`` does: payload bytes, per-group blocks and
    bytes, the delay on an idle link."""
    kind, source, over, folder = _source(scenario, overrides)
    bw = None if bandwidth_gb_s is None else float(bandwidth_gb_s)
    return json.loads(_core.transfer(kind, source, over, folder, prompt_tokens, decode_cached_tokens, bw))


def steptime(
    scenario: Scenario,
    *,
    role: str | None = None,
    prefill_tokens: int = 0,
    prefill_seqs: int | None = None,
    prefill_cached: int | None = None,
    decode_seqs: int = 0,
    context_tokens: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Price one step with a role's step-time model, as a run builds it, as
    ``pdsim steptime --json`` does: ``{"role", "step_us", "terms",
    "rounding_us"}`` (a step lasts whole nanoseconds; ``rounding_us`` is
    what it has above the sum of its exact terms).

    ``role`` is ``"prefill"``, ``"decode"`` or ``"aggregated"`` (default:
    the scenario's only role); the counts are those of ``pdsim steptime``.
    """
    kind, source, over, folder = _source(scenario, overrides)
    r, step_us, terms, rounding = _core.steptime(
        kind, source, over, folder, role, prefill_tokens, prefill_seqs, prefill_cached, decode_seqs, context_tokens
    )
    return {"role": r, "step_us": step_us, "terms": dict(terms), "rounding_us": rounding}
