"""APR2 per-tensor compression (aprfast.codecs.blocks) beside one-frame compression.

    python benchmarks/bench_codecs.py                  # 512 MiB model, 5 rounds
    python benchmarks/bench_codecs.py --quick          # 64 MiB model, 3 rounds
    python benchmarks/bench_codecs.py --block-sizes    # also: zstd block sizes 64 KiB..4 MiB
    python benchmarks/bench_codecs.py --size-mib 32 --rounds 3   # any size (2 MiB per tensor)

Model: 256 float32 tensors of 512x1024 (2 MiB each; 32 with --quick), values standard
normals x 0.02 rounded to bf16 precision (the low 16 bits of every float are zero, as
in a bf16 checkpoint widened to float32): LZ4 stores about 66% of it, zstd about 47%.
Files are in the page cache.

Rows (aprfast | the one-frame way | limit):

* one 2 MiB tensor from an open LZ4 / zstd file: ``get_tensor`` (decodes its 32 LZ4 or
  16 zstd blocks on every core) | decompressing the whole payload stored as one frame
  (``lz4.frame.decompress`` / ``zstandard``), which is what a whole-file codec costs
  for any one tensor.  Target: at least 50x.
* the same with ``open`` of the file in the timed region.
* eager load of the whole file: ``load_file(mmap=False)`` (parallel pread with CRC32,
  then every block decoded in C on every core) | ``lz4.frame.decompress`` /
  ``zstandard`` of the same tensor bytes as one frame already in memory.  Target for
  LZ4: at least 2x.
* save: ``save_file(compression=...)`` | compressing the payload as one frame, in memory.
* ``aprfast.stream()`` of the plain (uncompressed APR2) and the LZ4 file from a pipe fed
  by ``cat FILE`` | ``cat FILE | cat > /dev/null``: the same pipe drained by a process
  that does nothing with the bytes.  Target: at least 0.8x its throughput.
* peak memory of ``stream()`` over a pipe, in a child process (VmHWM above the RSS after
  its imports, ``/proc/self/clear_refs``), each tensor dropped as the next comes | the
  largest tensor + 32 MiB (the target's bound).  Memory is not timed; one sample per round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import lz4.frame
import numpy as np
import zstandard

import aprfast
from aprfast.codecs import blocks as tensor_codecs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from timing import Row, Table, interleaved  # noqa: E402

MiB = 1 << 20
SHAPE = (512, 1024)


def weights(count: int) -> dict:
    """bf16-precision normals as float32, one seed per tensor."""
    out = {}
    for i in range(count):
        u = (np.random.default_rng(i).standard_normal(SHAPE[0] * SHAPE[1]).astype(np.float32) * 0.02).view(np.uint32)
        out[f"layers.{i:03d}.weight"] = ((u + 0x8000) & 0xFFFF0000).view(np.float32).reshape(SHAPE)
    return out


def one_frame(tensors, codec):
    payload = b"".join(t.tobytes() for t in tensors.values())
    if codec == "lz4":
        return payload, lz4.frame.compress(payload, store_size=True)
    return payload, zstandard.ZstdCompressor(level=tensor_codecs.ZSTD_DEFAULT_LEVEL).compress(payload)


def whole_decompress(frame, codec):
    if codec == "lz4":
        return lambda: lz4.frame.decompress(frame)
    dctx = zstandard.ZstdDecompressor()
    return lambda: dctx.decompress(frame)


def stored_fraction(path) -> float:
    tensors = aprfast.inspect(path)["tensors"]
    raw = sum(t.get("raw_size", t["nbytes"]) for t in tensors.values())
    return sum(t["nbytes"] for t in tensors.values()) / raw


def codec_rows(table, directory, tensors, codec, rounds):
    path = os.path.join(directory, f"model-{codec}.apr")
    payload, frame = one_frame(tensors, codec)
    size = f"{len(payload) // MiB} MiB"
    save = interleaved({"aprfast": lambda: aprfast.save_file(tensors, path, compression=codec, durable=False),
                        "frame": lambda: (lz4.frame.compress(payload, store_size=True) if codec == "lz4" else
                                          zstandard.ZstdCompressor(level=3).compress(payload))},
                       max(1, rounds // 2))
    table.add(Row(f"save, {codec} (no fsync)", size, save["aprfast"],
                  primary={f"{codec} one frame, in memory": save["frame"]}))
    table.notes.append(f"{codec}: the file stores {stored_fraction(path):.1%} of the raw bytes; one {codec} frame "
                       f"{len(frame) / len(payload):.1%}.")
    name = sorted(tensors)[len(tensors) // 2]
    whole = whole_decompress(frame, codec)
    with aprfast.open(path) as f:
        assert np.array_equal(f.get_tensor(name), tensors[name])
        one = interleaved({"aprfast": lambda: f.get_tensor(name), "whole": whole,
                           "open+one": lambda: _open_one(path, name)}, rounds, min_sample=0.05)
    table.add(Row(f"one 2 MiB tensor, open {codec} file", size, one["aprfast"],
                  primary={f"{codec} whole payload, one frame": one["whole"]}))
    table.add(Row(f"open + one 2 MiB tensor, {codec} file", size, one["open+one"],
                  primary={f"{codec} whole payload, one frame": one["whole"]}))
    eager = interleaved({"aprfast": lambda: aprfast.load_file(path, mmap=False), "whole": whole}, rounds)
    table.add(Row(f"eager load, {codec} file", size, eager["aprfast"],
                  primary={f"{codec} one frame, in memory": eager["whole"]}))
    os.remove(path)


def stream_rows(table, directory, tensors, rounds):
    """stream() from a pipe against the pipe drained by cat; then its peak memory."""
    largest = max(t.nbytes for t in tensors.values())
    size = f"{sum(t.nbytes for t in tensors.values()) // MiB} MiB"
    for codec in (None, "lz4"):
        path = os.path.join(directory, f"stream-{codec or 'plain'}.apr")
        aprfast.save_file(tensors, path, layout="apr2", compression=codec, durable=False)
        what = f"{codec} file" if codec else "plain apr2 file"
        got = interleaved({"aprfast": lambda: _stream_from_cat(path), "cat": lambda: _cat_through_pipe(path)},
                          rounds)
        table.add(Row(f"stream() from a pipe, {what}", size, got["aprfast"],
                      primary={"cat FILE | cat > /dev/null": got["cat"]}))
        peaks = timing.Samples(_stream_peak_in_child(path) for _ in range(rounds))
        bound = timing.Samples([largest + 32 * MiB])
        table.add(Row(f"stream() peak memory above imports, {what}", size, peaks, unit="B",
                      limits={"largest tensor + 32 MiB (target)": bound}))
        os.remove(path)


def _stream_from_cat(path) -> int:
    feeder = subprocess.Popen(["cat", path], stdout=subprocess.PIPE, bufsize=0)
    try:
        count = sum(1 for _ in aprfast.stream(feeder.stdout))
    finally:
        feeder.stdout.close()
        feeder.wait()
    return count


def _cat_through_pipe(path) -> None:
    feeder = subprocess.Popen(["cat", path], stdout=subprocess.PIPE)
    drain = subprocess.Popen(["cat"], stdin=feeder.stdout, stdout=subprocess.DEVNULL)
    feeder.stdout.close()  # the drain holds the read end
    drain.wait()
    feeder.wait()


_PEAK_CHILD = """
import json, sys
import aprfast
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
base = status("VmRSS")
count = 0
for name, tensor in aprfast.stream(sys.stdin.buffer):
    count += 1
    del tensor
print(json.dumps({"peak_above_imports": status("VmHWM") - base, "tensors": count}))
"""


def _stream_peak_in_child(path) -> int:
    """Peak RSS of stream() over ``cat FILE |`` in a fresh interpreter, above its RSS
    after importing aprfast."""
    feeder = subprocess.Popen(["cat", path], stdout=subprocess.PIPE)
    child = subprocess.run([sys.executable, "-c", _PEAK_CHILD], stdin=feeder.stdout, capture_output=True,
                           text=True, check=True)
    feeder.stdout.close()
    feeder.wait()
    return json.loads(child.stdout)["peak_above_imports"]


def _open_one(path, name):
    with aprfast.open(path) as f:
        return f.get_tensor(name)


def block_size_rows(directory, tensors, rounds):
    """zstd block sizes: stored fraction, whole-file eager load, one 2-row slice."""
    keep = tensor_codecs.ZSTD_BLOCK_SIZE
    path = os.path.join(directory, "blocks.apr")
    name = sorted(tensors)[0]
    try:
        for size in (64 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20):
            tensor_codecs.ZSTD_BLOCK_SIZE = size
            aprfast.save_file(tensors, path, compression="zstd", durable=False)
            with aprfast.open(path) as f:
                got = interleaved({"eager": lambda: aprfast.load_file(path, mmap=False),
                                   "slice": lambda: f.get_slice(name)[300:302]}, rounds, min_sample=0.05)
            print(f"zstd block {size >> 10:>5} KiB: stores {stored_fraction(path):.1%}, eager load "
                  f"{got['eager'].text()}, 2-row slice {got['slice'].text()}", flush=True)
    finally:
        tensor_codecs.ZSTD_BLOCK_SIZE = keep


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 MiB model, 3 rounds")
    parser.add_argument("--size-mib", type=int, default=None,
                        help="model size in MiB (2 MiB tensors; default 512, 64 with --quick)")
    parser.add_argument("--no-stream", action="store_true", help="skip the stream()-from-a-pipe rows")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-sizes", action="store_true", help="also compare zstd block sizes")
    parser.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    args = parser.parse_args()
    count = max(1, args.size_mib // 2) if args.size_mib else (32 if args.quick else 256)
    rounds = 3 if args.quick else args.rounds
    versions = (f"lz4 {timing.version('lz4')}, zstandard {timing.version('zstandard')}, "
                f"zstd blocks decoded by {'libzstd (C)' if aprfast._blocks.zstd_native() else 'zstandard'}")
    tensors = weights(count)
    table = Table(f"APR2 per-tensor compression ({count * 2} MiB of bf16-precision float32)",
                  "one-frame compression", versions=versions)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for codec in ("lz4", "zstd"):
            codec_rows(table, directory, tensors, codec, rounds)
        if not args.no_stream:
            stream_rows(table, directory, tensors, rounds)
        if args.block_sizes:
            block_size_rows(directory, dict(list(tensors.items())[:min(count, 32)]), rounds)
    table.notes.append("Blocks: LZ4 64 KiB (the spec), zstd 128 KiB (level 3); each block decodes independently.")
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
