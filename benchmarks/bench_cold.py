"""Cold-cache loads and saves: aprfast against the loaders people pick for cold starts,
with the storage's own limit (fio, direct I/O) in the same loop, and the memory each
leaves behind (peak RSS, page cache).

    python benchmarks/bench_cold.py                  # 504 MiB model, 5 rounds
    python benchmarks/bench_cold.py --huge           # also the 4 GiB model (eager, memory, save rows)
    python benchmarks/bench_cold.py --quick          # 1/8 sizes, 3 rounds
    python benchmarks/bench_cold.py --md-out F.md    # also write the Markdown table
    python benchmarks/bench_cold.py --huge --only eager --fresh-memory cold   # see below

Every sample starts cold: before each call (untimed) every file the tool reads is
fsynced and dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)``, and a ``mincore`` count
(benchmarks/pagecache.py, independent of aprfast's own) must find none of its pages
cached, or the row is skipped with the reason; so must the files of every other tool of
the run, so that no sample runs short of free memory because the tools before it left
their formats cached.  Tools run round-robin (timing.py), so
a burst of load from other processes hits every tool alike.  On a VM the host may
still cache the disk image: "cold" is cold for this kernel, and the fio row shows what
the device (as this guest sees it) delivers.

Rows (aprfast | safetensors | the best other peer | limit):

* cold eager load into owned arrays: ``aprfast.load_file(backend=...)`` with "direct"
  (O_DIRECT; also with each engine forced, ``APRFAST_DIRECT_ENGINE``: io_uring and the
  threaded preads, both O_DIRECT, and buffered reads dropped behind the reader), "auto"
  (``mmap=False``: picks direct for a cold file) and "pread" |
  ``safetensors.numpy.load_file`` (mmap and pread back ends) | ``torch.load``,
  tensorizer ``TensorDeserializer`` (its own format, to CPU), Run:ai
  ``SafetensorsStreamer`` (tensors cloned out of its reused buffer), fastsafetensors
  ``fastsafe_open(nogds=True, device="cpu")`` (tensors cloned: they view its buffer),
  gguf-py ``GGUFReader`` + ``np.array`` | ``fio --direct=1 --rw=read --bs=16M
  --iodepth=16 --ioengine=io_uring`` (libaio where io_uring is refused) on the
  aprfast file.
* cold eager load in a fresh process (``--only memory``), round-robin with fio: the
  cold start users have.  In the loop rows above a tool's arrays take memory whatever
  ran before it freed (and its own allocator may keep); a fresh process populates all
  of it.  Its limit column also has the fresh memory alone: a fresh process populating
  the model's size (``MADV_POPULATE_WRITE``, huge pages and 4 KiB pages, one thread per
  core), and per round the slower of fio and the faster populate: a load into fresh
  memory pays both, while fio reuses its buffers and pays neither.  Beside it, fio's
  shallow read of the same file (``--bs=4M --iodepth=1``), which beat the issue's
  16M/16 on the development VM's virtio disk.
* peak memory of a cold eager load, each in a fresh process: VmHWM above the RSS after
  the imports, and the file's pages left in the page cache (mincore): their sum is
  what the load costs the machine (the issue's target: at most 1.05x the model +
  64 MiB with ``backend="direct"``).
* cold lazy open + one tensor (copied, so its bytes are really read).
* cold ``get_slice`` of 1/8 of the rows of one large tensor (fio on those bytes is the
  limit).
* durable save (fsync file + directory): ``save_file(backend="direct")`` (its writes on
  an io_uring ring where there is one; a second row with the thread engine forced) and
  the default | safetensors + fsync | limit: ``fio --rw=write --direct=1
  --fsync_on_close=1``; and the file's pages left in the page cache after each.

Fresh memory (``--fresh-memory``): a load populates memory for its arrays, and on a VM
whose kernel reports free pages to the host (virtio-balloon free page reporting, which
the table's notes name when it is on) what that costs depends on when the memory was
freed: blocks of 2 MiB free for about 2 s are handed back to the host, and populating
them again cost 4.5 ms per 2 MiB on the development VM against 0.1 ms for memory freed a
moment before.  A loop decides this by accident (what the tool before freed, how long a
child took to start), so the 4 GiB rows moved by 30% between runs.  ``warm`` touches and
frees the model's size + 512 MiB before every sample (untimed): every tool starts from
memory just freed, as a process started right after another ended does.  ``cold`` waits
4 s after the eviction instead: every tool populates memory the host took back, as the
first load on a VM idle for a while does.  ``as-is`` (the default) does neither.  The
warm rows do the same after reading the file into the page cache, and in the
fresh-process rows the child does it after its imports.

fio: ``apt-get install -y fio`` (Debian/Ubuntu), ``dnf install fio``, ``brew install
fio``; without it the limit rows say so.  fio reads into its own buffers, 4 KiB pages
unless hugetlb pages are free (``sysctl vm.nr_hugepages=136`` as root; ``--fio-mem``):
a direct request holds at most ``max_segments`` pages, so from 4 KiB pages fio's row
can understate the device (docs/performance.md, "Huge pages and direct reads").  Peers: ``pip install tensorizer
runai-model-streamer fastsafetensors gguf``; a missing one is listed as skipped, and
one that cannot run here says why.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pagecache
import timing
from timing import Row, Samples, Table, interleaved

import aprfast
from aprfast import _memory

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def optional(name):
    try:
        return __import__(name), None
    except ImportError as exc:  # pragma: no cover - depends on the machine
        return None, f"not installed ({exc.name}): pip install {name.replace('_', '-')}"
    except Exception as exc:  # noqa: BLE001 - a peer that fails to import says why
        return None, f"import failed: {exc!r}"


torch, TORCH_WHY = optional("torch")
safetensors, ST_WHY = optional("safetensors")
if safetensors is None:
    sys.exit("the benchmarks compare against safetensors: pip install .[bench]")
import safetensors.numpy as st_numpy  # noqa: E402
from safetensors import safe_open  # noqa: E402

gguf, GGUF_WHY = optional("gguf")
tensorizer, TENSORIZER_WHY = optional("tensorizer") if torch is not None else (None, "needs torch")
runai, RUNAI_WHY = optional("runai_model_streamer") if torch is not None else (None, "needs torch")
fastsafetensors, FASTST_WHY = optional("fastsafetensors") if torch is not None else (None, "needs torch")


# --- models and files ------------------------------------------------------------------
def large_model(scale: float) -> dict:
    """200 float32 tensors of 645x1024 (504 MiB; bench_containers' "large")."""
    rng = np.random.default_rng(0)
    rows = max(8, int(645 * scale))
    return {f"layers.{i:03d}.weight": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(200)}


def huge_model(scale: float) -> dict:
    """512 float32 tensors of 2048x1024 (4 GiB; bench_containers' "huge")."""
    rng = np.random.default_rng(1)
    rows = max(8, int(2048 * scale))
    return {f"blocks.{i:03d}.weight": rng.random((rows, 1024), dtype=np.float32) for i in range(512)}


def slice_model(scale: float) -> dict:
    """One float32 tensor of 8192x4096 (128 MiB) for the get_slice row."""
    rows = max(64, int(8192 * scale))
    return {"big": np.random.default_rng(2).standard_normal((rows, 4096), dtype=np.float32)}


def prepare(directory: str, name: str, tensors: dict, peers: bool = True) -> dict:
    """Each tool's own format of the same tensors (``peers=False``: aprfast's and
    safetensors' only)."""
    files = {"apr": os.path.join(directory, f"{name}.apr"), "st": os.path.join(directory, f"{name}.safetensors")}
    aprfast.save_file(tensors, files["apr"], durable=False)
    st_numpy.save_file(tensors, files["st"])
    if not peers:
        os.sync()
        return files
    if torch is not None:
        tt = {k: torch.from_numpy(v) for k, v in tensors.items()}
        files["pt"] = os.path.join(directory, f"{name}.pt")
        torch.save(tt, files["pt"])
        if tensorizer is not None:
            from tensorizer import TensorSerializer

            files["tensors"] = os.path.join(directory, f"{name}.tensors")
            writer = TensorSerializer(files["tensors"])
            writer.write_state_dict(tt)
            writer.close()
        del tt
    if gguf is not None:
        files["gguf"] = os.path.join(directory, f"{name}.gguf")
        writer = gguf.GGUFWriter(files["gguf"], "bench")
        for key, value in tensors.items():
            writer.add_tensor(key, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    os.sync()
    return files


# --- the loads, by tool (shared with the fresh-process children) -----------------------
def _engine(engine, fn):
    """``fn`` with direct reads forced onto one engine ("io_uring", "threads" or "buffered")."""
    from aprfast.io.direct import ENGINE_ENV

    def call():
        before = os.environ.get(ENGINE_ENV)
        os.environ[ENGINE_ENV] = engine
        try:
            return fn()
        finally:
            if before is None:
                os.environ.pop(ENGINE_ENV, None)
            else:
                os.environ[ENGINE_ENV] = before
    return call


def eager_tools(files: dict) -> dict:
    """name -> (function, the files it reads)."""
    apr, st = files["apr"], files["st"]
    tools = {
        "aprfast.load_file(backend='direct')": (lambda: aprfast.load_file(apr, backend="direct"), [apr]),
        # the two engines of direct reads, each forced (aprfast.io.direct.ENGINE_ENV)
        "aprfast.load_file(backend='direct'), engine io_uring": (
            _engine("io_uring", lambda: aprfast.load_file(apr, backend="direct")), [apr]),
        "aprfast.load_file(backend='direct'), engine threads": (
            _engine("threads", lambda: aprfast.load_file(apr, backend="direct")), [apr]),
        # buffered reads dropped from the cache behind the reader (faster than O_DIRECT
        # on some VMs, some of the time)
        "aprfast.load_file(backend='direct'), engine buffered": (
            _engine("buffered", lambda: aprfast.load_file(apr, backend="direct")), [apr]),
        "aprfast.load_file(mmap=False) (auto)": (lambda: aprfast.load_file(apr, mmap=False), [apr]),
        "aprfast.load_file(backend='pread')": (lambda: aprfast.load_file(apr, backend="pread"), [apr]),
        "safetensors.numpy.load_file": (lambda: st_numpy.load_file(st), [st]),
        "safetensors.numpy.load_file(backend='pread')": (lambda: st_numpy.load_file(st, backend="pread"), [st]),
    }
    if torch is not None and "pt" in files:
        pt = files["pt"]
        tools["torch.load"] = (lambda: torch.load(pt, weights_only=True), [pt])
    if "tensors" in files:
        from tensorizer import TensorDeserializer

        def tensorizer_load():
            with TensorDeserializer(files["tensors"], device="cpu") as d:
                return dict(d)
        tools["tensorizer TensorDeserializer"] = (tensorizer_load, [files["tensors"]])
    if runai is not None and "pt" in files:  # (prepare(peers=False) writes no peer formats)
        def runai_load():
            with runai.SafetensorsStreamer() as s:
                s.stream_file(st)
                return {k: v.clone() for k, v in s.get_tensors()}  # its buffer is reused
        tools["Run:ai SafetensorsStreamer (+ clone)"] = (runai_load, [st])
    if fastsafetensors is not None and "pt" in files:
        def fastst_load():
            with fastsafetensors.fastsafe_open(filenames=[st], nogds=True, device="cpu", debug_log=False) as f:
                return {k: f.get_tensor(k).clone() for k in f.keys()}
        tools["fastsafetensors (nogds, cpu, + clone)"] = (fastst_load, [st])
    if "gguf" in files:
        gg = files["gguf"]
        tools["GGUFReader + np.array"] = (lambda: {t.name: np.array(t.data) for t in gguf.GGUFReader(gg).tensors},
                                         [gg])
    return tools


def one_tensor_tools(files: dict, name: str) -> dict:
    apr, st = files["apr"], files["st"]

    def apr_one(**kw):
        with aprfast.open(apr, **kw) as f:
            return f.get_tensor(name, copy=True)

    def st_np():
        with safe_open(st, "np") as f:
            return f.get_tensor(name)

    tools = {"aprfast.open + get_tensor(copy=True)": (apr_one, [apr]),
             "aprfast.open(backend='direct') + get_tensor": (lambda: apr_one(backend="direct"), [apr]),
             "safe_open(np) get_tensor": (st_np, [st])}
    if torch is not None and "pt" in files:
        pt = files["pt"]
        tools["torch.load(mmap=True)[name].clone()"] = (
            lambda: torch.load(pt, mmap=True, weights_only=True)[name].clone(), [pt])
    if "tensors" in files:
        from tensorizer import TensorDeserializer

        def tz_one():
            with TensorDeserializer(files["tensors"], device="cpu", lazy_load=True) as d:
                return d[name].clone()
        tools["tensorizer lazy_load [name]"] = (tz_one, [files["tensors"]])
    if "gguf" in files:
        gg = files["gguf"]
        tools["GGUFReader + np.array(one)"] = (
            lambda: next(np.array(t.data) for t in gguf.GGUFReader(gg).tensors if t.name == name), [gg])
    return tools


def slice_tools(files: dict, rows: int) -> dict:
    apr, st = files["apr"], files["st"]

    def apr_slice(**kw):
        with aprfast.open(apr, **kw) as f:
            return f.get_slice("big")[:rows]

    def st_slice():
        with safe_open(st, "np") as f:
            return f.get_slice("big")[:rows]

    tools = {"aprfast.open + get_slice": (apr_slice, [apr]),
             "aprfast.open(backend='direct') + get_slice": (lambda: apr_slice(backend="direct"), [apr]),
             "safe_open(np) get_slice": (st_slice, [st])}
    if torch is not None and "pt" in files:
        pt = files["pt"]
        tools["torch.load(mmap=True) slice .clone()"] = (
            lambda: torch.load(pt, mmap=True, weights_only=True)["big"][:rows].clone(), [pt])
    return tools


# --- fio ---------------------------------------------------------------------------------
def fio_why_missing():
    if shutil.which("fio") is None:
        return "fio is not installed (apt-get install -y fio; dnf install fio; brew install fio)"
    return None


_FIO_ENGINE = None
#: fio's --iomem: "malloc" (fio's default: 4 KiB pages) or "shmhuge" (hugetlb pages);
#: set by main() from --fio-mem.
FIO_MEM = "malloc"
#: what fio's I/O buffers need: bs x iodepth
_FIO_BUFFERS = 16 * MiB * 16


def hugetlb_free_bytes() -> int:
    """Bytes of free hugetlb pages (``vm.nr_hugepages``), 0 where there are none."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["HugePages_Free"].split()[0]) * int(fields["Hugepagesize"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0


#: The state of the memory each sample populates (--fresh-memory): "as-is", "warm" or
#: "cold" (module docstring); FRESH_BYTES: what "warm" touches and frees (the model +
#: 512 MiB, set per model).  Children get both from FRESH_ENV.
FRESH_MEMORY = "as-is"
FRESH_BYTES = 0
FRESH_ENV = "BENCH_COLD_FRESH_MEMORY"
#: "cold" waits this long: past free page reporting's delay (2 s) and its work
COLD_WAIT = 4.0
MADV_POPULATE_WRITE = 23


#: Every file of the model being measured (set per model; the children get theirs).
ALL_FILES: list = []


def settle(paths) -> None:
    """Before a sample (untimed): drop every file of the run from the page cache (the
    tool's own ``paths`` where no run is set), then bring free memory to the state
    FRESH_MEMORY names.  Why all the files: with only its own evicted, the files of the
    tools before it (4 GiB each in the huge rows, and five formats) stayed cached and
    left the sample short of free memory, by an amount that depended on the order."""
    pagecache.evict_all(ALL_FILES or paths)
    fresh_memory_state()


def fresh_memory_state() -> None:
    """Bring free memory to the state FRESH_MEMORY names (untimed, before a sample)."""
    if FRESH_MEMORY == "cold":
        time.sleep(COLD_WAIT)
    elif FRESH_MEMORY == "warm" and FRESH_BYTES:
        import mmap

        m = mmap.mmap(-1, FRESH_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                m.madvise(mmap.MADV_HUGEPAGE)  # frees whole 2 MiB blocks, as a load's arrays do
            try:
                m.madvise(MADV_POPULATE_WRITE)
            except OSError:  # kernels before 5.14
                np.frombuffer(m, np.uint8)[::4096] = 1
        finally:
            m.close()


def fio_memory(choice: str) -> str:
    """fio's --iomem for ``choice`` ("auto": hugetlb pages where enough are free)."""
    if choice == "auto":
        return "shmhuge" if hugetlb_free_bytes() >= _FIO_BUFFERS else "malloc"
    return choice


def fio_pages() -> str:
    return "huge pages" if FIO_MEM == "shmhuge" else "4 KiB pages"


#: fio's own time of each job run by a limit row (the row reports these, not the wall
#: time of the call, which includes starting fio: about 0.3 s here)
FIO_TIMES = []


def fio(path, *, write=False, offset=0, size=None, bs=16 * MiB, depth=16):
    """One fio job (direct I/O, ``bs`` blocks, ``depth`` in flight: 16 MiB and 16, the
    issue's limit, unless given); returns the seconds fio measured for its I/O (also
    appended to FIO_TIMES)."""
    global _FIO_ENGINE
    engines = [_FIO_ENGINE] if _FIO_ENGINE else ["io_uring", "libaio"]
    last = None
    block = bs if size is None or size >= bs else max(4096, size // 4096 * 4096)
    for engine in engines:
        cmd = ["fio", "--name=limit", f"--filename={path}", "--direct=1", f"--rw={'write' if write else 'read'}",
               f"--bs={block}", f"--iodepth={depth}", f"--ioengine={engine}", f"--iomem={FIO_MEM}",
               "--output-format=json"]
        if offset:
            cmd.append(f"--offset={offset}")
        if size is not None:
            cmd.append(f"--size={size}")
        if write:
            cmd.append("--fsync_on_close=1")
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode == 0:
            job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
            if not job.get("error"):
                _FIO_ENGINE = engine
                part = job["write" if write else "read"]
                # runtime (ms) covers the I/O; with fsync_on_close the sync is in the job's time too
                seconds = max(part["runtime"], 1) / 1000 if write else part["io_bytes"] / max(part["bw_bytes"], 1)
                FIO_TIMES.append(seconds)
                return seconds
        last = out.stderr.strip() or out.stdout.strip()
    raise RuntimeError(f"fio failed: {last}")


#: One buffer for every warm-up read, allocated once and never freed: ``f.read(16 MiB)``
#: made and freed a 16 MiB object per step, and freeing a block that large raises
#: glibc's mmap threshold, which changes how every peer's arrays are allocated: the
#: harness should not move the allocator it measures (docs/performance.md, "Which loop
#: is the user's").
_WARM_BUFFER = bytearray(16 << 20)


class CacheShort(RuntimeError):
    """A file read whole was not all in the page cache afterwards (memory too short)."""


def _cache_all(paths):
    """Read every file of ``paths`` into the page cache and check with mincore that it is
    (all but 0.1% of its pages: a 4 GiB file once came back 72 pages short), with the
    run's other files dropped from it first.  Why drop them: in the 4 GiB warm row five
    formats' files (20 GiB) and the tensors outgrew the VM's 23 GiB, and the kernel
    reclaimed the file just read (its pages, read once, sit on the inactive list, behind
    the files read twice before): torch's file was left half cached (stop 40).  Then free
    memory is brought to the state --fresh-memory names, as for the cold rows: reading a
    file back into the cache (after a direct read dropped it) takes the memory the tool
    before just freed, which left the next tool memory the host had taken back."""
    own = set(paths)
    pagecache.evict_all([p for p in ALL_FILES if p not in own])
    for path in paths:
        counts = []
        # read again while short: a 504 MiB file once came back 616 pages short with 15 GiB
        # free (cause not found), and a second read, of mostly cached pages, costs little
        for _ in range(3):
            with open(path, "rb", buffering=0) as f:
                while f.readinto(_WARM_BUFFER):
                    pass
            cached, total = pagecache.resident(path)
            counts.append(cached)
            if cached >= total - total // 1000:  # the tolerance pagecache.evict allows the other way
                break
        else:
            raise CacheShort(f"{path}: {', then '.join(map(str, counts))} of {total} pages cached after "
                             f"reading it whole {len(counts)} times")
    fresh_memory_state()


# --- rows ----------------------------------------------------------------------------------
class Cold:
    def __init__(self, table: Table, rounds: int, directory: str):
        self.table, self.rounds, self.dir = table, rounds, directory

    def evicting(self, tools: dict) -> dict:
        """setup per tool: :func:`settle` (every file of the run out of the page cache,
        checked by mincore; free memory in the state --fresh-memory names)."""
        return {name: (lambda paths=paths: settle(paths)) for name, (_, paths) in tools.items()}

    def run(self, title, size, tools, ours, primary, limit=None):
        """Time ``tools`` (name -> (fn, paths)) cold, round-robin; add a row."""
        fns = {name: fn for name, (fn, _) in tools.items()}
        setup = self.evicting(tools)
        if limit is not None:
            fns[limit[0]] = limit[1]
            setup[limit[0]] = limit[2]
        FIO_TIMES.clear()
        try:
            r = interleaved(fns, self.rounds, setup=setup, slow=20.0, slow_rounds=min(2, self.rounds))
        except pagecache.EvictionFailed as exc:
            self.table.skip(title, f"eviction failed, so the samples would not be cold: {exc}")
            return None
        limits = None
        if limit is not None:
            r.pop(limit[0])
            limits = {limit[0]: Samples(FIO_TIMES[1:])}  # fio's own times, less the warm-up
        mine = {k: r.pop(k) for k in list(r) if k.startswith("aprfast") and k != ours}
        prim = {k: r.pop(k) for k in primary if k in r}
        row = Row(title, size, r.pop(ours), prim, {**r}, limits)
        self.table.add(row)
        for name, samples in mine.items():
            self.table.add(Row(f"{title} — {name}", size, samples, prim, r, limits))
        return row

    def run_warm(self, title, size, tools, ours, primary):
        """Time ``tools`` with every file they read in the page cache (read whole, and
        checked by mincore, before each call), independent samples: each result is dropped
        before the next tool runs, so no call reuses what the one before it freed."""
        fns = {name: fn for name, (fn, _) in tools.items()}
        setup = {name: (lambda paths=paths: _cache_all(paths)) for name, (_, paths) in tools.items()}
        try:
            r = interleaved(fns, self.rounds, setup=setup, slow=20.0, slow_rounds=min(2, self.rounds),
                            independent=True)
        except CacheShort as exc:  # a row that cannot be warm is left out, not the whole run
            self.table.skip(title, f"a file would not stay in the page cache, so the samples would not be warm: {exc}")
            return None
        mine = {k: r.pop(k) for k in list(r) if k.startswith("aprfast") and k != ours}
        prim = {k: r.pop(k) for k in primary if k in r}
        row = Row(title, size, r.pop(ours), prim, {**r})
        self.table.add(row)
        for name, samples in mine.items():
            self.table.add(Row(f"{title} — {name}", size, samples, prim, r))
        return row

    def fio_limit(self, path, **kw):
        why = fio_why_missing()
        if why:
            self.table.skip("fio limit rows", why)
            return None
        name = f"fio --direct=1 read, bs 16M, iodepth 16 (ENGINE, {fio_pages()})"
        try:
            fio(path, **kw)  # learns the engine, fails early
            FIO_TIMES.clear()
        except RuntimeError as exc:
            self.table.skip("fio limit rows", str(exc)[:300])
            return None
        return (name.replace("ENGINE", _FIO_ENGINE or "io_uring"), lambda: fio(path, **kw),
                lambda: settle([path]))

    def saves(self, name, tensors, size):
        """Durable saves: time, and the file's pages left cached."""
        # the thread engine of direct writes, forced, beside the default (a ring where
        # there is io_uring): its own row, the A/B behind RING_CHUNK/RING_DEPTH
        threads = "aprfast save_file(backend='direct'), engine threads"
        dest = {"aprfast save_file(backend='direct')": os.path.join(self.dir, "save.direct.apr"),
                threads: os.path.join(self.dir, "save.threads.apr"),
                "aprfast save_file()": os.path.join(self.dir, "save.apr"),
                "safetensors save_file + fsync": os.path.join(self.dir, "save.safetensors")}
        left = {k: Samples() for k in dest}

        def measure_left(key):
            # after the clock stops: mincore of the whole file took 10 ms at 504 MiB and
            # about 80 ms at 4 GiB, which the save rows once charged to the savers (stop 37)
            return lambda: left[key].append(pagecache.resident_bytes(dest[key]))

        fns = {
            "aprfast save_file(backend='direct')":
                lambda: aprfast.save_file(tensors, dest["aprfast save_file(backend='direct')"], backend="direct"),
            threads: _engine("threads", lambda: aprfast.save_file(tensors, dest[threads], backend="direct")),
            "aprfast save_file()": lambda: aprfast.save_file(tensors, dest["aprfast save_file()"]),
            "safetensors save_file + fsync": lambda: (
                st_numpy.save_file(tensors, dest["safetensors save_file + fsync"]),
                fsync_path(dest["safetensors save_file + fsync"])),
        }
        teardown = {k: measure_left(k) for k in dest}
        setup = {k: timing.unlinker(p) for k, p in dest.items()}
        limit = None
        if fio_why_missing() is None:
            nbytes = sum(v.nbytes for v in tensors.values())
            fio_path = os.path.join(self.dir, "fio.write")
            limit = f"fio direct write + fsync ({fio_pages()})"
            fns[limit] = lambda: fio(fio_path, write=True, size=nbytes)
            setup[limit] = timing.unlinker(fio_path)
        FIO_TIMES.clear()
        r = interleaved(fns, self.rounds, setup=setup, teardown=teardown)
        limits = None
        if limit:
            r.pop(limit)
            limits = {limit: Samples(FIO_TIMES[1:])}
        ours = r.pop("aprfast save_file(backend='direct')")
        engine = r.pop(threads)
        prim = {"safetensors save_file + fsync": r.pop("safetensors save_file + fsync")}
        self.table.add(Row(f"{name}: save, durable", size, ours, prim, r, limits))
        self.table.add(Row(f"{name}: save, durable — {threads}", size, engine, prim, r, limits))
        left.pop(threads)
        ours_left = left.pop("aprfast save_file(backend='direct')")
        self.table.add(Row(f"{name}: page cache the durable save leaves (mincore)", size, ours_left,
                           {"safetensors save_file + fsync": left.pop("safetensors save_file + fsync")}, left,
                           unit="B"))
        for p in dest.values():
            timing.unlinker(p)()


def fsync_path(path):
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


# --- fresh-process memory rows ---------------------------------------------------------------
def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return float("nan")


def child(tool, files_json):
    """One cold load in this (fresh) process: prints seconds, VmHWM above the RSS after
    imports, the page cache the file holds afterwards."""
    files = json.loads(files_json)
    global FRESH_MEMORY, FRESH_BYTES, ALL_FILES
    FRESH_MEMORY, _, fresh = os.environ.get(FRESH_ENV, "as-is:0").partition(":")
    FRESH_BYTES = int(fresh or 0)
    ALL_FILES = list(files.values())
    if tool.startswith(POPULATE):  # the fresh-memory limit: no file, no arrays kept
        _, pages, nbytes = tool.split(":")
        settle([])
        seconds = timing.populate(int(nbytes), pages == "huge", timing.usable_cores())
        print(json.dumps({"seconds": seconds, "peak_above": 0, "cached": 0}))
        return
    fn, paths = eager_tools(files)[tool]
    settle(paths)
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    _memory.fresh_population(reset=True)
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    population = _memory.fresh_population()  # what aprfast populated, by page size
    peak = _status("VmHWM") - base
    cached = sum(pagecache.resident_bytes(p) for p in paths)
    del out
    print(json.dumps({"seconds": seconds, "peak_above": peak, "cached": cached, "population": population}))


def _run_child(table, label, tool, files):
    """One load of ``tool`` in a fresh process (``--child``): its JSON report, or None
    (the row is skipped with the child's last error line)."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", tool, json.dumps(files)],
                         capture_output=True, text=True, env={**os.environ, FRESH_ENV: f"{FRESH_MEMORY}:{FRESH_BYTES}"})
    if out.returncode != 0:
        table.skip(label, out.stderr.strip().splitlines()[-1][:200])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def fresh_engine_rows(table, name, files, size, tools, rounds):
    """The engines of direct reads, each cold in ``rounds`` fresh processes (round-robin):
    the load then also populates fresh memory for its arrays, which the loop rows reuse."""
    seconds = {k: Samples() for k in tools}
    for _ in range(rounds):
        for tool in tools:
            got = _run_child(table, f"{name}: fresh-process {tool}", tool, files)
            if got is not None:
                seconds[tool].append(got["seconds"])
    seconds = {k: v for k, v in seconds.items() if v}
    uring = next((k for k in seconds if k.endswith("engine io_uring")), None)
    if uring is not None:  # the threads in the limit column: shown for scale, never a loss
        table.add(Row(f"{name}: cold eager load in a fresh process — {uring}", size, seconds.pop(uring), {}, {},
                      seconds))


#: child() tool names "populate:huge|small:NBYTES": the fresh-memory limit of memory_rows
POPULATE = "populate"


def populate_label(pages: str) -> str:
    return f"fresh memory only ({'huge' if pages == 'huge' else '4 KiB'} pages, {timing.usable_cores()} threads)"


#: the limit that binds a load into fresh memory: per round, the slower of fio and the
#: faster populate (a load pays both, overlapped at best)
BOUND = "the slower of fio and fresh memory, per round"
#: the memory rows' second fio read: 4 MiB blocks (the virtio disk's max_sectors_kb),
#: one in flight, the shape that read the disk fastest on the development VM
SHALLOW_BS, SHALLOW_DEPTH = 4 * MiB, 1


def memory_rows(table, name, files, size, nbytes, rounds, limit=None):
    """Each tool's cold eager load in fresh processes (round-robin, ``rounds`` each): the
    time, the peak RSS and the page cache left; ``limit``: Cold.fio_limit's, run in the
    same loop.  Why the time here too: a fresh process is the cold start users have; in
    a loop in one process a tool's arrays take memory whatever ran before it freed, or
    that its own allocator kept (docs/performance.md, "Fresh memory on a VM that
    reports free pages").  Beside fio, the limit column has the machine's cost of the
    fresh memory itself: a fresh process that populates the model's size (huge pages,
    and 4 KiB pages) with one thread per core, in the same memory state, in the same
    loop.  A load that returns arrays of its own pays both; fio reads into buffers it
    reuses and pays neither."""
    tools = [t for t in eager_tools(files) if ", engine " not in t]  # the engines hold the same memory
    fresh = {pages: Samples() for pages in ("huge", "small")}
    peak = {k: Samples() for k in tools}
    cached = {k: Samples() for k in tools}
    total = {k: Samples() for k in tools}
    seconds = {k: Samples() for k in tools}
    population = {k: [] for k in tools if k.startswith("aprfast")}
    shallow = []
    if limit is not None:
        FIO_TIMES.clear()
    for i in range(rounds):
        for tool in tools[i % len(tools):] + tools[:i % len(tools)]:
            got = _run_child(table, f"{name}: fresh-process memory of {tool}", tool, files)
            if got is None:
                continue
            peak[tool].append(got["peak_above"])
            cached[tool].append(got["cached"])
            total[tool].append(got["peak_above"] + got["cached"])
            seconds[tool].append(got["seconds"])
            if tool in population:
                population[tool].append(got["population"])
        if limit is not None:
            limit[2]()
            limit[1]()
            # the same read in fio's shallow shape: on the development VM's virtio disk
            # it beat the 16M/16 (docs/performance.md, stop 44), so both are shown
            limit[2]()
            try:
                shallow.append(fio(files["apr"], bs=SHALLOW_BS, depth=SHALLOW_DEPTH))
                FIO_TIMES.pop()
            except RuntimeError as exc:
                table.skip("fio shallow limit row", str(exc)[:300])
        for pages in list(fresh)[i % 2:] + list(fresh)[:i % 2]:
            got = _run_child(table, f"{name}: {populate_label(pages)}", f"{POPULATE}:{pages}:{nbytes}", files)
            if got is not None:
                fresh[pages].append(got["seconds"])
    ours = "aprfast.load_file(backend='direct')"
    times = {k: v for k, v in seconds.items() if v}
    if ours in times:
        limits = {limit[0]: Samples(FIO_TIMES)} if limit is not None and FIO_TIMES else {}
        if shallow:
            limits[f"fio --direct=1 read, bs {SHALLOW_BS // MiB}M, iodepth {SHALLOW_DEPTH} "
                   f"({_FIO_ENGINE}, {fio_pages()})"] = Samples(shallow)
        limits.update({populate_label(pages): samples for pages, samples in fresh.items() if samples})
        if limits and all(len(v) == rounds for v in (*fresh.values(), FIO_TIMES)):
            limits[BOUND] = Samples(max(f, min(a, b)) for f, a, b in zip(FIO_TIMES, *fresh.values()))
        mine = {k: times.pop(k) for k in list(times) if k.startswith("aprfast") and k != ours}
        prim = {k: times.pop(k) for k in list(times) if k.startswith("safetensors")}
        title = f"{name}: cold eager load in a fresh process (--fresh-memory {FRESH_MEMORY})"
        table.add(Row(title, size, times.pop(ours), prim, times, limits))
        for label, samples in mine.items():
            table.add(Row(f"{title} — {label}", size, samples, prim, times, limits))
    for label, data in (("peak RSS above its imports", peak), ("page cache left (mincore)", cached),
                        ("peak RSS + page cache left", total)):
        data = {k: v for k, v in data.items() if v}
        if ours not in data:
            continue
        prim = {k: data.pop(k) for k in list(data) if k.startswith("safetensors")}
        table.add(Row(f"{name}: cold eager load in a fresh process, {label}", size, data.pop(ours), prim, data,
                      unit="B"))
    for tool, counts in population.items():
        if counts and any(c["huge_bytes"] or c["small_bytes"] for c in counts):
            mib = {k: ", ".join(f"{c[k] / MiB:.0f}" for c in counts) for k in ("huge_bytes", "small_bytes")}
            sec = {k: ", ".join(f"{c[k]:.2f}" for c in counts) for k in ("huge_seconds", "small_seconds")}
            table.notes.append(
                f"{name}: {tool} (--fresh-memory {FRESH_MEMORY}) populated its arrays, per round: in huge pages "
                f"{mib['huge_bytes']} MiB taking {sec['huge_seconds']} s of thread time; in 4 KiB pages "
                f"{mib['small_bytes']} MiB taking {sec['small_seconds']} s.")
    if total.get(ours):
        target = 1.05 * nbytes + 64 * MiB
        table.notes.append(f"{name}: aprfast backend='direct' peak RSS + page cache left: median "
                           f"{total[ours].median / MiB:.0f} MiB against the target of 1.05x the model + 64 MiB = "
                           f"{target / MiB:.0f} MiB ({'met' if total[ours].median <= target else 'NOT met'}).")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1/8 sizes, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-rounds", type=int, default=2, help="fresh processes per tool (memory rows)")
    parser.add_argument("--huge", action="store_true", help="also the 4 GiB model (eager, memory and save rows)")
    parser.add_argument("--only", default="eager,warm,memory,one,slice,save",
                        help="comma list of row groups: eager, memory, one, slice, save; warm: the eager row's "
                             "tools with the files in the page cache (independent samples); engines (not by "
                             "default: the eager rows hold it): aprfast's two engines of direct reads and fio "
                             "alone, without the peers, so many rounds fit in a short run")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp dir on the disk "
                        "holding the temp dir; must not be tmpfs for cold rows to mean anything)")
    parser.add_argument("--fio-mem", choices=("auto", "malloc", "shmhuge"), default="auto",
                        help="fio's I/O buffers: 4 KiB pages (malloc, fio's default) or hugetlb pages (shmhuge; "
                             "needs free ones: sysctl vm.nr_hugepages=136). auto: hugetlb pages where enough are free")
    parser.add_argument("--fresh-memory", choices=("as-is", "warm", "cold"), default="as-is",
                        help="the state of the memory each sample populates (see the module docstring)")
    parser.add_argument("--md-out", default=None)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    why = pagecache.supported()
    if why:
        sys.exit(f"cold-cache rows need page-cache eviction: {why}")
    scale = 0.125 if args.quick else 1.0
    rounds = 3 if args.quick else args.rounds
    only = set(args.only.split(","))
    peers = (("safetensors", safetensors), ("torch", torch), ("tensorizer", tensorizer),
             ("runai-model-streamer", runai), ("fastsafetensors", fastsafetensors), ("gguf", gguf))
    versions = ", ".join(f"{pkg} {timing.version(pkg) if mod is not None else 'absent'}" for pkg, mod in peers)
    versions += f", fio {_fio_version()}"
    table = Table("Cold cache: aprfast vs the loaders picked for cold starts (page cache evicted before every "
                  "sample; the warm rows read the file into it instead)", "safetensors (best API)", versions=versions)
    for label, why in (("torch", TORCH_WHY), ("tensorizer", TENSORIZER_WHY), ("Run:ai model streamer", RUNAI_WHY),
                       ("fastsafetensors", FASTST_WHY), ("gguf-py", GGUF_WHY)):
        if why:
            table.skip(label, why)
    global FIO_MEM, FRESH_MEMORY, FRESH_BYTES
    FIO_MEM = fio_memory(args.fio_mem)
    FRESH_MEMORY = args.fresh_memory
    order = timing.page_reporting_order()
    reporting = None if order is None else f"free blocks of {(4 << order) // 1024} MiB" if order >= 8 else \
        f"free blocks of {4 << order} KiB"
    table.notes.append(
        f"Fresh memory: {FRESH_MEMORY} (--fresh-memory). Free page reporting to the host: "
        + (f"on ({reporting} free for about 2 s go back to the host, and populating them again is slow)"
           if reporting else "off") + ".")
    table.notes.append(f"fio reads and writes from {fio_pages()} (--iomem={FIO_MEM}). A direct request holds at "
                       "most max_segments of the buffer's pages, so from 4 KiB pages a virtio disk gets requests "
                       "under 1 MiB and fio's row can understate the device; with hugetlb pages free "
                       "(sysctl vm.nr_hugepages=136, as root) --fio-mem auto takes them (docs/performance.md, "
                       "\"Huge pages and direct reads\").")
    table.notes.append("fastsafetensors runs here without a GPU (nogds=True, device='cpu'): its tensors view its "
                       "own buffer and are cloned. Run:ai's streamer reuses its buffer between files, so its "
                       "tensors are cloned too. safetensors' torch views are not in the eager rows: they read "
                       "nothing until touched.")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        kind = _fs_type(directory)
        table.notes.append(f"files on {kind} ({directory}); the machine's load is printed above.")
        cold = Cold(table, rounds, directory)
        models = [("large", large_model(scale))]
        if args.huge:
            models.append(("huge", None))
        for name, tensors in models:
            if tensors is None:
                tensors = huge_model(scale)
            nbytes = sum(v.nbytes for v in tensors.values())
            FRESH_BYTES = nbytes + 512 * MiB
            size = f"{nbytes / MiB:.0f} MiB"
            print(f"--- {name}: {len(tensors)} tensors, {size}", flush=True)
            files = prepare(directory, name, tensors, peers=bool(only - {"engines"}))
            ALL_FILES[:] = files.values()
            if "eager" in only:
                limit = cold.fio_limit(files["apr"])
                cold.run(f"{name}: cold eager load, owned arrays", size, eager_tools(files),
                         "aprfast.load_file(backend='direct')",
                         ["safetensors.numpy.load_file", "safetensors.numpy.load_file(backend='pread')"], limit)
            if "warm" in only:
                cold.run_warm(f"{name}: warm eager load (file in the page cache), owned arrays", size,
                              eager_tools(files), "aprfast.load_file(mmap=False) (auto)",
                              ["safetensors.numpy.load_file", "safetensors.numpy.load_file(backend='pread')"])
            if "engines" in only:
                limit = cold.fio_limit(files["apr"])
                ours = "aprfast.load_file(backend='direct')"
                tools = {k: v for k, v in eager_tools(files).items() if k.startswith(ours)}
                cold.run(f"{name}: cold eager load, direct engines", size, tools,
                         "aprfast.load_file(backend='direct')", [], limit)
                fresh_engine_rows(table, name, files, size, [k for k in tools if ", engine " in k], args.memory_rounds)
            if "memory" in only:
                memory_rows(table, name, files, size, nbytes, args.memory_rounds, cold.fio_limit(files["apr"]))
            if "one" in only and name == "large":
                one = next(iter(tensors))
                cold.run(f"{name}: cold lazy open + one tensor (copied)", f"{tensors[one].nbytes / MiB:.1f} MiB",
                         one_tensor_tools(files, one), "aprfast.open(backend='direct') + get_tensor",
                         ["safe_open(np) get_tensor"])
            if "save" in only:
                cold.saves(name, tensors, size)
            ALL_FILES.clear()
            for p in files.values():
                os.unlink(p)
            del tensors
            gc.collect()
        if "slice" in only:
            tensors = slice_model(scale)
            big = tensors["big"]
            rows = big.shape[0] // 8
            files = prepare(directory, "slice", tensors)
            ALL_FILES[:] = files.values()
            with aprfast.open(files["apr"]) as f:
                offset = f.info("big").offset
            start = offset // 4096 * 4096  # direct I/O reads whole aligned blocks
            stop = -(-(offset + rows * big.shape[1] * 4) // 4096) * 4096
            limit = cold.fio_limit(files["apr"], offset=start, size=stop - start)
            cold.run(f"slice: cold get_slice of 1/8 of the rows of a {big.nbytes / MiB:.0f} MiB tensor",
                     f"{rows * big.shape[1] * 4 / MiB:.0f} MiB", slice_tools(files, rows),
                     "aprfast.open(backend='direct') + get_slice", ["safe_open(np) get_slice"], limit)
    table.notes.append("Rows named 'aprfast ... — X' repeat the row for aprfast's other back ends against the same "
                       "peers. The memory rows are fresh processes (benchmarks/bench_cold.py --child).")
    table.finish(args.md_out)


def _fio_version():
    if shutil.which("fio") is None:
        return "absent"
    out = subprocess.run(["fio", "--version"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def _fs_type(path):
    from aprfast.io.direct import filesystem_type

    return filesystem_type(path) or "an unknown filesystem"


if __name__ == "__main__":
    main()
