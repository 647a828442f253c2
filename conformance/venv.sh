#!/usr/bin/env bash
# Prints the python of a venv with vLLM 0.33.0 (CPU), making it on first
# use: $VLLM_VENV, or conformance/venv (about 7 GB and 5-10 minutes; pip
# warns about vLLM's GPU-only requirements, which nothing here needs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VLLM_VENV:-$here/venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q torch==2.14.0 >&2
  "$venv/bin/pip" install -q --no-deps vllm==0.33.0 >&2
  "$venv/bin/pip" install -q -r "$here/requirements-light.txt" >&2
  "$venv/bin/pip" install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11 "llguidance>=1.7,<1.8" zmq >&2
fi
echo "$venv/bin/python"
