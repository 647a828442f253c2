#!/usr/bin/env bash
# Regenerates the recorded decode-side (P/D) cases (conformance/pd_cases/):
# 60 generated cases of seed 5 (gen-pd-5-*), the 18 of seed 6's first 500
# where a landed load caches content another request cached meanwhile
# (vLLM keeps both copies), 50 with a sliding window (seed 7, --groups
# window, gen-pd-7-*) and 50 with a Mamba state (seed 8, --groups mamba,
# gen-pd-8-*), the families below (options, policies, groups of one spec,
# the asynchronous loop), and the hand-written ones (pd1..pd5), with vLLM
# 0.33.0's step logs (vllm_pd_steps.py).
#
#   conformance/record_pd.sh
#
# The venv: see venv.sh. The hand-written cases are kept as they are.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="$("$here/venv.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -f "$here"/pd_cases/gen-pd-5-* "$here"/pd_cases/gen-pd-6-* "$here"/pd_cases/gen-pd-7-* "$here"/pd_cases/gen-pd-8-*
python3 "$here/gen_pd_cases.py" 5 60 "$here/pd_cases"
python3 "$here/gen_pd_cases.py" 7 50 "$here/pd_cases" --groups window
python3 "$here/gen_pd_cases.py" 8 50 "$here/pd_cases" --groups mamba
python3 "$here/gen_pd_cases.py" 6 500 "$work"
for k in 12 153 178 18 184 21 29 327 328 343 375 379 387 397 438 441 469 92; do cp "$work/gen-pd-6-$k.json" "$here/pd_cases/"; done
# Admission by the first chunk (scheduler_reserve_full_isl = false): the
# cases of seeds 1106-1107 that reserve differently from the default.
rm -f "$here"/pd_cases/gen-pd-110[67]-*
python3 "$here/gen_pd_cases.py" 1106 60 "$work" --first-chunk
python3 "$here/gen_pd_cases.py" 1107 40 "$work" --groups window --first-chunk
for k in 1106-2 1106-53 1107-15 1107-20 1107-34 1107-5 1107-9; do cp "$work/gen-pd-$k.json" "$here/pd_cases/"; done
# vLLM's scheduler options (--options): cases whose steps the options change,
# and seven decode-side Mamba ones (1621-3 .. 1621-107) that differed with or
# without the options until the connector's hit and the in-flight prefills'
# state block were followed.
rm -f "$here"/pd_cases/gen-pd-16[12][0-9]-*
python3 "$here/gen_pd_cases.py" 1619 31 "$work" --options
python3 "$here/gen_pd_cases.py" 1620 20 "$work" --groups window --options
python3 "$here/gen_pd_cases.py" 1621 108 "$work" --groups mamba --options
for k in 1619-2 1619-8 1619-12 1619-14 1619-16 1619-17 1619-18 1619-21 1619-22 1619-25 1619-28 1619-30 \
  1620-0 1620-8 1620-11 1620-12 1620-13 1620-15 1620-17 1620-19 \
  1621-6 1621-7 1621-12 1621-19 1621-20 1621-28 1621-30 1621-35 \
  1621-3 1621-34 1621-49 1621-52 1621-76 1621-94 1621-107; do
  cp "$work/gen-pd-$k.json" "$here/pd_cases/"
done
# Four a reservation's hit state decided (vLLM counts a state block besides
# it, and then holds one).
rm -f "$here"/pd_cases/gen-pd-166[1-4]-*
python3 "$here/gen_pd_cases.py" 1661 282 "$work" --groups mamba
python3 "$here/gen_pd_cases.py" 1662 92 "$work" --groups mamba --options
python3 "$here/gen_pd_cases.py" 1664 191 "$work" --groups mamba
# (1664-117, 3013-44 and 3151-46: a handoff whose full-attention hit
# covers its tokens with no state there is computed on the decode side.)
python3 "$here/gen_pd_cases.py" 3151 47 "$work" --groups mamba
for k in 1661-20 1661-281 1662-91 1664-117 1664-190 3151-46; do cp "$work/gen-pd-$k.json" "$here/pd_cases/"; done
# vLLM's priority policy (--priority): cases whose steps it changes.
rm -f "$here"/pd_cases/gen-pd-301[1-3]-*
python3 "$here/gen_pd_cases.py" 3011 12 "$work" --priority
python3 "$here/gen_pd_cases.py" 3012 13 "$work" --groups window --priority
python3 "$here/gen_pd_cases.py" 3013 45 "$work" --groups mamba --priority
for k in 3011-0 3011-1 3011-2 3011-3 3011-4 3011-5 3011-6 3011-7 3011-8 3011-9 3011-10 3011-11 \
  3012-0 3012-1 3012-2 3012-4 3012-5 3012-6 3012-11 3012-12 \
  3013-2 3013-4 3013-5 3013-6 3013-7 3013-8 3013-15 3013-19 3013-44; do
  cp "$work/gen-pd-$k.json" "$here/pd_cases/"
done
# Groups of one spec: cases whose steps differed before each
# full-attention group was held apart.
rm -f "$here"/pd_cases/gen-pd-311[1-3]-*
python3 "$here/gen_pd_cases.py" 3111 100 "$work" --groups full2
python3 "$here/gen_pd_cases.py" 3112 100 "$work" --groups full3
python3 "$here/gen_pd_cases.py" 3113 60 "$work" --groups full2 --priority
for k in \
  3111-2 3111-20 3111-22 3111-24 3111-3 3111-30 3111-34 3111-40 3111-44 3111-46 3111-54 3111-60 \
  3111-61 3111-62 3111-65 3111-69 3111-70 3111-74 3111-75 3111-77 3111-82 3111-83 3111-84 3111-92 \
  3111-93 3112-17 3112-18 3112-21 3112-27 3112-3 3112-32 3112-4 3112-40 3112-42 3112-43 3112-45 \
  3112-46 3112-49 3112-55 3112-56 3112-61 3112-62 3112-63 3112-70 3112-71 3112-76 3112-80 3112-83 \
  3112-87 3112-9 3112-91 3112-93 3112-97 3113-1 3113-13 3113-18 3113-24 3113-25 3113-29 3113-31 \
  3113-36 3113-44 3113-45 3113-46 3113-50 3113-55 3113-57 3113-7 3113-8 \
  ; do
  cp "$work/gen-pd-$k.json" "$here/pd_cases/"
done
# The asynchronous engine loop (--async): the cases that differed before
# the decode side followed it (a victim the batch in flight writes is not
# preempted, what a preemption leaves cached, the window blocks a failed
# allocation frees, the arrival order), and three with preemptions from
# each family.
rm -f "$here"/pd_cases/gen-pd-510[1-3]-* "$here"/pd_cases/gen-pd-51[12][0-9]-*
python3 "$here/gen_pd_cases.py" 5101 47 "$work" --async
python3 "$here/gen_pd_cases.py" 5102 42 "$work" --groups window --async
python3 "$here/gen_pd_cases.py" 5103 56 "$work" --groups mamba --async
python3 "$here/gen_pd_cases.py" 5111 10 "$work" --async
python3 "$here/gen_pd_cases.py" 5112 9 "$work" --groups window --async
python3 "$here/gen_pd_cases.py" 5113 3 "$work" --groups mamba --async
python3 "$here/gen_pd_cases.py" 5114 5 "$work" --groups full2 --async
python3 "$here/gen_pd_cases.py" 5115 4 "$work" --options --async
python3 "$here/gen_pd_cases.py" 5116 94 "$work" --priority --async
python3 "$here/gen_pd_cases.py" 5117 8 "$work" --first-chunk --async
python3 "$here/gen_pd_cases.py" 5118 4 "$work" --groups mamba --options --async
python3 "$here/gen_pd_cases.py" 5119 13 "$work" --groups window --priority --async
python3 "$here/gen_pd_cases.py" 5120 3 "$work" --groups full3 --async
for k in 5101-3 5101-39 5101-46 5101-6 5102-2 5102-21 5102-24 5102-3 5102-41 5102-6 \
  5103-0 5103-27 5103-40 5103-43 5103-55 5116-6 5116-93 5119-12 \
  5117-0 5117-4 5117-7 5111-3 5111-7 5111-9 5114-0 5114-2 5114-4 5120-0 5120-1 5120-2 \
  5113-0 5113-1 5113-2 5118-0 5118-1 5118-3 5115-0 5115-2 5115-3 5116-0 5116-1 5116-2 \
  5112-3 5112-6 5112-8 5119-1 5119-2 5119-3; do
  cp "$work/gen-pd-$k.json" "$here/pd_cases/"
done
# A sliding window beside a Mamba state (--groups window-mamba): the cases
# that differed before pdsim kept the window cache there and took each
# group's own hit for a load, and the first five of each seed.
rm -f "$here"/pd_cases/gen-pd-600[34]-* "$here"/pd_cases/gen-pd-602[12]-*
python3 "$here/gen_pd_cases.py" 6003 60 "$work" --groups window-mamba
python3 "$here/gen_pd_cases.py" 6004 60 "$work" --groups window-mamba --async
python3 "$here/gen_pd_cases.py" 6021 60 "$work" --groups window-mamba
python3 "$here/gen_pd_cases.py" 6022 34 "$work" --groups window-mamba --async
for k in 6003-2 6003-19 6003-20 6003-26 6003-27 6003-30 6003-38 6003-40 6003-44 6003-47 \
  6004-0 6004-5 6004-10 6004-13 6004-18 6004-19 6004-27 6004-28 6004-33 6004-40 6004-42 6004-44 6004-53 6004-59 \
  6021-58 6022-20 6022-33 6003-0 6003-1 6003-3 6003-4 6003-5 6004-1 6004-2 6004-3 6004-4 6004-6; do
  cp "$work/gen-pd-$k.json" "$here/pd_cases/"
done
# Window groups of one spec (--groups windows), the first five of each
# seed.
rm -f "$here"/pd_cases/gen-pd-700[56]-*
python3 "$here/gen_pd_cases.py" 7005 5 "$work" --groups windows
python3 "$here/gen_pd_cases.py" 7006 5 "$work" --groups windows --async
cp "$work"/gen-pd-700[56]-*.json "$here/pd_cases/"
# A load reserved after a waiting request's chunk that leaves it
# prefilling keeps that chunk's remaining blocks free (vLLM adds it to
# `_inflight_prefills` at once): the case that differed before.
rm -f "$here"/pd_cases/gen-pd-7311-*
python3 "$here/gen_pd_cases.py" 7311 61 "$work" --async --options --priority
cp "$work/gen-pd-7311-60.json" "$here/pd_cases/"
# A finishing request frees the window blocks below the window of all it
# computed first, every window group's, then its full-attention blocks
# (vLLM's `_connector_finished`): the case that differed before.
rm -f "$here"/pd_cases/gen-pd-7317-*
python3 "$here/gen_pd_cases.py" 7317 66 "$work" --groups windows --async --options --priority
cp "$work/gen-pd-7317-65.json" "$here/pd_cases/"
cd "$here" && VLLM_LOGGING_LEVEL=ERROR "$python" vllm_batch.py pd_cases pd_cases/*.json \
  2> "$work/err" || { tail -5 "$work/err" >&2; exit 1; }
echo "recorded $(ls pd_cases/*.vllm.jsonl | wc -l) cases"
