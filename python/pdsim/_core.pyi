"""Type stubs of pdsim._core, the native module (python/src/lib.rs)."""

from os import PathLike

__version__: str

_Columns = list[tuple[str, str, bytes, list[str] | None]]
_Task = tuple[str, str, str, int, int | None, list[float]]

class RunOutput:
    """A finished run, held in Rust."""

    def report_json(self) -> str: ...
    def requests(self) -> _Columns: ...
    def timeline(self) -> _Columns: ...
    @property
    def wall_s(self) -> float: ...

def run(
    kind: str,
    source: str,
    overrides: str | None,
    dir: str | PathLike[str],
    seed: int | None,
    requests: int | None,
    timeline: bool,
    percentiles: list[float] | None,
) -> RunOutput: ...
def _library_call_seconds(path: str, seed: int | None, requests: int | None) -> float: ...
def validate(kind: str, source: str, overrides: str | None, dir: str | PathLike[str]) -> tuple[str, list[str]]: ...
def transfer(
    kind: str,
    source: str,
    overrides: str | None,
    dir: str | PathLike[str],
    prompt_tokens: int,
    decode_cached_tokens: int,
    bandwidth_gb_s: float | None,
) -> str: ...
def steptime(
    kind: str,
    source: str,
    overrides: str | None,
    dir: str | PathLike[str],
    role: str | None,
    prefill_tokens: int,
    prefill_seqs: int | None,
    prefill_cached: int | None,
    decode_seqs: int,
    context_tokens: int,
) -> tuple[str, float, list[tuple[str, float]], float]: ...
def sweep(
    kind: str,
    source: str,
    dir: str | PathLike[str],
    requests: int | None,
    percentiles: list[float] | None,
    jobs: int | None,
) -> str: ...
def sweep_tasks(
    kind: str,
    source: str,
    dir: str | PathLike[str],
    requests: int | None,
    percentiles: list[float] | None,
) -> tuple[str, list[_Task]]: ...
def sweep_point(name: str, toml: str, seed: int, requests: int | None, percentiles: list[float]) -> str: ...
