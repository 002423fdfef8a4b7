"""What populating fresh memory costs, by how long ago the memory was freed: the
measurement behind ``bench_cold.py --fresh-memory`` and csrc/buffers.c's page-size
choice.

    python benchmarks/bench_fresh_memory.py                    # 1 GiB, 3 rounds
    python benchmarks/bench_fresh_memory.py --gib 4 --rounds 2 --delays 0,1,2,4,8

Every load populates memory for its arrays.  On a VM whose kernel reports free pages to
the host (virtio-balloon free page reporting: free blocks of ``2^page_reporting_order``
pages are handed back about 2 s after they are freed), memory freed a while ago has to
be faulted in again by the host as well, page by page.  Each sample here maps
``--gib`` GiB (private, anonymous), advises huge pages or 4 KiB pages
(``MADV_HUGEPAGE`` / ``MADV_NOHUGEPAGE``), populates it with ``MADV_POPULATE_WRITE``
(timed) and unmaps it; then it waits ``delay`` seconds and times the same again.  The
first figure of a sample is memory freed by the sample before (after its own wait of
several seconds), the second memory freed ``delay`` seconds before.  Rows run
round-robin.  Linux 5.14 or later.
"""

from __future__ import annotations

import argparse
import mmap
import sys
import time

import timing

MiB = 1 << 20


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays", default="0,1,2,4", help="seconds between freeing and populating again")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds between samples")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        sys.exit("Linux only (MADV_HUGEPAGE, MADV_POPULATE_WRITE)")
    nbytes = int(args.gib * (1 << 30)) // (2 * MiB) * (2 * MiB)
    try:
        timing.populate(2 * MiB, True)
    except OSError as exc:
        sys.exit(f"MADV_POPULATE_WRITE refused ({exc}): Linux 5.14 or later")
    delays = [float(d) for d in args.delays.split(",")]
    rows = [(huge, delay) for huge in (True, False) for delay in delays]
    first = {row: timing.Samples() for row in rows}
    then = {row: timing.Samples() for row in rows}
    for r in range(args.rounds):
        for huge, delay in rows[r % len(rows):] + rows[:r % len(rows)]:
            time.sleep(args.settle)
            first[huge, delay].append(timing.populate(nbytes, huge))
            time.sleep(delay)
            then[huge, delay].append(timing.populate(nbytes, huge))
    steps = nbytes // (2 * MiB)
    print(f"`{timing.command_line()}` — {timing.machine()}")
    order = timing.page_reporting_order()
    reporting = "off" if order is None else f"order {order} ({4 << order} KiB blocks)"
    print(f"free page reporting: {reporting}; {nbytes / MiB:.0f} MiB per sample, "
          f"{args.settle:g} s between samples\n")
    print("| pages | freed before populating | median [min..max] | per 2 MiB |")
    print("|---|---|---|---|")
    for huge in (True, False):
        kind = "huge" if huge else "4 KiB"
        everything = timing.Samples()
        for delay in delays:
            everything.extend(first[huge, delay])
        print(f"| {kind} | {args.settle:g} s or more | {everything.text()} | "
              f"{everything.median / steps * 1e3:.2f} ms |")
        for delay in delays:
            s = then[huge, delay]
            print(f"| {kind} | {delay:g} s | {s.text()} | {s.median / steps * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
