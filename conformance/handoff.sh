#!/usr/bin/env bash
# The handoff payload: `pdsim transfer` against vLLM 0.33.0's own NIXL pull
# path, on seeded random queries over the shipped model fragments and
# random models (full attention, sliding windows, Mamba states, tail
# rings, mixed block sizes, linear models).
#
#   conformance/handoff.sh [SEED [MODELS [QUERIES_PER_MODEL]]]   (default 1 200 50)
#   conformance/handoff.sh --record      # seed 1, 200 x 50, into conformance/handoff/
#   conformance/handoff.sh --recorded    # compare against conformance/handoff/, no vLLM
#
# Prints each query on which they disagree, then `N/M queries agree`;
# exit 0 only when all do. The venv: see venv.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
(cd "$root" && cargo build --release --quiet)
pdsim="$root/target/release/pdsim"
if [[ "${1:-}" == "--recorded" ]]; then
  exec python3 "$here/handoff.py" compare "$pdsim" "$here/handoff"
fi
if [[ "${1:-}" == "--record" ]]; then
  out="$here/handoff"
  set -- 1 200 50
else
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
python="$("$here/venv.sh")"
python3 "$here/handoff.py" gen "${1:-1}" "${2:-200}" "${3:-50}" "$out"
python3 "$here/handoff.py" oracle-input "$out" > "$out/vllm.in"
(cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_handoff.py < "$out/vllm.in" > "$out/vllm.out" 2> "$out/vllm.err") \
  || { tail -5 "$out/vllm.err" >&2; exit 1; }
python3 "$here/handoff.py" answers "$out" "$out/vllm.out"
rm -f "$out/vllm.in" "$out/vllm.out" "$out/vllm.err" "$out/queries.jsonl"
python3 "$here/handoff.py" compare "$pdsim" "$out"
