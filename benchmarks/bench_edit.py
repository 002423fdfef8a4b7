"""Editing 10 metadata keys and renaming 100 tensors of a large model (issue 29 item 5):
``aprfast.edit`` in place (a file saved with ``reserve=``) and by rewrite (a file saved
without), against the same edit made the way the other formats make it, all in one run,
round-robin:

* GGUF: a copy with gguf-py's ``GGUFReader`` + ``GGUFWriter``, the way llama.cpp's
  ``gguf_new_metadata.py`` does it (every key/value copied, the new ones added, every
  tensor's info with its new name, then every tensor's data from the reader's map);
* safetensors: ``safetensors.numpy.load_file`` + ``save_file`` with the renamed keys and
  the new metadata.

Each tool edits the same tensors (float32, ``--tensors`` of them, ``--size`` bytes in
all), the files in the page cache.  Per call: wall time and the bytes it made the kernel
write (``/proc/self/io`` ``write_bytes``: pages dirtied, counted when dirtied, so a
rewrite is counted in full even before writeback), passed to write calls (``wchar``),
and, for the durable calls, what the disk wrote: the sectors-written count of the block
device the files are on (``/sys/dev/block/MAJ:MIN/stat``), before and after the call and
its fsyncs, journal included.
The peers write a new file; "durable" adds ``fsync`` of it (aprfast's ``durable=True``
fdatasyncs twice in place: once between its two writes, once after).

    python benchmarks/bench_edit.py                  # 512 MiB, 256 tensors, 5 rounds
    python benchmarks/bench_edit.py --size 4GiB --rounds 3
    python benchmarks/bench_edit.py --quick          # 64 MiB, 3 rounds

The machine this runs on is shared and noisy: read the ranges and the load averages.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np
import timing
from timing import Row, Samples, Table

import aprfast

MiB = 1 << 20


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])


def proc_io() -> dict:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except OSError:  # not Linux: the byte rows are left out
        return {}


def device_stat_path(path):
    """The ``/sys`` stat file of the block device ``path`` lives on (a partition's own
    where it has one), or None where there is none (not Linux, a network or virtual
    filesystem)."""
    st = os.stat(path)
    stat = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    return stat if os.path.exists(stat) else None


def device_written(stat) -> int:
    """Bytes the device has written since boot: field 7 of its stat file counts 512-byte
    sectors whatever the device's block size (Documentation/block/stat.rst)."""
    with open(stat) as f:
        return int(f.read().split()[6]) * 512


def fsync_path(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(path) -> None:
    """Drop ``path`` from the page cache (written back first), where the OS can."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make_tensors(size: int, count: int) -> dict:
    per = (size // count) // 4
    whole = np.arange(per * count, dtype=np.float32)
    return {f"blk.{i // 8}.w{i % 8}": whole[i * per:(i + 1) * per] for i in range(count)}


def edits(round_no: int, names: list, keys: int, renames: int, back: bool = False):
    """Round ``round_no``'s edit: ``keys`` metadata values that change every round, and
    ``renames`` tensors renamed (``back``: renamed back, for a file edited in place the
    round before; the peers always start from the unchanged input)."""
    metadata = {f"edit.key{k}": f"round {round_no} value {k}" for k in range(keys)}
    forward = {n: f"renamed.{n}" for n in names[:renames]}
    return metadata, {v: k for k, v in forward.items()} if back else forward


# --- the peers ------------------------------------------------------------------------------
def gguf_copy(src, dst, metadata: dict, rename: dict) -> None:
    """gguf_new_metadata.py's copy_with_new_metadata, with renamed tensor infos."""
    import gguf

    reader = gguf.GGUFReader(src, "r")
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    arch = arch_field.contents() if arch_field else "llama"
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in metadata:
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    for key, value in metadata.items():
        writer.add_key_value(key, value, gguf.GGUFValueType.STRING)
    for tensor in reader.tensors:
        writer.add_tensor_info(rename.get(tensor.name, tensor.name), tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def safetensors_resave(src, dst, metadata: dict, rename: dict) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(src)
    save_file({rename.get(k, k): v for k, v in tensors.items()}, dst, metadata=metadata)


def write_gguf(path, tensors: dict) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("bench")
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --- one run ---------------------------------------------------------------------------------
def run(args) -> str:
    versions = f"safetensors {timing.version('safetensors')}, gguf {timing.version('gguf')}"
    table = Table(f"Editing {args.keys} metadata keys and renaming {args.renames} of {args.tensors} tensors, "
                  f"{timing.fmt_bytes(args.size)} model", "safetensors re-save", others_title="GGUF copy (gguf-py)",
                  versions=versions)
    directory = tempfile.mkdtemp(prefix="bench-edit-", dir=args.dir)
    try:
        tensors = make_tensors(args.size, args.tensors)
        names = sorted(tensors)
        base_meta = {"name": "bench"}
        roomy, plain = os.path.join(directory, "roomy.apr"), os.path.join(directory, "plain.apr")
        st_in, gg_in = os.path.join(directory, "in.safetensors"), os.path.join(directory, "in.gguf")
        st_out, gg_out = os.path.join(directory, "out.safetensors"), os.path.join(directory, "out.gguf")
        roomy_nosync = os.path.join(directory, "roomy-nosync.apr")
        roomy_cold = os.path.join(directory, "roomy-cold.apr")
        for path in (roomy, roomy_nosync, roomy_cold):
            aprfast.save_file(tensors, path, base_meta, reserve=args.reserve)
        aprfast.save_file(tensors, plain, base_meta)
        skip = {}
        try:
            from safetensors.numpy import save_file as st_save

            st_save(tensors, st_in, metadata=base_meta)
        except ImportError as exc:
            skip["safetensors"] = f"not installed ({exc.name})"
        try:
            write_gguf(gg_in, tensors)
        except ImportError as exc:
            skip["gguf"] = f"not installed ({exc.name})"
        del tensors
        for what, why in skip.items():
            table.skip(what, why)

        # tool -> (call(round) -> None, sync path or None)
        def aprfast_edit(path, durable):
            done = [0]

            def call(r):
                metadata, rename = edits(r, names, args.keys, args.renames, back=done[0] % 2 == 1)
                result = aprfast.edit(path, metadata=metadata, rename=rename, durable=durable)
                assert result["in_place"] is (path != plain), result
                done[0] += 1
            return call

        tools = {
            "aprfast in place, durable": (aprfast_edit(roomy, True), None),
            "aprfast in place, no fsync": (aprfast_edit(roomy_nosync, False), None),
            "aprfast in place, durable, file evicted first": (aprfast_edit(roomy_cold, True), None),
            "aprfast rewrite, durable": (aprfast_edit(plain, True), None),
        }
        if "safetensors" not in skip:
            tools["safetensors re-save"] = (lambda r: safetensors_resave(st_in, st_out, *edits(r, names, args.keys,
                                                                                                 args.renames)),
                                            st_out)
        if "gguf" not in skip:
            tools["GGUF copy (gguf-py)"] = (lambda r: gguf_copy(gg_in, gg_out, *edits(r, names, args.keys,
                                                                                       args.renames)), gg_out)
        times = {name: Samples() for name in tools}
        durable = {name: Samples() for name in tools if tools[name][1]}
        written = {name: Samples() for name in tools}
        wchar = {name: Samples() for name in tools}
        # What reached the disk, journal included: write_bytes counts page-cache folios
        # as they are dirtied, and a few KiB written into a large folio count it whole,
        # though ext4 writes back only the blocks that were dirtied.  Another writer on
        # the same device in the same moment counts too: read the median.
        stat = device_stat_path(directory)
        on_disk = {name: Samples() for name in tools if name.endswith("durable") or "evicted" in name
                   or tools[name][1]}
        for r in range(-1, args.rounds):  # round -1 warms every tool up (page cache, imports)
            for name, (call, sync) in tools.items():
                for out in (st_out, gg_out):
                    if sync == out and os.path.exists(out):
                        os.unlink(out)
                if name.endswith("evicted first"):
                    evict(roomy_cold)  # untimed: the edit then reads its prefix from disk
                before = proc_io()
                disk_before = device_written(stat) if stat else 0
                start = time.perf_counter()
                call(r)
                wrote = time.perf_counter() - start
                if sync:
                    fsync_path(sync)
                synced = time.perf_counter() - start
                after = proc_io()
                disk_after = device_written(stat) if stat else 0
                if r < 0:
                    continue
                times[name].append(wrote)
                if sync:
                    durable[name].append(synced)
                if before:
                    written[name].append(after["write_bytes"] - before["write_bytes"])
                    wchar[name].append(after["wchar"] - before["wchar"])
                if stat and name in on_disk:
                    on_disk[name].append(disk_after - disk_before)
        size = timing.fmt_bytes(args.size)
        peers_plain = {k: v for k, v in times.items() if not k.startswith("aprfast")}
        peers_durable = {f"{k} + fsync": v for k, v in durable.items()}
        st = {k: v for k, v in peers_durable.items() if k.startswith("safetensors")}
        gg = {k: v for k, v in peers_durable.items() if k.startswith("GGUF")}
        table.add(Row("edit in place, durable (2 fdatasyncs)", size, times["aprfast in place, durable"],
                      primary=st, others=gg))
        table.add(Row("edit in place, no fsync", size, times["aprfast in place, no fsync"],
                      primary={k: v for k, v in peers_plain.items() if k.startswith("safetensors")},
                      others={k: v for k, v in peers_plain.items() if k.startswith("GGUF")}))
        table.add(Row("edit in place, durable, file not in the page cache", size,
                      times["aprfast in place, durable, file evicted first"], primary=st, others=gg,
                      note="peers warm"))
        table.add(Row("edit by rewrite (no room), durable", size, times["aprfast rewrite, durable"],
                      primary=st, others=gg, note="copy_file_range; the data is never read into Python"))
        if any(written.values()):
            wst = {k: v for k, v in written.items() if k.startswith("safetensors")}
            wgg = {k: v for k, v in written.items() if k.startswith("GGUF")}
            table.add(Row("bytes written (/proc/self/io write_bytes), in place", size,
                          written["aprfast in place, durable"], primary=wst, others=wgg, unit="bytes"))
            table.add(Row("bytes written (/proc/self/io write_bytes), in place, file not cached", size,
                          written["aprfast in place, durable, file evicted first"], primary=wst, others=wgg,
                          unit="bytes"))
            table.add(Row("bytes written (/proc/self/io write_bytes), rewrite", size,
                          written["aprfast rewrite, durable"], primary=wst, others=wgg, unit="bytes"))
            if stat:
                dst = {f"{k} + fsync": v for k, v in on_disk.items() if k.startswith("safetensors")}
                dgg = {f"{k} + fsync": v for k, v in on_disk.items() if k.startswith("GGUF")}
                table.add(Row("bytes the disk wrote (device sectors, journal included), in place, durable", size,
                              on_disk["aprfast in place, durable"], primary=dst, others=dgg, unit="bytes"))
                table.add(Row("bytes the disk wrote (device sectors, journal included), in place, file not cached",
                              size, on_disk["aprfast in place, durable, file evicted first"], primary=dst,
                              others=dgg, unit="bytes"))
            for name in tools:
                table.notes.append(f"{name}: write_bytes median {int(np.median(written[name])):,} B, "
                                   f"wchar median {int(np.median(wchar[name])):,} B")
        table.notes.append("write_bytes counts page-cache folios dirtied, wchar the bytes passed to write calls. A "
                           "file in the page cache may sit in large folios (512 KiB seen on Linux 6.18 ext4): "
                           "dirtying a few KiB of one counts the whole folio, so the warm in-place row shows the "
                           "folio, the evicted row the pages written (the edit's own bytes are its wchar). "
                           "copy_file_range counts in both. The peers write a new file, as "
                           "gguf_new_metadata.py does; aprfast edits its file.")
        if stat:
            for name in on_disk:
                table.notes.append(f"{name}: the disk wrote median {int(np.median(on_disk[name])):,} B "
                                   f"({stat}, sectors written, during the call and its fsync)")
        table.notes.append(f"aprfast's file was saved with reserve={args.reserve}; its in-place edit writes "
                           "the new metadata and index into that room, then the header (docs/FORMAT.md §5.2).")
        return table.finish(args.md_out)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=512 * MiB, help="model size (default 512MiB; e.g. 4GiB)")
    p.add_argument("--tensors", type=int, default=256, help="tensor count (default 256)")
    p.add_argument("--keys", type=int, default=10, help="metadata keys set per edit (default 10)")
    p.add_argument("--renames", type=int, default=100, help="tensors renamed per edit (default 100)")
    p.add_argument("--reserve", type=int, default=256 << 10, help="aprfast's room for edits (default 256 KiB)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the files go (default: the temp dir)")
    p.add_argument("--quick", action="store_true", help="64 MiB, 3 rounds")
    p.add_argument("--md-out", default=None, help="also write the Markdown table here")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.rounds = 64 * MiB, 3
    if args.renames > args.tensors:
        p.error("--renames cannot exceed --tensors")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
