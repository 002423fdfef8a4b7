"""What the destination's page size does to a cold direct read, and how buffered reads
compare: the measurement behind csrc/buffers.h ``APR_HUGE_SLOW_DIRECT_NS``.

    python benchmarks/bench_direct_pages.py                 # 504 MiB file, 5 rounds
    python benchmarks/bench_direct_pages.py --size-mib 128 --rounds 3 --dir /var/tmp

A direct read goes from the device into the destination's own pages, and the block
layer builds each request from at most ``max_segments`` of them: into 4 KiB pages a
request holds at most ``max_segments`` x 4 KiB, into huge pages it can reach
``max_sectors_kb``.  Where each request costs the storage something fixed (a virtio
disk whose host serves requests one by one), fewer and larger requests read faster.

Rows, each reading the whole file cold (evicted and checked with mincore before every
call) into a destination touched beforehand, so no row pays for fresh memory:

* ``O_DIRECT`` through aprfast's io_uring engine (16 reads of 4 MiB in flight) straight
  into 4 KiB pages (``MADV_NOHUGEPAGE``) and into huge pages (``MADV_HUGEPAGE``, checked
  in ``/proc/self/smaps``) (``set_direct_staging("never")``), into 4 KiB pages through
  the engine's 64 MiB of huge-page staging buffers (``"always"``: each piece read into
  a staging buffer, then copied into place), and into either through the small ring
  (``"ring"``: 2 MiB reads into four 2 MiB buffers, two in flight: what ``"auto"`` does
  on a virtio-blk disk, csrc/uring.c ``RING_BYTES``);
* buffered ``pread`` by one thread (1 MiB reads; the kernel reads ahead) and by eight.

After the timed rounds one more cold call of each counts the device's requests
(``/sys/dev/block/M:m/stat``): their number and average size.  Linux only.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile

import numpy as np
import pagecache
import timing

from aprfast import _memory

MiB = 1 << 20
HUGE = 2 * MiB


def device_dir(path) -> str | None:
    """The sysfs directory of the block device holding ``path`` (its disk's, for a
    partition's queue limits), or None."""
    st = os.stat(path)
    base = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    return base if os.path.isdir(base) else None


def queue_limits(base) -> dict:
    out = {}
    for where in (base, os.path.join(base, "..")):
        q = os.path.join(where, "queue")
        if os.path.isdir(q):
            for key in ("max_segments", "max_sectors_kb", "read_ahead_kb", "scheduler"):
                try:
                    with open(os.path.join(q, key)) as f:
                        out[key] = f.read().strip()
                except OSError:
                    pass
            break
    return out


def read_requests(base):
    """(completed reads, sectors read) of the device so far."""
    with open(os.path.join(base, "stat")) as f:
        fields = f.read().split()
    return int(fields[0]), int(fields[2])


def destination(size: int, huge: bool):
    """A private anonymous map of ``size`` bytes on a huge-page boundary, advised and
    touched: (map, flat uint8 array, bytes of it in huge pages)."""
    m = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    whole = np.frombuffer(m, np.uint8)
    skip = (-whole.ctypes.data) % HUGE
    arr = whole[skip:skip + size]
    arr[::4096] = 1
    return m, arr, huge_bytes(arr)


def huge_bytes(arr) -> int:
    """Bytes of ``arr``'s range that /proc/self/smaps says are in huge pages."""
    lo, hi = arr.ctypes.data, arr.ctypes.data + arr.nbytes
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a < hi and b > lo
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total


def staged(mode, read):
    """``read`` with the io_uring engine's staging mode set to ``mode`` (uring.c)."""
    before = _memory.set_direct_staging(mode)
    try:
        return read()
    finally:
        _memory.set_direct_staging(before)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=504)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the test file goes (a disk, not tmpfs)")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("bench_direct_pages: Linux only (O_DIRECT, MADV_HUGEPAGE, /sys/dev/block)")
    why = pagecache.supported()
    if why:
        sys.exit(f"bench_direct_pages: cannot evict the page cache here: {why}")
    size = args.size_mib * MiB
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "data.bin")
        with open(path, "wb") as f:
            rng = np.random.default_rng(0)
            for _ in range(size // (8 * MiB)):
                f.write(rng.integers(0, 256, 8 * MiB, dtype=np.uint8).tobytes())
            f.write(b"\1" * (size % (8 * MiB)))
            os.fsync(f.fileno())
        base = device_dir(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as exc:
            sys.exit(f"bench_direct_pages: O_DIRECT refused on {args.dir or tempfile.gettempdir()}: {exc}")
        _, small, _ = destination(size, huge=False)  # the arrays keep their maps alive
        _, huge, in_huge = destination(size, huge=True)

        def direct(dst):
            return _memory.pread_direct(dfd, 0, dst, 8, None, 4096, "io_uring")

        tools = {
            "O_DIRECT io_uring into 4 KiB pages": lambda: staged("never", lambda: direct(small)),
            "O_DIRECT io_uring into huge pages": lambda: staged("never", lambda: direct(huge)),
            "O_DIRECT io_uring into 4 KiB pages, staged (64 MiB of buffers)":
                lambda: staged("always", lambda: direct(small)),
            "O_DIRECT io_uring into 4 KiB pages, the small ring (8 MiB)": lambda: staged("ring", lambda: direct(small)),
            "O_DIRECT io_uring into huge pages, the small ring (8 MiB)": lambda: staged("ring", lambda: direct(huge)),
            "buffered pread, 1 thread": lambda: _memory.pread_into(fd, 0, small, 1, None),
            "buffered pread, 8 threads": lambda: _memory.pread_into(fd, 0, small, 8, None),
        }
        samples = timing.interleaved(tools, args.rounds, setup=lambda: pagecache.evict(path), independent=True)
        requests = {}
        for name, fn in tools.items():
            pagecache.evict(path)
            before = read_requests(base) if base else None
            fn()
            if before is not None:
                after = read_requests(base)
                n, sectors = after[0] - before[0], after[1] - before[1]
                requests[name] = (n, sectors * 512 / max(n, 1) / 1024)
        print(f"`{timing.command_line()}` — {timing.machine()}")
        print(f"file: {args.size_mib} MiB on {os.path.realpath(base) if base else 'an unknown device'}; "
              f"queue: {queue_limits(base) if base else 'unknown'}; huge-page destination: "
              f"{in_huge / MiB:.0f} of {size / MiB:.0f} MiB in huge pages")
        print()
        print("| read | median [min..max] | GB/s | device requests | average request |")
        print("|---|---|---|---|---|")
        for name, s in samples.items():
            n, avg = requests.get(name, (float("nan"), float("nan")))
            print(f"| {name} | {s.text()} | {size / s.median / 1e9:.2f} | {n} | {avg:.0f} KiB |")
        os.close(fd)
        os.close(dfd)


if __name__ == "__main__":
    main()
