#!/usr/bin/env bash
# CI's fuzz smoke test: every target for 25 s, two at a time, from the seed corpus.
# Fails on any finding; the open bugs listed in harness.KNOWN_OPEN are not counted
# (APRFAST_FUZZ_IGNORE_KNOWN=0 counts them too).  Run from anywhere, with the python
# that has aprfast installed (the CI venv).
set -euo pipefail
export APRFAST_FUZZ_SECONDS="${APRFAST_FUZZ_SECONDS:-25}"
export APRFAST_FUZZ_PARALLEL="${APRFAST_FUZZ_PARALLEL:-2}"
export APRFAST_FUZZ_IGNORE_KNOWN="${APRFAST_FUZZ_IGNORE_KNOWN:-1}"
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/run.sh"
