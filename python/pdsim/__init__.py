"""pdsim: a deterministic discrete-event simulator of LLM serving with
prefill/decode disaggregation, from Python.

The same library as the ``pdsim`` command line (nothing is computed in
Python): the same scenario and seed give the numbers of its files.

>>> import pdsim
>>> r = pdsim.run("scenarios/llama-3.1-8b-1p1d.toml", requests=200)   # doctest: +SKIP
>>> r.bench["median_ttft_ms"], r.requests["ttft_ms"].median()        # doctest: +SKIP

- :func:`run` → :class:`Result` (``summary``, ``bench``, ``requests``,
  ``timeline``: report.json as a dict, requests.csv and timeline.csv as
  pandas data frames);
- :func:`sweep` → a data frame of sweep.csv, on threads or on any
  ``concurrent.futures.Executor`` (:class:`pdsim.ray.RayExecutor`);
- :func:`validate`, :func:`transfer`, :func:`steptime`: the verbs of the
  same names;
- ``pdsim.plan`` will wrap the ``plan`` verb once the command line has it;
  until then the package has no such name.

Importing pdsim imports neither pandas nor numpy: they load when a data
frame is first made.
"""

from ._api import Result, run, steptime, transfer, validate
from ._core import __version__
from ._errors import InternalError, PdsimError, ScenarioError
from ._sweep import sweep, sweep_csv

__all__ = [
    "InternalError",
    "PdsimError",
    "Result",
    "ScenarioError",
    "__version__",
    "run",
    "steptime",
    "sweep",
    "sweep_csv",
    "transfer",
    "validate",
]
