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
# The APR2 security target has its own fix-up and corpus (fuzz_v2_security.py --make-corpus).
v2sec="$(mktemp -d)"
trap 'rm -rf "$v2sec"' EXIT
"${PYTHON:-python3}" "$here/fuzz_v2_security.py" --make-corpus "$v2sec/corpus" >/dev/null
if ! "${PYTHON:-python3}" "$here/fuzz_v2_security.py" -max_total_time="$APRFAST_FUZZ_SECONDS" -rss_limit_mb=2048 \
        -timeout=10 -artifact_prefix="$v2sec/" "$v2sec/corpus" >"$v2sec/log" 2>&1; then
    tail -40 "$v2sec/log"
    echo "fuzz: v2_security FAILED (artifacts lost with $v2sec; rerun fuzz_v2_security.py to reproduce)" >&2
    exit 1
fi
echo "[v2_security] ok after ${APRFAST_FUZZ_SECONDS} s"
bash "$here/run.sh"
