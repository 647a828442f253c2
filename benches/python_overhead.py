"""What pdsim.run adds to the library call it wraps, and what importing
pdsim costs. Not a test (it times things): run it by hand on a quiet
machine, from the repository's root, with the package installed.

    python benches/python_overhead.py [SCENARIO] [REQUESTS] [REPEATS]

The library call is the scenario's load and simulation in Rust (the
runner's default: every record and timeline row kept, as pdsim.run keeps
them), timed in Rust inside the same extension; pdsim.run is timed from
Python and includes turning report.json into a dict. The two alternate,
REPEATS times each; the medians are printed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import pdsim
from pdsim import _core


def main() -> None:
    scenario = sys.argv[1] if len(sys.argv) > 1 else "benches/scenarios/e2e-llama-1p1d.toml"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    lib, api = [], []
    for _ in range(repeats):
        lib.append(_core._library_call_seconds(scenario, None, requests))
        start = time.perf_counter()
        r = pdsim.run(scenario, requests=requests)
        _ = r.summary
        api.append(time.perf_counter() - start)
        del r
    ml, ma = statistics.median(lib), statistics.median(api)
    print(f"{scenario}, {requests} requests, {repeats} runs each")
    print(f"library call (Rust)  median {ml:.3f} s  [{', '.join(f'{x:.3f}' for x in lib)}]")
    print(f"pdsim.run            median {ma:.3f} s  [{', '.join(f'{x:.3f}' for x in api)}]")
    print(f"pdsim.run adds       {100 * (ma - ml) / ml:+.2f} %")
    walls = {}
    for label, code in [("python -c pass", "pass"), ("python -c 'import pdsim'", "import pdsim")]:
        times = []
        for _ in range(21):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - start)
        walls[label] = statistics.median(times)
        print(f"{label:<26} median wall {1000 * walls[label]:.1f} ms over 21 runs")


if __name__ == "__main__":
    main()
