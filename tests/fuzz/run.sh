#!/usr/bin/env bash
# Fuzz every target (or those named) for APRFAST_FUZZ_SECONDS each (default 25); exit
# non-zero on any finding.  See run.py for the environment variables, fuzz.py for one
# target by hand.  Installs atheris (tests/fuzz/requirements.txt) into the current
# python if it is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
if ! "$python" -c "import atheris" 2>/dev/null; then
    "$python" -m pip install --quiet -r "$here/requirements.txt"
fi
exec "$python" "$here/run.py" "$@"
