"""aprfast's container I/O beside safetensors and the strongest other tool for each job.

    python benchmarks/bench_containers.py                  # full sizes (504 MiB model), 7 rounds
    python benchmarks/bench_containers.py --quick          # 1/8 sizes, 3 rounds, 2 fresh processes
    python benchmarks/bench_containers.py --no-fresh       # skip the fresh-process rows
    python benchmarks/bench_containers.py --md-out F.md    # also write the Markdown table to F.md
    python benchmarks/bench_containers.py --loop           # samples as loops of one tool (older tables)

Models: "large" 200 float32 tensors of 645x1024 (504 MiB), "small" 50 of 80x256
(3.9 MiB), "tiny" 10,000 of 256 floats (1 KiB each), and, for the inspect row only,
"index" with 100,000 tensors of 16 floats (models.py).  --quick scales the large model
to 1/8 and takes 3 rounds; a peer whose first call takes over 2 s (GGUFReader, np.load
over 10k-100k tensors) is sampled in 3 rounds only (1 with --quick), marked n=....

Like with like, row by row (aprfast | safetensors | best other tool | limit):

* save, no fsync: ``save_file(durable=False)`` | ``safetensors.numpy.save_file`` |
  torch.save, np.savez, GGUFWriter.  Every tool writes to a path that does not exist:
  the destination is removed before each call, outside the timed region.
* save, durable: ``save_file()`` (fsyncs the file and its directory) | the same peers,
  each followed by fsync of the file and of the directory.
* open + names: ``open(p).keys()`` | ``safe_open(p, "np").keys()`` | np.load(npz).files,
  torch.load(mmap=True), GGUFReader (each tool's cheapest way to list the names).
* inspect: ``aprfast.inspect`` | safetensors' header read and ``json.loads`` (what
  any safetensors inspector does) | GGUFReader.
* every tensor as a view: ``open(p)`` + ``get_tensor`` | ``safe_open(p, "pt")`` +
  ``get_tensor`` and ``safetensors.torch.load_file`` (views of a private mmap; need
  torch) | ``torch.load(mmap=True)``, ``np.load(mmap_mode="r")`` per .npy, GGUFReader.
  In the same round-robin, two rows for the drop-in ``aprfast.torch.load_file`` against
  ``safetensors.torch.load_file``: its default (like for like: lazy tensors over a
  private map, nothing read) and with ``verify=True`` (the whole-file CRC, which reads
  every byte).
* every tensor as an owned copy: ``open(p)`` + ``get_tensor(copy=True)`` |
  ``safe_open(p, "np")`` + ``get_tensor`` (copies) | np.load per .npy, GGUFReader +
  ``np.array``.
* eager load: ``load_file(mmap=False)`` | ``safetensors.numpy.load_file`` (mmap and
  pread backends) | torch.load, np.load(npz), np.load per .npy, GGUFReader + np.array;
  limit: one ``readinto`` of the file's bytes.
* one tensor from an already open file, view and copy; ``get_slice`` of 1/8 of the
  rows (copy: safetensors numpy ``get_slice`` and a copied slice of a NumPy memmap;
  view: ``get_tensor(...)[:r]`` against a torch view and a memmap slice).
* crc32 of 256 MiB, one thread and all cores, against ``zlib.crc32`` (one thread).
* fresh processes (on unless ``--no-fresh``): each sample is a new Python process
  (round-robin across tools, ``_fresh_load.py``) that imports its tool, then times one
  load of the prepared file; reports the time, the peak RSS above the RSS it had after
  its imports, and the peak RSS of the whole process (VmHWM).
* save peak RSS above the inputs, each tool in a fresh process.

Files are in the page cache (as in a reload loop); the fresh-process rows start
cold in the process, not on the disk.

Warm rows are an independent round-robin (issue 29 item 0): every sample is one call;
its result is dropped (and garbage collected) after the clock stops and before the next
tool runs; the tools take turns for --rounds rounds (7).  So no call reuses memory its
own previous call just freed (aprfast's freed-buffer cache, glibc's heap), other tools
run in between as in a program that does other work, and freeing a result is not
timed.  ``--loop`` gives the older samples: a loop of ~50 ms of one tool's calls,
where each call may reuse its predecessor's buffers.
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import timing
from models import model
from timing import Row, Samples, Table, interleaved, read_into, unlinker

import aprfast

try:
    import safetensors.numpy as st_numpy
    from safetensors import safe_open
except ImportError:  # pragma: no cover
    sys.exit("the benchmarks compare against safetensors: pip install .[bench]")

try:
    import safetensors.torch as st_torch
    import torch

    import aprfast.torch as apr_torch
    TORCH_WHY = None
except ImportError as exc:
    torch = st_torch = apr_torch = None
    TORCH_WHY = f"not installed ({exc.name}); pip install torch to add its rows"

try:
    import gguf
    GGUF_WHY = None
except ImportError as exc:
    gguf = None
    GGUF_WHY = f"not installed ({exc.name})"

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
MODELS = ("large", "small", "tiny")
DROPIN = "aprfast.torch.load_file"
DROPIN_CRC = "aprfast.torch.load_file(verify=True)"


def huge_model(scale: float) -> dict:
    """512 float32 tensors of 2048x1024 (4 GiB; --quick: 1/8), for the eager-load rows only."""
    rng = np.random.default_rng(1)
    rows = max(8, int(2048 * scale))
    return {f"blocks.{i:03d}.weight": rng.random((rows, 1024), dtype=np.float32) for i in range(512)}


def size_text(nbytes: int) -> str:
    return f"{nbytes / MiB:.1f} MiB" if nbytes >= MiB else f"{nbytes / 1024:.0f} KiB"


# --- writers, one per tool, all to a path that must not exist ---------------------------
def gguf_save(tensors, path):
    writer = gguf.GGUFWriter(path, "bench")
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def fresh_small_page_buffer(nbytes: int) -> mmap.mmap:
    """Fresh anonymous memory with huge pages refused (4 KiB pages)."""
    buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return buf


def fresh_buffer(nbytes: int) -> mmap.mmap:
    """Fresh anonymous memory, huge pages advised where the platform has them (what an
    owned load of ``nbytes`` must fill).  Private, as an allocator maps it: Python's
    default anonymous map is shared (shmem), about 1.3x slower to fault in here."""
    buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


def touch_fresh_pages(nbytes: int) -> mmap.mmap:
    """Write one byte per 4 KiB page of fresh memory: the page-fault cost alone, which
    every tool producing ``nbytes`` of new owned arrays pays (on a VM whose host backs
    guest memory lazily it is most of an owned load)."""
    buf = fresh_buffer(nbytes)
    np.frombuffer(buf, np.uint8)[::4096] = 1
    return buf


FLOOR_SAVE = "write() of the payload bytes"


def write_fresh(path, data):
    """One write() of ``data`` to a new file (the floor of any save of those bytes)."""
    with open(path, "xb", buffering=0) as f:
        view = memoryview(data)
        while view:
            view = view[f.write(view):]


def fsync_path(path):
    """fsync the file and its directory, as aprfast's durable save does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Bench:
    def __init__(self, directory, rounds, fresh_rounds, table, independent=True):
        self.dir, self.rounds, self.fresh_rounds, self.table = directory, rounds, fresh_rounds, table
        self.slow_rounds = min(3, rounds)
        self.independent = independent

    def path(self, model, ext):
        return os.path.join(self.dir, f"{model}.{ext}")

    def time(self, tools, rounds=None, **kw):
        # a peer needing seconds per call (GGUFReader and np.load over 10k-100k tensors)
        # gets 3 samples, marked n=3, instead of stretching the run by minutes
        return interleaved(tools, rounds or self.rounds, slow=2.0, slow_rounds=self.slow_rounds,
                           independent=self.independent, **kw)

    # --- the files every read row uses -----------------------------------------------
    def prepare(self, name, tensors):
        files = {"apr": self.path(name, "apr"), "st": self.path(name, "safetensors"),
                 "npz": self.path(name, "npz"), "npy": self.path(name, "npy.d"),
                 "pt": self.path(name, "pt"), "gguf": self.path(name, "gguf")}
        aprfast.save_file(tensors, files["apr"], durable=False)
        st_numpy.save_file(tensors, files["st"])
        np.savez(files["npz"], **tensors)
        os.makedirs(files["npy"], exist_ok=True)
        for key, value in tensors.items():
            np.save(os.path.join(files["npy"], key + ".npy"), value)
        if torch is not None:
            torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, files["pt"])
        if gguf is not None:
            gguf_save(tensors, files["gguf"])
        os.sync()  # writeback of what was just saved ends before anything is timed
        return files

    # --- saves ----------------------------------------------------------------------
    def saves(self, name, tensors, size):
        t = self.table
        dest = {k: self.path(name, f"out.{k}") for k in ("apr", "st", "pt", "npz", "gguf")}
        tt = {k: torch.from_numpy(v) for k, v in tensors.items()} if torch is not None else None
        fns = {
            "aprfast": lambda: aprfast.save_file(tensors, dest["apr"], durable=False),
            "safetensors": lambda: st_numpy.save_file(tensors, dest["st"]),
            "np.savez": lambda: np.savez(dest["npz"], **tensors),
        }
        paths = {"aprfast": dest["apr"], "safetensors": dest["st"], "np.savez": dest["npz"]}
        if tt is not None:
            fns["torch.save"] = lambda: torch.save(tt, dest["pt"])
            paths["torch.save"] = dest["pt"]
        if gguf is not None:
            fns["GGUFWriter"] = lambda: gguf_save(tensors, dest["gguf"])
            paths["GGUFWriter"] = dest["gguf"]
        # the floor (not a peer): the payload's bytes, already in one buffer, written by
        # one write() to a fresh path; every format writes at least these bytes
        payload = b"".join(v.tobytes() for v in tensors.values())
        dest["raw"] = self.path(name, "out.raw")
        fns[FLOOR_SAVE] = lambda: write_fresh(dest["raw"], payload)  # noqa: F821 (called before the del below)
        paths[FLOOR_SAVE] = dest["raw"]
        setup = {k: unlinker(p) for k, p in paths.items()}
        r = self.time(fns, setup=setup)
        floor = {FLOOR_SAVE: r.pop(FLOOR_SAVE)}
        t.add(Row(f"{name}: save to a fresh path, no fsync", size, r.pop("aprfast"),
                  {"save_file": r.pop("safetensors")}, r, floor))
        del fns[FLOOR_SAVE], paths[FLOOR_SAVE], payload

        durable = {"aprfast": lambda: aprfast.save_file(tensors, dest["apr"])}
        for k, fn in fns.items():
            if k != "aprfast":
                durable[k + " + fsync"] = (lambda fn=fn, p=paths[k]: (fn(), fsync_path(p)))
        setup = {(k if k == "aprfast" else k + " + fsync"): s for k, s in setup.items()}
        r = self.time(durable, setup=setup)
        t.add(Row(f"{name}: save to a fresh path, durable (fsync file + dir)", size, r.pop("aprfast"),
                  {"save_file + fsync": r.pop("safetensors + fsync")}, r))
        for p in paths.values():
            unlinker(p)()

    # --- reads ----------------------------------------------------------------------
    def reads(self, name, tensors, files, size):
        t = self.table
        apr, st, npz, npy, pt, gg = (files[k] for k in ("apr", "st", "npz", "npy", "pt", "gguf"))
        names = list(tensors)
        npy_paths = [os.path.join(npy, k + ".npy") for k in names]
        fast = dict(min_sample=0.05)

        # open + list names
        def apr_keys():
            with aprfast.open(apr) as f:
                return f.keys()

        def st_keys():
            with safe_open(st, "np") as f:
                return list(f.keys())

        def npz_keys():
            with np.load(npz) as f:
                return list(f.files)

        tools = {"aprfast": apr_keys, "safe_open keys": st_keys, "np.load(npz).files": npz_keys}
        if torch is not None:
            tools["torch.load(mmap=True) keys"] = lambda: list(torch.load(pt, mmap=True, weights_only=True))
        if gguf is not None:
            tools["GGUFReader names"] = lambda: [x.name for x in gguf.GGUFReader(gg).tensors]
        r = self.time(tools, **fast)
        t.add(Row(f"{name}: open + list names", size, r.pop("aprfast"), {"safe_open keys": r.pop("safe_open keys")},
                  r))

        self.inspect_row(name, files, size)

        # every tensor as a view
        def apr_views():
            with aprfast.open(apr) as f:
                return [f.get_tensor(k) for k in names]

        tools = {"aprfast": apr_views}
        primary = {}
        if torch is not None:
            def st_pt_views():
                with safe_open(st, "pt") as f:
                    return [f.get_tensor(k) for k in names]
            tools["safe_open(pt) get_tensor"] = st_pt_views
            tools["safetensors.torch.load_file"] = lambda: st_torch.load_file(st)
            tools["torch.load(mmap=True)"] = lambda: torch.load(pt, mmap=True, weights_only=True)
            # the drop-in, in the same round-robin: its default, like for like (lazy tensors
            # over a private map), and with the whole-file CRC, which reads every byte
            tools[DROPIN] = lambda: apr_torch.load_file(apr)
            tools[DROPIN_CRC] = lambda: apr_torch.load_file(apr, verify=True)
        tools["np.load(mmap_mode='r') per .npy"] = lambda: [np.load(p, mmap_mode="r") for p in npy_paths]
        if gguf is not None:
            tools["GGUFReader .data"] = lambda: [x.data for x in gguf.GGUFReader(gg).tensors]
        r = self.time(tools, **fast)
        dropin = {k: r.pop(k) for k in (DROPIN, DROPIN_CRC) if k in r}
        for k in ("safe_open(pt) get_tensor", "safetensors.torch.load_file"):
            if k in r:
                primary[k] = r.pop(k)
        note = "" if primary else "safetensors has no zero-copy NumPy API: its views need torch"
        t.add(Row(f"{name}: every tensor as a view", size, r.pop("aprfast"), primary, r, note=note))
        if dropin:
            st_load = {"safetensors.torch.load_file": primary["safetensors.torch.load_file"]}
            t.add(Row(f"{name}: torch load_file (drop-in)", size, dropin[DROPIN], st_load,
                      note="like for like: both lazy tensors over a private map"))
            t.add(Row(f"{name}: torch load_file (drop-in), verify=True", size, dropin[DROPIN_CRC], st_load,
                      note="the whole-file CRC reads every byte; safetensors checks nothing and reads no "
                           "tensor data"))

        # every tensor as an owned copy, through an open file
        def apr_copies():
            with aprfast.open(apr) as f:
                return [f.get_tensor(k, copy=True) for k in names]

        def st_np_copies():
            with safe_open(st, "np") as f:
                return [f.get_tensor(k) for k in names]

        tools = {"aprfast": apr_copies, "safe_open(np) get_tensor": st_np_copies,
                 "np.load per .npy": lambda: [np.load(p) for p in npy_paths]}
        if gguf is not None:
            tools["GGUFReader + np.array"] = lambda: [np.array(x.data) for x in gguf.GGUFReader(gg).tensors]
        total = os.path.getsize(st)
        tools["first touch of fresh memory (not a copy)"] = lambda: touch_fresh_pages(total)
        r = self.time(tools, **fast)
        touch = r.pop("first touch of fresh memory (not a copy)")
        t.add(Row(f"{name}: every tensor as an owned copy (open + get_tensor)", size, r.pop("aprfast"),
                  {"safe_open(np) get_tensor": r.pop("safe_open(np) get_tensor")}, r,
                  note=f"touching {size} of fresh pages alone: {touch.text()}"))

        # eager load into owned arrays
        def readinto(make=fresh_buffer):
            # The floor for an owned load: fresh memory (huge pages where the kernel gives
            # them, or 4 KiB pages) filled by one read.  A reused buffer would skip the
            # page faults that every owned load pays.
            buf = make(total)
            read_into(st, buf)
            return buf

        def npz_load():
            with np.load(npz) as f:
                return {k: f[k] for k in f.files}

        tools = {"aprfast": lambda: aprfast.load_file(apr, mmap=False),
                 "safetensors.numpy.load_file": lambda: st_numpy.load_file(st),
                 "safetensors.numpy.load_file(backend='pread')": lambda: st_numpy.load_file(st, backend="pread"),
                 "np.load(npz)": npz_load,
                 "np.load per .npy": lambda: {k: np.load(p) for k, p in zip(names, npy_paths)},
                 "readinto (the file's bytes)": readinto,
                 "readinto, 4 KiB pages": lambda: readinto(fresh_small_page_buffer),
                 "first touch of fresh memory (not a load)": lambda: touch_fresh_pages(total)}
        if torch is not None:
            tools["torch.load"] = lambda: torch.load(pt, weights_only=True)
        if gguf is not None:
            tools["GGUFReader + np.array"] = lambda: {x.name: np.array(x.data) for x in gguf.GGUFReader(gg).tensors}
        r = self.time(tools, **fast)
        primary = {k: r.pop(k) for k in list(r) if k.startswith("safetensors")}
        limits = {FLOOR: r.pop("readinto (the file's bytes)"), FLOOR_SMALL: r.pop("readinto, 4 KiB pages")}
        touch = r.pop("first touch of fresh memory (not a load)")
        t.add(Row(f"{name}: eager load, owned arrays", size, r.pop("aprfast"), primary, r, limits,
                  note=f"touching {size} of fresh pages alone: {touch.text()}"))

        # one tensor from an already open file; slices of 1/8 of the rows
        one = names[len(names) // 2]
        rows = tensors[one].shape[0]
        eighth = max(1, rows // 8)
        with aprfast.open(apr) as af, safe_open(st, "np") as sf:
            mm = np.load(os.path.join(npy, one + ".npy"), mmap_mode="r")
            sfp = safe_open(st, "pt") if torch is not None else None
            one_size = size_text(tensors[one].nbytes)
            tools = {"aprfast": lambda: af.get_tensor(one)}
            if sfp is not None:
                tools["safe_open(pt) get_tensor"] = lambda: sfp.get_tensor(one)
            r = self.time(tools, min_sample=0.02)
            ours = r.pop("aprfast")
            t.add(Row(f"{name}: one tensor from an open file, view", one_size, ours, r,
                      note="" if r else "safetensors views need torch"))

            tools = {"aprfast": lambda: af.get_tensor(one, copy=True),
                     "safe_open(np) get_tensor": lambda: sf.get_tensor(one),
                     "np.array(open memmap)": lambda: np.array(mm)}
            r = self.time(tools, min_sample=0.02)
            t.add(Row(f"{name}: one tensor from an open file, copy", one_size, r.pop("aprfast"),
                      {"safe_open(np) get_tensor": r.pop("safe_open(np) get_tensor")}, r))

            if tensors[one].ndim >= 2:
                slice_size = size_text(tensors[one][:eighth].nbytes)
                tools = {"aprfast": lambda: af.get_slice(one)[:eighth],
                         "safe_open(np) get_slice": lambda: sf.get_slice(one)[:eighth],
                         "np.array(memmap[:r])": lambda: np.array(mm[:eighth])}
                if sfp is not None:
                    tools["safe_open(pt) get_slice"] = lambda: sfp.get_slice(one)[:eighth]
                r = self.time(tools, min_sample=0.02)
                primary = {k: r.pop(k) for k in list(r) if k.startswith("safe_open")}
                t.add(Row(f"{name}: get_slice, 1/8 of the rows, copy", slice_size, r.pop("aprfast"), primary, r))

                tools = {"aprfast": lambda: af.get_tensor(one)[:eighth], "memmap[:r]": lambda: mm[:eighth]}
                if sfp is not None:
                    tools["safe_open(pt) get_tensor[:r]"] = lambda: sfp.get_tensor(one)[:eighth]
                r = self.time(tools, min_sample=0.02)
                primary = {k: r.pop(k) for k in list(r) if k.startswith("safe_open")}
                t.add(Row(f"{name}: 1/8 of the rows, view (get_tensor[:r])", slice_size, r.pop("aprfast"),
                          primary, r, note="" if primary else "safetensors views need torch"))
            if sfp is not None:
                sfp.__exit__(None, None, None)
            mm = None

    def inspect_row(self, name, files, size):
        """Header, metadata and the whole index (names, dtypes, shapes, offsets)."""
        apr, st, gg = files["apr"], files["st"], files["gguf"]

        def st_header():
            with open(st, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                return json.loads(f.read(n))

        tools = {"aprfast": lambda: aprfast.inspect(apr), "header + json.loads": st_header,
                 "aprfast, every entry built": lambda: list(aprfast.inspect(apr)["tensors"].items())}
        if gguf is not None:
            tools["GGUFReader"] = lambda: gguf.GGUFReader(gg).tensors
        r = self.time(tools, min_sample=0.05)
        every = r.pop("aprfast, every entry built")
        header = {"header + json.loads": r.pop("header + json.loads")}
        self.table.add(Row(f"{name}: inspect (header + index; entries built on access)", size, r.pop("aprfast"),
                           header, r))
        self.table.add(Row(f"{name}: inspect + every entry built", size, every, header, r))

    # --- fresh processes -------------------------------------------------------------
    def fresh(self, name, files, size):
        copy = {"aprfast.load_file(mmap=False)": files["apr"], "safetensors.numpy.load_file": files["st"],
                "np.load(npz)": files["npz"], "np.load(npy) per tensor": files["npy"],
                FLOOR: files["apr"], FLOOR_SMALL: files["apr"]}
        view = {"aprfast.load_file (views)": files["apr"], "np.load(npy, mmap) per tensor": files["npy"]}
        if torch is not None:
            copy["torch.load"] = files["pt"]
            view["safetensors.torch.load_file (views)"] = files["st"]
            view["torch.load(mmap=True)"] = files["pt"]
        if gguf is not None:
            copy["GGUFReader copy"] = files["gguf"]
            view["GGUFReader view"] = files["gguf"]
        for kind, tools in (("owned copies", copy), ("views", view)):
            times, above, whole = fresh_samples(tools, self.fresh_rounds)
            ours = next(k for k in tools if k.startswith("aprfast"))
            primary = [k for k in tools if k.startswith("safetensors")]
            note = "" if primary else "safetensors views need torch"
            for label, data, unit in (("time", times, "s"), ("peak RSS above its imports", above, "B"),
                                      ("peak RSS of the process (VmHWM)", whole, "B")):
                data = dict(data)
                ours_s = data.pop(ours)
                prim = {k: data.pop(k) for k in primary}
                floors = {k: data.pop(k) for k in FLOORS if k in data}
                limits = floors if floors and unit == "s" else None
                self.table.add(Row(f"{name}: fresh process, load into {kind}, {label}", size, ours_s, prim, data,
                                   limits, unit=unit, note=note))


    def big_tensor_copy(self):
        """One 64 MiB tensor copied out of an open file (issue 9 asks for 80 KiB, 2 MiB
        and 64 MiB; the models give the first two)."""
        tensors = {"w": np.random.default_rng(2).random((16384, 1024), dtype=np.float32)}
        apr, st, npy = self.path("big", "apr"), self.path("big", "safetensors"), self.path("big", "npy")
        aprfast.save_file(tensors, apr, durable=False)
        st_numpy.save_file(tensors, st)
        np.save(npy, tensors["w"])
        os.sync()
        with aprfast.open(apr) as af, safe_open(st, "np") as sf:
            mm = np.load(npy, mmap_mode="r")
            tools = {"aprfast": lambda: af.get_tensor("w", copy=True),
                     "safe_open(np) get_tensor": lambda: sf.get_tensor("w"),
                     "np.array(open memmap)": lambda: np.array(mm)}  # noqa: F821 (called before the del below)
            r = self.time(tools, min_sample=0.05)
            self.table.add(Row("big: one tensor from an open file, copy", size_text(tensors["w"].nbytes),
                               r.pop("aprfast"), {"safe_open(np) get_tensor": r.pop("safe_open(np) get_tensor")}, r))
            del mm
        for p in (apr, st, npy):
            unlinker(p)()

    def eager_only(self, name, tensors, size):
        """The eager-load rows alone (in a loop and in fresh processes), for a model too
        big to give every row: aprfast, safetensors, torch.load and the readinto floor."""
        files = {"apr": self.path(name, "apr"), "st": self.path(name, "safetensors"), "pt": self.path(name, "pt")}
        aprfast.save_file(tensors, files["apr"], durable=False)
        st_numpy.save_file(tensors, files["st"])
        if torch is not None:
            torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, files["pt"])
        os.sync()
        total = sum(v.nbytes for v in tensors.values())

        def readinto(make=fresh_buffer):
            buf = make(total)
            read_into(files["st"], buf)
            return buf

        tools = {"aprfast": lambda: aprfast.load_file(files["apr"], mmap=False),
                 "safetensors.numpy.load_file": lambda: st_numpy.load_file(files["st"]),
                 "readinto (the file's bytes)": readinto,
                 "readinto, 4 KiB pages": lambda: readinto(fresh_small_page_buffer)}
        if torch is not None:
            tools["torch.load"] = lambda: torch.load(files["pt"], weights_only=True)
        r = self.time(tools, rounds=min(self.rounds, 3))
        primary = {"safetensors.numpy.load_file": r.pop("safetensors.numpy.load_file")}
        limits = {FLOOR: r.pop("readinto (the file's bytes)"), FLOOR_SMALL: r.pop("readinto, 4 KiB pages")}
        self.table.add(Row(f"{name}: eager load, owned arrays", size, r.pop("aprfast"), primary, r, limits))
        fresh = {"aprfast.load_file(mmap=False)": files["apr"], "safetensors.numpy.load_file": files["st"],
                 FLOOR: files["apr"], FLOOR_SMALL: files["apr"]}
        if torch is not None:
            fresh["torch.load"] = files["pt"]
        times, above, _ = fresh_samples(fresh, min(self.fresh_rounds, 3))
        for label, data, unit in (("time", times, "s"), ("peak RSS above its imports", above, "B")):
            data = dict(data)
            ours = data.pop("aprfast.load_file(mmap=False)")
            prim = {"safetensors.numpy.load_file": data.pop("safetensors.numpy.load_file")}
            floors = {k: data.pop(k) for k in FLOORS}
            self.table.add(Row(f"{name}: fresh process, load into owned copies, {label}", size, ours, prim, data,
                               floors if unit == "s" else None, unit=unit))
        for p in files.values():
            unlinker(p)()


# The floors of an owned load in a fresh process (limits, not peers): fresh memory
# with huge pages advised (the limit) and with them refused.  On a VM whose
# hypervisor takes back freed guest memory, fresh huge pages cost a host fault per
# 4 KiB and the second floor is the lower one (csrc/buffers.c advise_fresh_block).
FLOOR = "fresh huge-page buffer + readinto"
FLOOR_SMALL = "fresh 4 KiB-page buffer + readinto"
FLOORS = (FLOOR, FLOOR_SMALL)


def fresh_samples(tools: dict, rounds: int):
    """Each sample a new process, round-robin across tools; (times, peak RSS above the
    imports, peak RSS of the whole process) by tool."""
    times = {k: Samples() for k in tools}
    above = {k: Samples() for k in tools}
    whole = {k: Samples() for k in tools}
    child = os.path.join(HERE, "_fresh_load.py")
    for _ in range(rounds):
        for tool, path in tools.items():
            out = subprocess.run([sys.executable, child, tool, path], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"fresh-process load with {tool} failed:\n{out.stderr}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            times[tool].append(got["seconds"])
            above[tool].append(got["peak_above"])
            whole[tool].append(got["peak"])
    return times, above, whole


def crc_rows(table, size, rounds, independent=True):
    """zlib.crc32 has one thread; aprfast's is shown on one thread and on all cores."""
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    every = f"threads=0 (all {os.cpu_count()} cores)"
    r = interleaved({"threads=1": lambda: aprfast.crc32(data, threads=1),
                     every: lambda: aprfast.crc32(data, threads=0),
                     "zlib.crc32": lambda: zlib.crc32(data)}, rounds, min_sample=0.05, independent=independent)
    z = r.pop("zlib.crc32")
    for k, v in r.items():
        table.add(Row(f"crc32, aprfast {k}", size_text(size), v, None, {"zlib.crc32 (1 thread)": z}))
    one, every = r["threads=1"], r[every]
    table.notes.append(f"crc32 thread scaling as measured: all {os.cpu_count()} cores run "
                       f"{one.median / every.median:.2f}x the speed of 1 thread (medians) at this load.")


_PEAK_CHILD = r"""
import os, sys
sys.path.insert(0, {here!r})
import numpy as np
from models import model

who, name, scale, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
if who == 'aprfast':
    import aprfast
    save = lambda t: aprfast.save_file(t, path)
elif who == 'safetensors':
    import safetensors.numpy as stn
    save = lambda t: stn.save_file(t, path)
elif who == 'torch.save':
    import torch
    save = lambda t: torch.save({{k: torch.from_numpy(v) for k, v in t.items()}}, path)
elif who == 'np.savez':
    save = lambda t: np.savez(path, **t)
t = model(name, scale)
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024
base = status('VmRSS')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # VmHWM := current RSS: measure the save alone
save(t)
print(status('VmHWM') - base)
"""


def save_peak_rows(table, scale, directory, rounds, models):
    """Peak RSS above the inputs while each tool saves, in fresh processes."""
    code = _PEAK_CHILD.format(here=HERE)
    tools = ["aprfast", "safetensors", "np.savez"] + (["torch.save"] if torch is not None else [])
    for name in [m for m in ("large", "small") if m in models]:
        peaks = {k: Samples() for k in tools}
        size = None
        for _ in range(rounds):
            for who in tools:
                path = os.path.join(directory, f"peak.{name}.{who}")
                unlinker(path if who != "np.savez" else path + ".npz")()
                out = subprocess.run([sys.executable, "-c", code, who, name, str(scale), path],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"save peak child {who} failed:\n{out.stderr}")
                peaks[who].append(float(out.stdout.strip().splitlines()[-1]))
                if size is None and who == "aprfast":
                    size = size_text(os.path.getsize(path))
                unlinker(path if who != "np.savez" else path + ".npz")()
        ours = peaks.pop("aprfast")
        table.add(Row(f"{name}: save peak RSS above the inputs (fresh process)", size, ours,
                      {"save_file": peaks.pop("safetensors")}, peaks, unit="B"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1/8 sizes, 3 rounds, 2 fresh-process rounds")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per row (default 7)")
    parser.add_argument("--fresh-rounds", type=int, default=5, help="fresh processes per tool (default 5)")
    parser.add_argument("--no-fresh", action="store_true", help="skip the fresh-process rows")
    parser.add_argument("--loop", action="store_true",
                        help="the older method: a sample is a loop of one tool's calls (~50 ms), each call free "
                             "to reuse what the last one freed (default: one call per sample, result dropped "
                             "untimed before the next tool)")
    parser.add_argument("--models", default="large,small,tiny,huge,index",
                        help="comma-separated subset (huge: 4 GiB, eager-load rows only)")
    parser.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--markdown", action="store_true", help=argparse.SUPPRESS)  # old flag: always printed now
    args = parser.parse_args()
    scale = 0.125 if args.quick else 1.0
    rounds = 3 if args.quick else args.rounds
    fresh_rounds = 2 if args.quick else args.fresh_rounds
    wanted = args.models.split(",")

    versions = (f"safetensors {timing.version('safetensors')}, torch {torch.__version__ if torch else 'absent'}, "
                f"gguf {timing.version('gguf') if gguf else 'absent'}, crc32 kernel {aprfast._crc.best_path()}")
    table = Table("Containers: aprfast vs safetensors and the best other tool", "safetensors (best API)",
                  versions=versions)
    if torch is None:
        table.skip("torch (torch.save/torch.load/safetensors.torch rows)", TORCH_WHY)
    if gguf is None:
        table.skip("gguf (GGUFWriter/GGUFReader)", GGUF_WHY)
    started = time.time()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        bench = Bench(directory, rounds, fresh_rounds, table, independent=not args.loop)
        if args.quick:
            bench.slow_rounds = 1
        for name in [m for m in MODELS if m in wanted]:
            tensors = model(name, scale)
            nbytes = sum(v.nbytes for v in tensors.values())
            size = size_text(nbytes)
            print(f"--- {name}: {len(tensors)} tensors, {nbytes / MiB:.1f} MiB", flush=True)
            bench.saves(name, tensors, size)
            files = bench.prepare(name, tensors)
            bench.reads(name, tensors, files, size)
            if not args.no_fresh:
                bench.fresh(name, files, size)
            del tensors
            gc.collect()
            print(f"--- {name} done at {time.time() - started:.0f} s", flush=True)
        if "large" in wanted:
            bench.big_tensor_copy()
        if "huge" in wanted:  # 4 GiB: the eager-load rows only
            tensors = huge_model(scale)
            nbytes = sum(v.nbytes for v in tensors.values())
            print(f"--- huge: {len(tensors)} tensors, {nbytes / MiB:.1f} MiB (eager loads only)", flush=True)
            bench.eager_only("huge", tensors, size_text(nbytes))
            del tensors
            gc.collect()
            print(f"--- huge done at {time.time() - started:.0f} s", flush=True)
        if "index" in wanted:
            tensors = model("index", scale)
            print(f"--- index: {len(tensors)} tensors", flush=True)
            files = {"apr": bench.path("index", "apr"), "st": bench.path("index", "safetensors"),
                     "gguf": bench.path("index", "gguf")}
            aprfast.save_file(tensors, files["apr"], durable=False)
            st_numpy.save_file(tensors, files["st"])
            if gguf is not None:
                gguf_save(tensors, files["gguf"])
            bench.inspect_row("index", files, f"{len(tensors):,} tensors")
            del tensors
        crc_rows(table, int(256 * MiB * scale), rounds, independent=not args.loop)
        save_peak_rows(table, scale, directory, 1 if args.quick else 3, wanted)
    table.notes.append("Save rows: every tool writes to a path that does not exist (removed before each call, "
                       "untimed). Durable rows add fsync of the file and its directory to each peer.")
    table.notes.append("Method: " + ("loops: a sample is ~50 ms of one tool's calls back to back (--loop)."
                                      if args.loop else
                                      "independent round-robin: a sample is one call, its result dropped untimed "
                                      f"before the next tool runs, {rounds} rounds."))
    table.notes.append(f"A peer whose first call took over 2 s is sampled in {bench.slow_rounds} round(s) only "
                       "(its cell says n=...).")
    table.notes.append("inspect's tensors is a dict building each entry when asked for; the second inspect row "
                       "builds them all. bench_inspect.py covers both layouts, 1,000,000 tensors and fresh processes.")
    table.notes.append("Views: safetensors.torch.load_file and safe_open(pt) return tensors over a private mmap; "
                       "safetensors' NumPy API always copies, so it sits in the copy rows.")
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
