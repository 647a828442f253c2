#!/usr/bin/env bash
# Regenerates the recorded cases CI checks (conformance/cases/gen-2-*):
# the first 60 full-attention cases of seed 2 and the 16 of its first 2,000
# that need a finished request's own blocks cached (69, 129, ...), 100 hybrid
# cases of seed 3 (window or Mamba groups), and the first 30 window-only
# cases of seed 22 and sizes cases of seed 23 (the window cache) and
# Mamba-only cases of seed 43, with vLLM 0.33.0's step logs.
#
#   conformance/record.sh
#
# The venv: see venv.sh. The seven hand-written cases (case1..case7) are
# kept as they are.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="$("$here/venv.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$here/gen_cases.py" 2 2000 "$work"
python3 "$here/gen_cases.py" 3 100 "$work" --groups mixed
python3 "$here/gen_cases.py" 22 30 "$work" --groups window-only
python3 "$here/gen_cases.py" 23 30 "$work" --groups sizes
python3 "$here/gen_cases.py" 43 30 "$work" --groups mamba-only
rm -f "$here"/cases/gen-2-* "$here"/cases/gen-3-* "$here"/cases/gen-22-* "$here"/cases/gen-23-* "$here"/cases/gen-43-*
for k in $(seq 0 59) 69 129 209 210 374 591 795 877 878 900 997 1017 1235 1566 1873 1937; do cp "$work/gen-2-$k.json" "$here/cases/"; done
cp "$work"/gen-3-*.json "$work"/gen-22-*.json "$work"/gen-23-*.json "$work"/gen-43-*.json "$here/cases/"
cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_batch.py cases cases/gen-2-*.json cases/gen-3-*.json \
  cases/gen-22-*.json cases/gen-23-*.json cases/gen-43-*.json \
  2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
# Admission by the first chunk (scheduler_reserve_full_isl = false): the
# cases of seeds 1101-1104 that admit differently from the default.
first="$work/first"
python3 "$here/gen_cases.py" 1101 60 "$first" --first-chunk
python3 "$here/gen_cases.py" 1102 40 "$first" --groups window --first-chunk
python3 "$here/gen_cases.py" 1103 40 "$first" --groups mamba --first-chunk
python3 "$here/gen_cases.py" 1104 60 "$first" --async --first-chunk
rm -f "$here"/cases/gen-110[1-4]-*
for k in 1101-0 1101-11 1101-19 1101-23 1101-25 1101-42 1101-47 1101-50 1101-52 1101-53 1101-55 1101-59 1101-8 \
  1102-14 1102-21 1102-23 1102-26 1102-32 1102-35 1102-5 1103-1 1103-10 1103-14 1103-23 1103-26 1103-27 1103-39 \
  1103-8 1104-1 1104-12 1104-13 1104-17 1104-20 1104-26 1104-33 1104-36 1104-39 1104-52 1104-55 1104-6; do
  cp "$first/gen-$k.json" "$here/cases/"
done
"$python" vllm_batch.py cases cases/gen-110[1-4]-*.json 2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
echo "recorded $(ls cases/gen-*.vllm.jsonl | wc -l) cases"
