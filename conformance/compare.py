#!/usr/bin/env python3
"""Compares a pdsim step log (`pdsim steps CASE`) with vLLM's
(`vllm_steps.py CASE`), step by step.

usage: compare.py PDSIM.jsonl VLLM.jsonl  -> prints one verdict line,
exit 0 if step-identical, 1 if not.

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


def main():
    pd = [norm_pdsim(json.loads(l)) for l in open(sys.argv[1]) if l.strip()]
    vl = [norm_vllm(json.loads(l)) for l in open(sys.argv[2]) if l.strip()]
    d = first_difference(pd, vl)
    if d is None:
        print(f"identical ({len(vl)} steps)")
        return 0
    i, a, b = d
    print(f"differs at step {i} of {len(vl)} (pdsim {len(pd)}): pdsim {a} vLLM {b}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
