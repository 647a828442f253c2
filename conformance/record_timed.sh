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
for family in "21 full" "22 full --async" "23 window" "24 window --async" "25 mamba" "26 mamba --async"; do
  # shellcheck disable=SC2086
  set -- $family
  python3 "$here/gen_timed.py" "$1" 5 "$work" --groups "$2" ${3:-} --requests 300
done
(cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_batch.py "$work" "$work"/timed-*.json 2> "$work/err") \
  || { tail -5 "$work/err" >&2; exit 1; }
rm -rf "$here/timed"
mkdir -p "$here/timed"
cp "$work"/timed-*.toml "$work"/timed-*.trace.jsonl "$work"/timed-*.vllm.jsonl "$here/timed/"
echo "recorded $(ls "$here"/timed/*.toml | wc -l) timed cases in $here/timed"
