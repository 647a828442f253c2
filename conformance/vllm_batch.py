#!/usr/bin/env python3
"""Runs vllm_steps.py (or, for a decode case, vllm_pd_steps.py; for a
timed case, one with `step_time_ps`, vllm_timed.py, or vllm_pd_timed.py
with `"role": "pd"`) on many cases in one
process (vLLM's import takes most of half a minute):
vllm_batch.py OUT_DIR CASE.json... writes OUT_DIR/<case name>.vllm.jsonl
for each. A step case vLLM never ends (its driver's "no progress") gets
the line {"no_progress": true} after its steps, and the batch goes on."""
import contextlib
import json
import os
import sys

import vllm_pd_steps
import vllm_pd_timed
import vllm_steps
import vllm_timed


def main():
    out_dir, cases = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    for case in cases:
        name = os.path.basename(case)[: -len(".json")]
        with open(os.path.join(out_dir, name + ".vllm.jsonl"), "w") as f, contextlib.redirect_stdout(f):
            cfg = json.load(open(case))
            if "step_time_ps" in cfg:
                driver = vllm_pd_timed if cfg.get("role") == "pd" else vllm_timed
            else:
                driver = vllm_pd_steps if cfg.get("role") == "decode" else vllm_steps
            sys.argv = [os.path.basename(driver.__file__), case]
            try:
                driver.main()
            except SystemExit as e:
                # A case vLLM's own scheduler never ends (its driver gives up
                # after 100,000 calls): the log says so on its last line, and
                # the batch goes on.
                if str(e) != "no progress":
                    raise
                print(json.dumps({"no_progress": True}))


if __name__ == "__main__":
    main()
