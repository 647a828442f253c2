#!/usr/bin/env bash
# Timed conformance: `pdsim run` against vLLM 0.33.0's scheduler driven in
# simulated time by the engine core's loop (vllm_timed.py), request by request.
#
#   conformance/timed.sh CASE.json...                 live vLLM
#   conformance/timed.sh --recorded CASE.toml...      the recorded times
#
# A case (gen_timed.py) is CASE.json, the vLLM side, with CASE.toml and
# CASE.trace.jsonl beside it: the same deployment as a pdsim scenario.
# Runs `pdsim run CASE.toml` and vLLM on CASE.json (with --recorded, reads
# CASE.vllm.jsonl instead: conformance/timed/ holds recorded cases), then
# timed_compare.py: one verdict line per case and `N/M cases identical`
# last. Exit 0 when every case is identical.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
recorded=0
if [[ "${1:-}" == "--recorded" ]]; then recorded=1; shift; fi
if [[ $# -eq 0 ]]; then echo "usage: $0 [--recorded] CASE.json..." >&2; exit 2; fi

cases=()
for c in "$@"; do c="$(realpath "$c")"; c="${c%.json}"; cases+=("${c%.toml}"); done
set -- "${cases[@]}"
profile="${PDSIM_PROFILE:-release}"
(cd "$root" && cargo build --profile "$profile" --quiet --bin pdsim)
pdsim="$root/target/$([[ $profile == dev ]] && echo debug || echo "$profile")/pdsim"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [[ $recorded -eq 0 ]]; then
  python="$("$here/venv.sh")"
  jsons=()
  for case in "$@"; do jsons+=("$case.json"); done
  if ! (cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_batch.py "$work/vllm" "${jsons[@]}" 2> "$work/vllm.err"); then
    tail -5 "$work/vllm.err" >&2
    exit 1
  fi
fi

failed=0
: > "$work/list"
for case in "$@"; do
  name="$(basename "$case")"
  if [[ $recorded -eq 1 ]]; then theirs="$case.vllm.jsonl"; else theirs="$work/vllm/$name.vllm.jsonl"; fi
  if ! "$pdsim" run "$case.toml" --out "$work/$name" -q --no-trace --no-timeline --no-vllm-bench \
      2> "$work/$name.err"; then
    echo "$name: pdsim failed: $(cat "$work/$name.err")"
    failed=$((failed + 1))
    continue
  fi
  echo "$name $work/$name/requests.csv $theirs" >> "$work/list"
done
if ! out="$(python3 "$here/timed_compare.py" --batch "$work/list")"; then :; fi
echo "$out" | sed '$d'
same="$(echo "$out" | tail -n 1 | cut -d/ -f1)"
echo "$same/$# cases identical"
[[ $same -eq $# && $failed -eq 0 ]]
