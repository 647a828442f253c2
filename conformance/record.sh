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
# The venv: see venv.sh. The hand-written cases (case1..case7, case9_*) are
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
# vLLM's scheduler options (--options), the cases whose steps the options
# change (pdsim's log with them differs from the same case without), and
# two asynchronous Mamba cases a stale placeholder mark broke (1618-112,
# 1618-147: a recompute's chunk cached all it computed).
opts="$work/options"
python3 "$here/gen_cases.py" 1611 41 "$opts" --options
python3 "$here/gen_cases.py" 1612 22 "$opts" --groups window --options
python3 "$here/gen_cases.py" 1613 25 "$opts" --groups mamba --options
python3 "$here/gen_cases.py" 1614 8 "$opts" --groups window-only --options
python3 "$here/gen_cases.py" 1615 12 "$opts" --groups mamba-only --options
python3 "$here/gen_cases.py" 1616 38 "$opts" --async --options
python3 "$here/gen_cases.py" 1617 18 "$opts" --groups window --async --options
python3 "$here/gen_cases.py" 1618 148 "$opts" --groups mamba --async --options
rm -f "$here"/cases/gen-16[01][0-9]-*
for k in 1611-1 1611-6 1611-7 1611-8 1611-9 1611-12 1611-13 1611-14 1611-15 1611-17 1611-18 1611-22 1611-23 \
  1611-24 1611-25 1611-26 1611-27 1611-28 1611-29 1611-30 1611-34 1611-35 1611-38 1611-40 \
  1612-0 1612-3 1612-5 1612-6 1612-8 1612-9 1612-11 1612-13 1612-15 1612-17 1612-20 1612-21 \
  1613-0 1613-1 1613-2 1613-6 1613-7 1613-8 1613-11 1613-12 1613-16 1613-17 1613-18 1613-24 \
  1614-0 1614-1 1614-2 1614-3 1614-5 1614-7 1615-0 1615-4 1615-6 1615-9 1615-10 1615-11 \
  1616-1 1616-2 1616-4 1616-8 1616-15 1616-18 1616-20 1616-21 1616-25 1616-26 1616-29 1616-31 1616-35 1616-37 \
  1617-3 1617-5 1617-7 1617-8 1617-11 1617-14 1617-15 1617-17 \
  1618-1 1618-2 1618-5 1618-6 1618-7 1618-9 1618-10 1618-11 1618-112 1618-147; do
  cp "$opts/gen-$k.json" "$here/cases/"
done
"$python" vllm_batch.py cases cases/gen-16[01][0-9]-*.json 2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
# vLLM's priority policy (--priority): cases whose steps the policy
# changes (pdsim's log with it differs from the same case under FCFS).
prio="$work/priority"
python3 "$here/gen_cases.py" 3001 41 "$prio" --priority
python3 "$here/gen_cases.py" 3002 23 "$prio" --async --priority
python3 "$here/gen_cases.py" 3003 25 "$prio" --groups window --priority
python3 "$here/gen_cases.py" 3004 16 "$prio" --groups mamba --priority
python3 "$here/gen_cases.py" 3005 13 "$prio" --groups window-only --priority
python3 "$here/gen_cases.py" 3006 10 "$prio" --groups mamba-only --priority
python3 "$here/gen_cases.py" 3007 14 "$prio" --options --priority
python3 "$here/gen_cases.py" 3008 13 "$prio" --groups window --async --priority
python3 "$here/gen_cases.py" 3009 17 "$prio" --groups mamba --async --priority
rm -f "$here"/cases/gen-300[1-9]-*
for k in $(echo \
  3001-0 3001-1 3001-2 3001-7 3001-8 3001-13 3001-14 3001-16 3001-21 3001-22 3001-23 3001-24 3001-25 3001-26 \
  3001-28 3001-31 3001-34 3001-36 3001-38 3001-40 3002-0 3002-3 3002-4 3002-5 3002-6 3002-9 3002-11 3002-13 \
  3002-14 3002-15 3002-17 3002-19 3002-20 3002-21 3002-22 3003-6 3003-9 3003-11 3003-12 3003-13 3003-16 \
  3003-17 3003-20 3003-21 3003-24 3004-0 3004-2 3004-3 3004-7 3004-8 3004-10 3004-11 3004-12 3004-14 3004-15 \
  3005-1 3005-2 3005-7 3005-9 3005-10 3005-12 3006-3 3006-5 3006-6 3006-7 3006-8 3006-9 3007-0 3007-1 3007-2 \
  3007-5 3007-7 3007-8 3007-10 3007-11 3007-12 3007-13 3008-0 3008-2 3008-4 3008-5 3008-7 3008-8 3008-10 \
  3008-12 3009-2 3009-4 3009-6 3009-10 3009-15 3009-16);  do
  cp "$prio/gen-$k.json" "$here/cases/"
done
"$python" vllm_batch.py cases cases/gen-300[1-9]-*.json 2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
# Groups of one spec (two or three full-attention groups): cases whose
# steps differed before each group was held apart (all identical now).
one="$work/one-spec"
python3 "$here/gen_cases.py" 3101 100 "$one" --groups full2
python3 "$here/gen_cases.py" 3102 100 "$one" --groups full3
python3 "$here/gen_cases.py" 3103 100 "$one" --groups full2 --async
python3 "$here/gen_cases.py" 3104 100 "$one" --groups full3 --async
python3 "$here/gen_cases.py" 3105 100 "$one" --groups full2 --priority
python3 "$here/gen_cases.py" 3106 100 "$one" --groups full3 --options
rm -f "$here"/cases/gen-310[1-6]-*
for k in $(echo \
  3101-2 3101-21 3101-24 3101-28 3101-32 3101-33 3101-62 3101-63 3101-70 3101-92 3101-94 3101-99 \
  3102-36 3102-39 3102-65 3102-67 3102-73 3102-75 3102-8 3102-82 3102-97 3103-29 3103-43 3103-49 \
  3103-52 3103-67 3103-74 3103-86 3103-88 3103-9 3103-90 3104-1 3104-17 3104-23 3104-37 3104-47 \
  3104-61 3104-71 3104-85 3104-94 3105-16 3105-17 3105-42 3105-46 3105-59 3105-69 3105-79 3105-99 \
  3106-16 3106-19 3106-22 3106-23 3106-25 3106-31 3106-44 3106-46 3106-53 3106-6 3106-71 3106-91 \
  3106-92 3106-93 3106-94 3106-96 \
  ); do
  cp "$one/gen-$k.json" "$here/cases/"
done
"$python" vllm_batch.py cases cases/gen-310[1-6]-*.json 2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
echo "recorded $(ls cases/gen-*.vllm.jsonl | wc -l) cases"
# A sliding window beside a Mamba state in one model (--groups
# window-mamba): the cases that differed before pdsim kept the window
# cache there, and the first ten of each seed.
wm="$work/window-mamba"
python3 "$here/gen_cases.py" 6001 60 "$wm" --groups window-mamba
python3 "$here/gen_cases.py" 6002 60 "$wm" --groups window-mamba --async
rm -f "$here"/cases/gen-600[12]-*
for k in 6001-10 6001-16 6001-56 6002-5 6002-8 6002-28 6002-29 6002-30 6002-33 6002-35 6002-44 6002-58 \
  $(seq -f "6001-%g" 0 9) $(seq -f "6002-%g" 0 4) $(seq -f "6002-%g" 6 7) 6002-9; do
  cp "$wm/gen-$k.json" "$here/cases/"
done
"$python" vllm_batch.py cases cases/gen-600[12]-*.json 2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
echo "recorded $(ls cases/gen-*.vllm.jsonl | wc -l) cases"
# Window groups of one spec (--groups windows): the cases that differed
# before each window group's blocks were cache entries of their own, and
# the first five of each seed.
ws="$work/windows"
python3 "$here/gen_cases.py" 4305 60 "$ws" --groups windows
python3 "$here/gen_cases.py" 7001 200 "$ws" --groups windows
python3 "$here/gen_cases.py" 7002 150 "$ws" --groups windows --async
rm -f "$here"/cases/gen-4305-* "$here"/cases/gen-700[12]-*
for k in 4305-40 7001-14 $(seq -f "7001-%g" 0 4) $(seq -f "7002-%g" 0 4); do
  cp "$ws/gen-$k.json" "$here/cases/"
done
"$python" vllm_batch.py cases cases/gen-4305-*.json cases/gen-700[12]-*.json 2> "$work/err" \
  || { tail -5 "$work/err" >&2; exit 1; }
echo "recorded $(ls cases/gen-*.vllm.jsonl | wc -l) cases"
