#!/usr/bin/env bash
# Conformance: pdsim's scheduler against vLLM 0.33.0's own, step by step.
#
#   conformance/run.sh [--recorded] CASE.json...
#
# For each case, runs `pdsim steps CASE.json` and vLLM's real v1 Scheduler
# (vllm_steps.py, or for a decode case vllm_pd_steps.py: the decode side of
# P/D with the NIXL connector; in the venv below) on the same case, compares every step
# and prints one verdict line; the last line is `N/M cases step-identical`
# (and how many more never end, in vLLM's scheduler, which gives up after
# 100,000 calls, as in pdsim, which refuses such a case after a million).
# With --recorded, vLLM's log is read from CASE.vllm.jsonl beside the case
# instead (no vLLM needed). Exit 0 when every case is identical.
#
# The venv: see venv.sh ($VLLM_VENV, or conformance/venv, made on first use).
# pdsim is built from this checkout, with the release profile unless
# PDSIM_PROFILE names another (dev: optimized here, and no second build).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
recorded=0
if [[ "${1:-}" == "--recorded" ]]; then recorded=1; shift; fi
if [[ $# -eq 0 ]]; then echo "usage: $0 [--recorded] CASE.json..." >&2; exit 2; fi

cases=()
for c in "$@"; do cases+=("$(realpath "$c")"); done
set -- "${cases[@]}"
profile="${PDSIM_PROFILE:-release}"
(cd "$root" && cargo build --profile "$profile" --quiet --bin pdsim)
pdsim="$root/target/$([[ $profile == dev ]] && echo debug || echo "$profile")/pdsim"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [[ $recorded -eq 0 ]]; then
  python="$("$here/venv.sh")"
  if ! (cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_batch.py "$work/vllm" "$@" 2> "$work/vllm.err"); then
    tail -5 "$work/vllm.err" >&2
    exit 1
  fi
fi

# pdsim's logs first, then one comparing process for all of them.
failed=0
neither=0
: > "$work/list"
for case in "$@"; do
  name="$(basename "$case" .json)"
  if [[ $recorded -eq 1 ]]; then theirs="${case%.json}.vllm.jsonl"; else theirs="$work/vllm/$name.vllm.jsonl"; fi
  if ! "$pdsim" steps "$case" > "$work/$name.pdsim.jsonl" 2> "$work/$name.err"; then
    if grep -q "has not ended" "$work/$name.err" && tail -n 1 "$theirs" | grep -q '"no_progress"'; then
      # vLLM's scheduler never ends it either: pdsim refuses it, placed.
      echo "$name: neither ends (vLLM: no progress; $(cat "$work/$name.err"))"
      neither=$((neither + 1))
    else
      echo "$name: pdsim failed: $(cat "$work/$name.err")"
      failed=$((failed + 1))
    fi
    continue
  fi
  echo "$name $work/$name.pdsim.jsonl $theirs" >> "$work/list"
done
if ! out="$(python3 "$here/compare.py" --batch "$work/list")"; then :; fi
echo "$out" | sed '$d'
same="$(echo "$out" | tail -n 1 | cut -d/ -f1)"
if [[ $neither -gt 0 ]]; then
  echo "$same/$# cases step-identical; $neither more never end, in vLLM as in pdsim"
else
  echo "$same/$# cases step-identical"
fi
[[ $((same + neither)) -eq $# && $failed -eq 0 ]]
