#!/usr/bin/env bash
# Build aprfast's C/Cython extensions with AddressSanitizer + UndefinedBehaviorSanitizer
# in a private copy of the tree, then run the test suite (or the pytest arguments given)
# against that build.  Any sanitizer report fails the run.
#
#   tests/sanitize.sh                      # the whole suite but tests/interop, then the
#                                          # fuzz seed corpus through every fuzz target
#   tests/sanitize.sh tests/test_hostile_files.py -k lz4   # any pytest arguments
#   tests/sanitize.sh --self-test          # prove the set-up catches an injected bug
#   tests/sanitize.sh --run tests/fuzz/replay.py /abs/path/corpus   # any python script
#   tests/sanitize.sh --fuzz 60 v2_security stream     # fuzz targets against this build
#
# --fuzz SECONDS [TARGET ...]: each target (default: those that reach the C block
# decoders, LZ4/zstd chunks, buffers and the stats engine: open stream v2_security
# v1_open v1_index load) runs SECONDS under atheris against the sanitized build, one
# after the other.  atheris sees no coverage through gcc's ASan runtime, so libFuzzer
# cannot grow a corpus here: it mutates the seed corpus and SANITIZE_FUZZ_CORPUS/<target>
# (a corpus grown by a coverage-guided run of the normal build, e.g. run.py's
# $APRFAST_FUZZ_OUT/corpus) blindly, keeping every seed (-keep_seed=1; -len_control=0,
# else mutants stay as short as libFuzzer's slowly growing length cap).  A sanitizer
# report aborts (abort_on_error=1) so libFuzzer saves the input; each saved input is
# printed in base64 and copied to SANITIZE_FUZZ_OUT/<target>/ when that is set.
# The checkout is never touched: the tree is copied (without .git, builds, *.so or
# tests/interop, which builds Rust) to a temporary directory, its extensions are built
# in place there, and the tests import aprfast from there (PYTHONPATH).  Needs gcc and
# the python on PATH with aprfast's runtime and test dependencies (the CI venv after
# `pip install ".[test]"`); Cython and a recent setuptools are installed into the work
# directory if that python lacks them.
#
# Environment: PYTHON (default python3), SANITIZE_WORKDIR (kept; default: mktemp -d,
# removed afterwards unless SANITIZE_KEEP=1), SANITIZE_JOBS (parallel compiles, default
# nproc), SANITIZE_FUZZ_SEEDS=0 (skip replaying the fuzz seed corpus after the suite),
# SANITIZE_WORKERS (pytest processes of the default run and the self-test, default nproc;
# 1, or pytest-xdist not installed, runs them in one process).
#
# Why several pytest processes: under ASan the suite is CPU-bound, and in one process it
# took 28 min of CI's 64 on 2 cores (stop 36); with pytest-xdist's two workers the same
# tests took 13.6 min here.  Each worker is its own process, so a report still names
# the test: ASan writes to its log file, UBSan to the worker's stderr, which xdist
# leaves on the run's (the self-test runs the same way, to prove it).
#
# Why these options: CPython is not built with ASan, so libasan must be preloaded to
# come first in the library list (LD_PRELOAD); CPython's interned objects are never
# freed, so leak checking is off; tests that ask for absurd sizes expect MemoryError,
# not an ASan abort (allocator_may_return_null); PYTHONMALLOC=malloc sends Python objects
# to malloc too, so a C kernel overrunning a bytes/bytearray buffer lands in a redzone.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
self_test=0
run_script=0
fuzz_mode=0
if [[ "${1:-}" == "--self-test" ]]; then
    self_test=1
    shift
elif [[ "${1:-}" == "--run" ]]; then
    run_script=1
    shift
elif [[ "${1:-}" == "--fuzz" ]]; then
    fuzz_mode=1
    shift
    fuzz_seconds="${1:-60}"
    [[ $# -gt 0 ]] && shift
    fuzz_targets=("$@")
    [[ ${#fuzz_targets[@]} == 0 ]] && fuzz_targets=(open stream v2_security v1_open v1_index load)
fi

work="${SANITIZE_WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/aprfast-sanitize.XXXXXX")}"
if [[ "${SANITIZE_KEEP:-0}" != 1 && -z "${SANITIZE_WORKDIR:-}" ]]; then
    trap 'rm -rf "$work"' EXIT
fi
tree="$work/tree"
start=$SECONDS

echo "== sanitize: copying $repo to $tree"
rm -rf "$tree"
mkdir -p "$tree"
tar -C "$repo" --exclude=./.git --exclude=./build --exclude=./.hypothesis --exclude='*.so' --exclude=./tests/interop \
    --exclude='__pycache__' -cf - . | tar -C "$tree" -xf -

# Build tools: setup.py needs Cython and a setuptools that reads pyproject's license (>=77).
if ! "$python" - <<'EOF' 2>/dev/null
import Cython, setuptools
ok = int(Cython.__version__.split(".")[0]) >= 3 and int(setuptools.__version__.split(".")[0]) >= 77
raise SystemExit(0 if ok else 1)
EOF
then
    echo "== sanitize: installing Cython and setuptools into $work/buildtools"
    "$python" -m pip install --quiet --target "$work/buildtools" "setuptools>=77" "Cython>=3.0.8"
    build_path="$work/buildtools"
else
    build_path=""
fi

if [[ $self_test == 1 ]]; then
    # Two deliberate bugs, in the copy only: a heap read one byte past the buffer in the
    # CRC32 entry point aprfast.crc32 calls, and a signed overflow in the same place.
    echo "== sanitize: self-test: injecting an out-of-bounds read and a signed overflow"
    "$python" - "$tree/csrc/crc32.c" <<'EOF'
import re, sys
path = sys.argv[1]
src = open(path).read()
old = "uint32_t apr_crc32_parallel(int path, uint32_t crc, const uint8_t *buf, size_t len, int nthreads)\n{\n"
assert old in src, "apr_crc32_parallel not found: update the self-test's injection"
inject = old + ("    if (len == 3) { volatile uint8_t oob = buf[len + 1]; (void)oob; }  /* SELF-TEST OOB */\n"
                "    if (len == 5) { volatile int big = 2147483647; big += (int)len; (void)big; }  /* SELF-TEST UB */\n")
open(path, "w").write(src.replace(old, inject))
EOF
fi

# setup.py asks for -O3, which comes after CFLAGS and would win: -O1 keeps stack traces
# readable and the build quicker.  (Only the copy is edited.)
sed -i 's/"-O3", //' "$tree/setup.py"

workers="${SANITIZE_WORKERS:-$(nproc)}"
xdist=()
if [[ "$workers" -gt 1 ]] && "$python" -c "import xdist" 2>/dev/null; then
    xdist=(-n "$workers")
fi

san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
echo "== sanitize: building the extensions with $san -O1 -g"
(
    cd "$tree"
    PYTHONPATH="$build_path" CFLAGS="$san -O1 -g" LDFLAGS="-fsanitize=address,undefined" \
        "$python" setup.py build_ext --inplace -j "${SANITIZE_JOBS:-$(nproc)}" >"$work/build.log" 2>&1
) || { tail -50 "$work/build.log"; echo "== sanitize: build failed (log: $work/build.log)"; exit 1; }
echo "== sanitize: built in $((SECONDS - start)) s"

libasan="$(gcc -print-file-name=libasan.so)"
export LD_PRELOAD="$libasan${LD_PRELOAD:+:$LD_PRELOAD}"
# ASan reports go to files (child processes report too); UBSan, loaded as its own
# runtime beside ASan, ignores log_path and writes to stderr, so pytest captures only
# sys.stdout/sys.stderr (--capture=sys): a report written to fd 2 by a process the
# sanitizer then ends is never swallowed, and its output is grepped.
rm -rf "$work/reports"
mkdir -p "$work/reports"
export ASAN_OPTIONS="log_path=$work/reports/asan:log_exe_name=1:detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:abort_on_error=0:exitcode=86:detect_stack_use_after_return=0:strict_init_order=1:print_summary=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="log_path=$work/reports/ubsan:log_exe_name=1:halt_on_error=1:print_stacktrace=1:exitcode=87${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export PYTHONMALLOC=malloc
# Peak-RSS bounds do not hold under ASan's redzones and quarantine: those tests skip.
export APRFAST_SANITIZED=1
# The tests marked slow, which a plain `pytest` leaves out, run here too, as they did
# before the default run left them out; APRFAST_TEST_ALL=0 gives the fast subset.
export APRFAST_TEST_ALL="${APRFAST_TEST_ALL:-1}"
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$tree"

# The extensions really are the sanitized ones from the copy.
"$python" - "$tree" <<'EOF'
import sys, aprfast, aprfast._crc as crc
assert aprfast.__file__.startswith(sys.argv[1]), f"aprfast imported from {aprfast.__file__}, not the copy"
maps = open("/proc/self/maps").read()
assert "libasan" in maps and crc.__file__ in maps, "the sanitized extension is not loaded"
EOF

if [[ $self_test == 1 ]]; then
    status=0
    # Through pytest, exactly as the suite runs: each deliberate bug must fail the run
    # with the sanitizer's report.
    cat >"$tree/tests/test_sanitize_selftest.py" <<'EOF'
import aprfast


def test_oob_read():
    aprfast.crc32(bytearray(3) + b"")


def test_signed_overflow():
    aprfast.crc32(bytearray(5) + b"")
EOF
    for case in "oob_read:AddressSanitizer: heap-buffer-overflow" "signed_overflow:runtime error: signed integer overflow"; do
        test="${case%%:*}"
        want="${case#*:}"
        rm -f "$work/reports/"*
        set +e
        out="$("$python" -m pytest --capture=sys "${xdist[@]}" -q -p no:cacheprovider "tests/test_sanitize_selftest.py::test_$test" 2>&1)"
        rc=$?
        set -e
        out="$out$(cat "$work/reports/"* 2>/dev/null || true)"
        if [[ $rc != 0 ]] && grep -q "$want" <<<"$out"; then
            echo "== sanitize: self-test: pytest failed (exit $rc) with '$want':"
            grep -m3 -E "$want|#0 |#1 " <<<"$out" | sed 's/^/    /'
        else
            echo "== sanitize: self-test FAILED: no '$want' report (exit $rc):"
            echo "$out" | tail -20
            status=1
        fi
    done
    echo "== sanitize: self-test finished in $((SECONDS - start)) s"
    exit $status
fi

if [[ $fuzz_mode == 1 ]]; then
    "$python" -c "import atheris" 2>/dev/null || "$python" -m pip install --quiet -r tests/fuzz/requirements.txt
    # The open Python-level bugs of harness.KNOWN_OPEN are the normal fuzzers' business:
    # here they would stop the hunt for C bugs at the first input that reaches them.
    export APRFAST_FUZZ_IGNORE_KNOWN="${APRFAST_FUZZ_IGNORE_KNOWN:-1}"
    echo "== sanitize: fuzz ${fuzz_targets[*]} for $fuzz_seconds s each (seeds${SANITIZE_FUZZ_CORPUS:+ + $SANITIZE_FUZZ_CORPUS})"
    "$python" tests/fuzz/make_corpus.py "$work/seeds" >"$work/run.log" 2>&1 || { tail -30 "$work/run.log"; exit 1; }
    rc=0
    for target in "${fuzz_targets[@]}"; do
        dirs=("$work/fuzz-corpus/$target" "$work/seeds/$target")
        if [[ -n "${SANITIZE_FUZZ_CORPUS:-}" && -d "$SANITIZE_FUZZ_CORPUS/$target" ]]; then
            dirs+=("$SANITIZE_FUZZ_CORPUS/$target")
        fi
        mkdir -p "$work/fuzz-corpus/$target" "$work/crashes/$target"
        t0=$SECONDS
        set +e
        ASAN_OPTIONS="$ASAN_OPTIONS:abort_on_error=1" UBSAN_OPTIONS="$UBSAN_OPTIONS:abort_on_error=1" \
            timeout -k 10 $((fuzz_seconds + 300)) "$python" tests/fuzz/fuzz.py "$target" -keep_seed=1 \
            -max_total_time="$fuzz_seconds" -rss_limit_mb=4096 -timeout=30 -max_len=16384 -len_control=0 \
            -print_final_stats=1 \
            -dict=tests/fuzz/aprfast.dict -artifact_prefix="$work/crashes/$target/" "${dirs[@]}" \
            >"$work/fuzz-$target.log" 2>&1
        trc=$?
        set -e
        grep -v "^INFO: Instrumenting" "$work/fuzz-$target.log" >>"$work/run.log"
        runs="$(grep -oE "^Done [0-9]+ runs" "$work/fuzz-$target.log" | tail -1 || true)"
        crashes=("$work/crashes/$target/"*)
        if [[ $trc == 0 && ! -e "${crashes[0]}" ]]; then
            echo "[$target] ok after $((SECONDS - t0)) s: ${runs:-?}"
        else
            echo "[$target] FINDING (exit $trc) after $((SECONDS - t0)) s: ${runs:-?}"
            grep -v "^INFO: Instrumenting" "$work/fuzz-$target.log" | tail -60
            for crash in "${crashes[@]}"; do
                [[ -e "$crash" ]] || continue
                echo "[$target] input $crash ($(stat -c %s "$crash") bytes), base64:"
                base64 -w0 "$crash"
                echo
                if [[ -n "${SANITIZE_FUZZ_OUT:-}" ]]; then
                    mkdir -p "$SANITIZE_FUZZ_OUT/$target"
                    cp "$crash" "$SANITIZE_FUZZ_OUT/$target/"
                fi
            done
            rc=1
        fi
    done
fi

default_run=0
if [[ $fuzz_mode == 1 ]]; then
    :
elif [[ $run_script == 1 ]]; then
    set -- "$@"
elif [[ $# == 0 ]]; then
    default_run=1
    # tests/engines: llama.cpp and transformers on what the converter writes (Python
    # logic, run on the plain wheel); under ASan they would only add minutes.
    set -- -m pytest --capture=sys "${xdist[@]}" tests --ignore=tests/interop --ignore=tests/engines -q -p no:cacheprovider
else
    set -- -m pytest --capture=sys "$@"
fi
set +e
if [[ $fuzz_mode == 0 ]]; then
    echo "== sanitize: $python $*"
    "$python" "$@" 2>&1 | tee "$work/run.log"
    rc=${PIPESTATUS[0]}
fi
if [[ $default_run == 1 && "${SANITIZE_FUZZ_SEEDS:-1}" == 1 ]]; then
    # The fuzz seed corpus (every layout, dtype, codec and crypto mode) through every
    # fuzz target: the C paths on valid and fixed-up files, under the sanitizers.
    echo "== sanitize: fuzz seed corpus through every target (tests/fuzz/replay.py)"
    "$python" tests/fuzz/make_corpus.py "$work/seeds" 2>&1 | tee -a "$work/run.log" &&
        "$python" tests/fuzz/replay.py "$work/seeds" 2>&1 | tee -a "$work/run.log"
    replay_rc=$((PIPESTATUS[0]))
    [[ $rc == 0 ]] && rc=$replay_rc
fi
set -e
reports=("$work/reports/"*)
if [[ -e "${reports[0]}" ]]; then
    for report in "${reports[@]}"; do
        echo "== sanitize: report $report:"
        head -100 "$report"
    done
    echo "== sanitize: ${#reports[@]} sanitizer report(s)"
    [[ $rc == 0 ]] && rc=1
fi
if grep -qE "runtime error: |ERROR: AddressSanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer" "$work/run.log"; then
    echo "== sanitize: sanitizer report(s) in the output above (grep 'runtime error' / 'Sanitizer')"
    [[ $rc == 0 ]] && rc=1
fi
echo "== sanitize: finished in $((SECONDS - start)) s, exit $rc"
exit "$rc"
