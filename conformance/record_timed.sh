#!/usr/bin/env bash
# Regenerates the recorded timed cases CI checks (conformance/timed/):
# five cases of 300 requests in each family, with vLLM 0.33.0's per-request
# times (vllm_timed.py): full attention (seeds 21, 22), a sliding window
# (23, 24) and a Mamba state with a tail ring (25, 26), each with the
# synchronous loop and then the asynchronous one.
#
#   conformance/record_timed.sh
#
# Each case keeps its scenario (NAME.toml), its trace (NAME.trace.jsonl) and
# vLLM's times (NAME.vllm.jsonl); the vLLM case itself (NAME.json) is
# regenerated from its seed by gen_timed.py. The venv: see venv.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="$("$here/venv.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# SEED GROUPS COUNT [flags]; the 164x families draw vLLM's scheduler
# options (--options): 1644-5 found that two recomputes of one prefix in
# lockstep cache the same state twice. The 303x families run vLLM's
# priority policy (--priority); 312x have groups of one spec (two or three
# full-attention groups), 710x two or three window groups of one spec;
# 410x are 1P1D deployments (--pd: vllm_pd_timed.py, the decode engine's
# times), 520x and 7105 the same under the asynchronous loop; 7801-7802
# put a window beside a Mamba state on both sides of a 1P1D deployment
# (400 requests: 7801-2 and 7802-0 found that a window group reads past
# its own hit).
for family in "21 full 5" "22 full 5 --async" "23 window 5" "24 window 5 --async" "25 mamba 5" \
  "26 mamba 5 --async" "1641 full 4 --options" "1642 full 4 --async --options" \
  "1643 window 4 --async --options" "1644 mamba 6 --options" "1645 mamba 4 --async --options" \
  "3031 full 4 --priority" "3032 full 4 --async --priority" "3121 full2 3" "3122 full3 3 --async" \
  "4101 full 3 --pd" "4102 window 3 --pd" "4103 mamba 3 --pd" "4104 full2 3 --pd" "4106 full 2 --pd --options" \
  "4107 full 2 --pd --priority" "4110 mixed 4 --pd" "5201 full 3 --pd --async" "5202 mixed 4 --pd --async" \
  "5204 window 3 --pd --async" "5205 mamba 3 --pd --async" "5206 full 3 --pd --async --options" "7102 windows 2 --async" "7105 windows 2 --pd --async" \
  "7801 window-mamba 3 --pd --requests 400" "7802 window-mamba 1 --pd --async --requests 400"; do
  # shellcheck disable=SC2086
  set -- $family
  python3 "$here/gen_timed.py" "$1" "$3" "$work" --groups "$2" "${@:4}" --requests 300
done
(cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_batch.py "$work" "$work"/timed-*.json 2> "$work/err") \
  || { tail -5 "$work/err" >&2; exit 1; }
rm -rf "$here/timed"
mkdir -p "$here/timed"
cp "$work"/timed-*.toml "$work"/timed-*.trace.jsonl "$work"/timed-*.vllm.jsonl "$here/timed/"
echo "recorded $(ls "$here"/timed/*.toml | wc -l) timed cases in $here/timed"
