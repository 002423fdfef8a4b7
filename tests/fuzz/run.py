#!/usr/bin/env python3
"""Run the atheris fuzz targets for a while each; exit 1 on any finding.

    python tests/fuzz/run.py [TARGET ...]

Environment (all optional):

  APRFAST_FUZZ_SECONDS   seconds per target (default 25); "25 mle=10 onnx=10" gives
                         the named targets their own time
  APRFAST_FUZZ_TARGETS   space-separated targets (default: all; arguments win)
  APRFAST_FUZZ_PARALLEL  targets run at once (default 1)
  APRFAST_FUZZ_OUT       work directory: corpus/<target> (grows run after run when kept),
                         crashes/<target>/ (inputs that found something), logs/
                         (default: a fresh temporary directory, removed unless
                         something was found)
  APRFAST_FUZZ_SEED      libFuzzer -seed (default: random, printed)
  APRFAST_FUZZ_FLAGS     extra libFuzzer flags, e.g. "-max_len=65536 -only_ascii=0"
  APRFAST_FUZZ_IGNORE_KNOWN=1  do not count the open bugs listed in harness.KNOWN_OPEN

Every target gets the seed corpus of make_corpus.py (rewritten each run) and the
corpus it grew before, -rss_limit_mb=2048 and -timeout=10.  A finding is any non-zero
exit of the fuzzer (an uncaught non-AprError exception, a crash, a timeout, an OOM);
its input is saved under crashes/<target>/ and printed (base64) so a CI log keeps it.
Reproduce one with ``python tests/fuzz/fuzz.py TARGET FILE`` or add it to
tests/fuzz/regressions/ (tests/test_fuzz_regressions.py then replays it).
"""

from __future__ import annotations

import base64
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TARGETS = ["load", "open", "inspect", "v1_load", "v1_inspect", "v1_open", "stream", "pytorch", "v2_security", "gguf",
           "safetensors", "onnx", "burnpack", "mle", "v1_index", "remote_index"]
LIMITS = ["-rss_limit_mb=2048", "-timeout=10", "-max_len=16384", "-print_final_stats=1",
          f"-dict={os.path.join(HERE, 'aprfast.dict')}"]


def main(argv) -> int:
    targets = argv[1:] or os.environ.get("APRFAST_FUZZ_TARGETS", "").split() or TARGETS
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"unknown target(s) {unknown}; choose from {TARGETS}", file=sys.stderr)
        return 2
    seconds = _seconds(os.environ.get("APRFAST_FUZZ_SECONDS", "25"))
    parallel = max(1, int(os.environ.get("APRFAST_FUZZ_PARALLEL", "1")))
    out = os.environ.get("APRFAST_FUZZ_OUT") or tempfile.mkdtemp(prefix="aprfast-fuzz-")
    temporary = not os.environ.get("APRFAST_FUZZ_OUT")
    seed = int(os.environ.get("APRFAST_FUZZ_SEED") or random.randrange(1, 2**31))
    extra = shlex.split(os.environ.get("APRFAST_FUZZ_FLAGS", ""))
    seeds_dir = os.path.join(out, "seeds")
    subprocess.run([sys.executable, os.path.join(HERE, "make_corpus.py"), seeds_dir], check=True)
    print(f"fuzzing {', '.join(targets)} for {seconds.get(None)} s each"
          + "".join(f", {t} {n} s" for t, n in seconds.items() if t in targets)
          + f", {parallel} at a time, -seed={seed}, in {out}", flush=True)

    started, pending, running, results = time.monotonic(), list(targets), {}, {}
    while pending or running:
        while pending and len(running) < parallel:
            target = pending.pop(0)
            running[target] = _start(target, out, seeds_dir, seconds.get(target, seconds[None]), seed, extra)
        time.sleep(0.2)
        for target, (proc, log, t0) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                results[target] = (proc.returncode, time.monotonic() - t0)
                del running[target]
                _report(target, out, *results[target])
    failed = [t for t, (rc, _) in results.items() if rc != 0 or _crashes(out, t)]
    where = f"; findings in: {', '.join(failed)}" if failed else ""
    print(f"fuzzing done in {time.monotonic() - started:.0f} s{where}")
    print(f"fuzz: {len(targets) - len(failed)} passed, {len(failed)} failed", flush=True)
    if failed:
        return 1
    if temporary:
        shutil.rmtree(out, ignore_errors=True)
    return 0


def _seconds(spec: str) -> dict:
    """{None: default seconds, target: seconds} from "25 mle=10 onnx=10"."""
    out = {None: 25}
    for word in spec.split():
        name, _, value = word.rpartition("=")
        out[name or None] = int(value)
    return out


def _start(target, out, seeds_dir, seconds, seed, extra):
    corpus = os.path.join(out, "corpus", target)
    crashes = os.path.join(out, "crashes", target)
    logs = os.path.join(out, "logs")
    for d in (corpus, crashes, logs):
        os.makedirs(d, exist_ok=True)
    cmd = [sys.executable, os.path.join(HERE, "fuzz.py"), target, *LIMITS, f"-max_total_time={seconds}",
           f"-seed={seed}", f"-artifact_prefix={crashes}/", *extra, corpus, os.path.join(seeds_dir, target)]
    log = open(os.path.join(logs, f"{target}.log"), "w")
    log.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
    log.flush()
    # A hung child would outlive -max_total_time only if libFuzzer itself hangs: bound it.
    tmp = os.path.join(out, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, APRFAST_FUZZ_TMPDIR=tmp)
    proc = subprocess.Popen(["timeout", "-k", "10", str(seconds + 120), *cmd], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    return proc, log, time.monotonic()


def _crashes(out, target):
    d = os.path.join(out, "crashes", target)
    return sorted(os.path.join(d, f) for f in os.listdir(d)) if os.path.isdir(d) else []


def _report(target, out, rc, elapsed):
    log_path = os.path.join(out, "logs", f"{target}.log")
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    stats = [line.split(None, 2)[-1] for line in lines if "\tDONE " in line or " DONE " in line]
    crashes = _crashes(out, target)
    status = "ok" if rc == 0 and not crashes else f"FINDING (exit {rc})"
    print(f"[{target}] {status} after {elapsed:.0f} s" + (f": {stats[-1]}" if stats else ""), flush=True)
    if status == "ok":
        return
    # The traceback and what libFuzzer said, then each saved input.
    start = next((i for i, line in enumerate(lines) if "Uncaught Python exception" in line or "ERROR:" in line
                  or "Traceback" in line), max(0, len(lines) - 40))
    print("\n".join(lines[start:start + 80]))
    print(f"[{target}] full log: {log_path}")
    for path in crashes:
        with open(path, "rb") as f:
            data = f.read()
        print(f"[{target}] input {path} ({len(data)} bytes)"
              + (f", base64:\n{base64.b64encode(data).decode()}" if len(data) <= 8192 else ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
