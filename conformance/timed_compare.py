#!/usr/bin/env python3
"""Per-request times, pdsim against vLLM's scheduler in simulated time.

  timed_compare.py REQUESTS.csv VLLM.jsonl     one case: a verdict line
  timed_compare.py --batch LIST                 many (lines `name csv jsonl`);
                                                the last line is `N/M`

REQUESTS.csv is `pdsim run`'s (times in ms with six decimals, read as exact
nanoseconds); VLLM.jsonl is vllm_timed.py's. A case is identical when every
request arrived, got its first token and finished at the same nanosecond
on both sides, with as many preemptions. Exit 0 when every case is.
"""
import csv
import json
import sys


def ns(ms):
    """`12.345678` ms as exact nanoseconds (None when empty)."""
    if ms == "":
        return None
    whole, _, frac = ms.partition(".")
    return int(whole) * 1_000_000 + int((frac + "000000")[:6])


# The times of a P/D request on its way, which vllm_pd_timed.py gives too:
# where two runs differ, the earliest of these that differs says where.
DETAIL = ["prefill_done", "reserved", "transfer_done", "decode_started"]


def first_detail(ours, theirs):
    """The earliest intermediate time that differs (None if none does)."""
    diffs = []
    for i in sorted(theirs):
        for k in DETAIL + ["first_token", "finished"]:
            a, b = ours[i].get(k + "_ns"), theirs[i].get(k + "_ns")
            if k + "_ns" in theirs[i] and a != b:
                diffs.append((min(x for x in (a, b) if x is not None), i, k, a, b))
    if not diffs:
        return ""
    t, i, k, a, b = min(diffs)
    return f" (first on its way: request {i}'s {k} pdsim {a} vLLM {b})"


def pdsim_rows(path):
    with open(path, newline="") as f:
        return {int(r["id"]): dict(id=int(r["id"]), outcome=r["outcome"], arrival_ns=ns(r["arrival_ms"]),
                                   first_token_ns=ns(r["first_token_ms"]), finished_ns=ns(r["finished_ms"]),
                                   preemptions=int(r["preemptions"]),
                                   **{k + "_ns": ns(r[k + "_ms"]) for k in DETAIL if k + "_ms" in r})
                for r in csv.DictReader(f)}


def verdict(name, csv_path, jsonl_path):
    ours = pdsim_rows(csv_path)
    theirs = {}
    with open(jsonl_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                theirs[r["id"]] = r
    if set(ours) != set(theirs):
        return False, f"{name}: request ids differ ({len(ours)} in pdsim, {len(theirs)} in vLLM)"
    for i in sorted(theirs):
        a, b = ours[i], theirs[i]
        if a["outcome"] != "completed":
            return False, f"{name}: request {i}: pdsim {a['outcome']}"
        for k in ("arrival_ns", "first_token_ns", "finished_ns", "preemptions"):
            if a[k] != b[k]:
                return False, f"{name}: request {i}: {k} pdsim {a[k]} vLLM {b[k]}" + first_detail(ours, theirs)
    preempted = sum(r["preemptions"] for r in theirs.values())
    return True, f"{name}: identical ({len(theirs)} requests, {preempted} preemptions)"


def main():
    if sys.argv[1] == "--batch":
        same = total = 0
        for line in open(sys.argv[2]):
            if line.strip():
                ok, text = verdict(*line.split())
                print(text)
                same += ok
                total += 1
        print(f"{same}/{total}")
        sys.exit(0 if same == total else 1)
    ok, text = verdict("case", sys.argv[1], sys.argv[2])
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
