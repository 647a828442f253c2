#!/usr/bin/env python3
"""Runs vllm_pd_steps.py on many decode (P/D) cases in one process (vLLM's
import takes most of half a minute): vllm_pd_batch.py OUT_DIR CASE.json...
writes OUT_DIR/<case name>.vllm.jsonl for each."""
import contextlib
import os
import sys

import vllm_pd_steps


def main():
    out_dir, cases = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    for case in cases:
        name = os.path.basename(case)[: -len(".json")]
        with open(os.path.join(out_dir, name + ".vllm.jsonl"), "w") as f, contextlib.redirect_stdout(f):
            sys.argv = ["vllm_pd_steps.py", case]
            vllm_pd_steps.main()


if __name__ == "__main__":
    main()
