#!/usr/bin/env python3
"""Compares a pdsim step log (`pdsim steps CASE`) with vLLM's
(`vllm_steps.py CASE`), step by step.

usage: compare.py PDSIM.jsonl VLLM.jsonl  -> prints one verdict line,
exit 0 if step-identical, 1 if not.
       compare.py --batch LIST  -> LIST has one `NAME PDSIM.jsonl VLLM.jsonl`
per line; prints `NAME: verdict` for each and a last line `N/M cases
step-identical`; exit 0 if all are (one process for many cases: Python's
start-up dominates a case's comparison).

A step matches when the same requests are scheduled with the same tokens
in the same order, the same ones are preempted, and the same ones finish
after it; in a decode case (P/D), also when the same remote loads are
reserved, in the same order (`reserved`). vLLM's log writes `batch` sorted by id and the scheduling order
in `order`; pdsim writes `batch` in scheduling order.
"""
import json
import sys


def norm_vllm(line):
    batch = {int(k): v for k, v in line["batch"].items()}
    return ([(i, batch[i]) for i in line["order"]], sorted(line["preempted"]), sorted(line["finished_after"]),
            line.get("reserved"))


def norm_pdsim(line):
    return ([(int(k), v) for k, v in line["batch"].items()], sorted(line["preempted"]),
            sorted(line["finished_after"]), line.get("reserved"))


def first_difference(pd, vl):
    for i, (a, b) in enumerate(zip(pd, vl)):
        if a != b:
            return i, a, b
    if len(pd) != len(vl):
        i = min(len(pd), len(vl))
        return i, pd[i] if i < len(pd) else None, vl[i] if i < len(vl) else None
    return None


def verdict(pdsim_path, vllm_path):
    """(identical, the verdict line) for one case."""
    pd = [norm_pdsim(json.loads(l)) for l in open(pdsim_path) if l.strip()]
    vl = [norm_vllm(json.loads(l)) for l in open(vllm_path) if l.strip()]
    d = first_difference(pd, vl)
    if d is None:
        return True, f"identical ({len(vl)} steps)"
    i, a, b = d
    return False, f"differs at step {i} of {len(vl)} (pdsim {len(pd)}): pdsim {a} vLLM {b}"


def main():
    if sys.argv[1] == "--batch":
        same = total = 0
        for line in open(sys.argv[2]):
            if not line.strip():
                continue
            name, mine, theirs = line.split()
            total += 1
            try:
                ok, text = verdict(mine, theirs)
            except OSError as e:
                ok, text = False, f"no log: {e}"
            same += ok
            print(f"{name}: {text}")
        print(f"{same}/{total} cases step-identical")
        return 0 if same == total else 1
    ok, text = verdict(sys.argv[1], sys.argv[2])
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
