"""Run every benchmark script, one after another in fresh processes, and print the
combined Markdown (ready for README's Performance section) on stdout.

    python benchmarks/run_all.py            # full sizes: about 25-40 minutes on a quiet 2-core machine
    python benchmarks/run_all.py --quick    # 1/8 sizes, fewer rounds: a few minutes (a smoke test)
    python benchmarks/run_all.py --only bench_half,bench_quant

Each script's own progress goes to stderr (and is also kept in benchmarks/results/ when
--keep-logs is given); stdout carries only the Markdown.  A script that fails is
reported and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time

import timing

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ("bench_containers", "bench_inspect", "bench_crypto", "bench_half", "bench_quant", "bench_codecs",
           "bench_convert", "bench_stats", "bench_edit")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    parser.add_argument("--only", default=",".join(SCRIPTS), help="comma-separated scripts to run")
    parser.add_argument("--keep-logs", action="store_true", help="keep each script's output in benchmarks/results/")
    args = parser.parse_args()
    wanted = [s.strip().removesuffix(".py") for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SCRIPTS]
    if unknown:
        parser.error(f"unknown script(s) {unknown}; choose from {', '.join(SCRIPTS)}")

    print(timing.machine(), file=sys.stderr, flush=True)
    started = time.time()
    sections, failed = [], []
    with tempfile.TemporaryDirectory() as directory:
        for name in wanted:
            md = os.path.join(directory, name + ".md")
            cmd = [sys.executable, os.path.join(HERE, name + ".py"), "--md-out", md]
            if args.quick:
                cmd.append("--quick")
            print(f"\n=== {name} ===", file=sys.stderr, flush=True)
            t0 = time.time()
            log = None
            if args.keep_logs:
                os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
                log = open(os.path.join(HERE, "results", name + ".log"), "w")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=os.getcwd())
            for line in proc.stdout:
                sys.stderr.write(line)
                if log:
                    log.write(line)
            rc = proc.wait()
            if log:
                log.close()
            print(f"=== {name}: exit {rc}, {time.time() - t0:.0f} s ===", file=sys.stderr, flush=True)
            if rc != 0 or not os.path.exists(md):
                failed.append(name)
                sections.append(f"### {name}\n\nFAILED (exit {rc}): run `python benchmarks/{name}.py` to see why.")
                continue
            with open(md) as f:
                sections.append(f.read().strip())

    command = " ".join(shlex.quote(a) for a in ["python", os.path.relpath(os.path.abspath(sys.argv[0])),
                                                 *sys.argv[1:]])
    print(f"Measured with `{command}` ({time.time() - started:.0f} s in all). {timing.machine()}.\n")
    print("\n\n".join(sections))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
