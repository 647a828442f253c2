"""pdsim.sweep: every point of a sweep, on threads here or on any
``concurrent.futures.Executor`` (a process pool, a Ray cluster)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from . import _core

if TYPE_CHECKING:
    from concurrent.futures import Executor

    import pandas

#: A sweep: a path to a sweep file, its TOML text, or a dict of its keys
#: (``scenario``, ``seeds``, ``requests``, ``axes``, ``zip``; the base
#: scenario relative to the current folder for text or a dict).
Sweep = Union[str, "os.PathLike[str]", Mapping[str, Any]]


def _point(name: str, toml: str, seed: int, requests: int | None, percentiles: list[float]) -> str:
    """One point's metric cells: the task an executor runs (a module-level
    function, so that it pickles by name)."""
    return _core.sweep_point(name, toml, seed, requests, percentiles)


def _frame(text: str) -> pandas.DataFrame:
    """sweep.csv's text as a data frame: a column of whole numbers is
    int64 (float64 where a cell is empty, as NaN), one of other numbers
    float64, each cell the double nearest its text; ``digest`` and any
    other column are text."""
    import csv

    import numpy as np
    import pandas as pd

    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], rows[1:]
    data: dict[str, Any] = {}
    for c, name in enumerate(header):
        cells = [r[c] for r in body]
        data[name] = cells if name == "digest" else _typed(cells)
    frame = pd.DataFrame(data, columns=header)
    if not body:
        return frame.astype({h: np.float64 for h in header if h != "digest"})
    return frame


def _typed(cells: list[str]) -> Any:
    """A column's cells as int64, float64 (empty cells NaN) or text."""
    import numpy as np

    present = [x for x in cells if x != ""]
    try:
        if present and len(present) == len(cells) and all(x.lstrip("-").isdigit() for x in present):
            return np.array([int(x) for x in cells], dtype=np.int64)
        return np.array([float(x) if x != "" else np.nan for x in cells], dtype=np.float64)
    except (ValueError, OverflowError):
        return cells


def sweep_csv(
    sweep: Sweep,
    *,
    requests: int | None = None,
    percentiles: Sequence[float] | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
) -> str:
    """:func:`sweep`'s result as the text of the sweep.csv ``pdsim sweep``
    writes, byte for byte."""
    if isinstance(sweep, Mapping):
        kind, source = "json", json.dumps(dict(sweep), allow_nan=False)
    elif isinstance(sweep, os.PathLike):
        kind, source = "path", os.fspath(sweep)
    elif isinstance(sweep, str):
        text = ("\n" in sweep or "=" in sweep) and not os.path.exists(sweep)
        kind, source = ("toml" if text else "path"), sweep
    else:
        raise TypeError(f"sweep: expected a path, TOML text or a dict, got {type(sweep).__name__}")
    pct = None if percentiles is None else [float(p) for p in percentiles]
    if executor is None:
        return _core.sweep(kind, source, os.getcwd(), requests, pct, jobs)
    if kind == "path":
        # Workers need no file but a trace's, named as this process finds it.
        source = os.path.abspath(source)
    header, tasks = _core.sweep_tasks(kind, source, os.getcwd(), requests, pct)
    futures = [executor.submit(_point, name, toml, seed, n, p) for (_lead, name, toml, seed, n, p) in tasks]
    lines = [header]
    try:
        lines.extend(task[0] + future.result() for task, future in zip(tasks, futures))
    finally:
        for f in futures:
            f.cancel()
    return "\n".join(lines) + "\n"


def sweep(
    sweep: Sweep,
    *,
    requests: int | None = None,
    percentiles: Sequence[float] | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
) -> pandas.DataFrame:
    """Run every point of a sweep, as ``pdsim sweep`` does, and return
    sweep.csv as a data frame: a row per point in point order (``point``,
    the axes, ``seed``, then the metric and ``bench`` columns).

    Without ``executor`` the points run here on ``jobs`` threads (default:
    the available parallelism), with the GIL released. With one (any
    ``concurrent.futures.Executor``: a ``ProcessPoolExecutor``, or
    :class:`pdsim.ray.RayExecutor` for a Ray cluster), each point is one
    task: its resolved scenario (includes and presets filled in) goes to
    the worker, which runs it with the same library, so the rows are the
    local sweep's, value for value. ``requests`` replaces the sweep's
    request count (``--requests``); ``percentiles`` as in :func:`pdsim.run`.
    """
    text = sweep_csv(sweep, requests=requests, percentiles=percentiles, jobs=jobs, executor=executor)
    return _frame(text)
