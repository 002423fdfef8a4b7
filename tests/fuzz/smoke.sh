#!/usr/bin/env bash
# CI's fuzz smoke test: every target (16) for 15 s (20 s for the four slowest per
# input, 10 s for the quick parsers), two at a time, from the seed corpus: about 3
# minutes on two free cores (each fuzzer also takes a few seconds to start).
# Fails on any finding; the open bugs listed in harness.KNOWN_OPEN are not counted
# (APRFAST_FUZZ_IGNORE_KNOWN=0 counts them too).  Run from anywhere, with the python
# that has aprfast installed (the CI venv).
set -euo pipefail
export APRFAST_FUZZ_SECONDS="${APRFAST_FUZZ_SECONDS:-15 open=20 v1_open=20 stream=20 v2_security=20 gguf=10 \
safetensors=10 onnx=10 burnpack=10 mle=10 remote_index=10 v1_inspect=10}"
export APRFAST_FUZZ_PARALLEL="${APRFAST_FUZZ_PARALLEL:-2}"
export APRFAST_FUZZ_IGNORE_KNOWN="${APRFAST_FUZZ_IGNORE_KNOWN:-1}"
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/run.sh"
