"""Many small tensors: eager loads of a model of 10,000 or 20,000 tensors against one
``readinto`` of the same bytes, and batched reads of 1,000 of them.

    python benchmarks/bench_small_tensors.py            # 7 rounds
    python benchmarks/bench_small_tensors.py --rounds 3 --md-out F.md

Models: "tiny" 10,000 float32 tensors of 256 (1 KiB each; bench_containers' "tiny");
"moe" 20,016 tensors shaped like a mixture of experts: 26 layers x 256 experts x
(gate, up, down) float16 projections of 16 KiB, plus per layer an attention block and
norms (about 316 MiB).  The file is in the page cache (a reload loop).

Rows (aprfast | safetensors | limit):

* eager load into owned arrays: ``aprfast.load_file(mmap=False)`` (CRC checked) |
  ``safetensors.numpy.load_file`` | one ``readinto`` of the file's bytes into fresh
  memory (huge pages advised, and 4 KiB pages; the lower is shown).  The issue's target
  is at least 0.5x the limit.
* eager load into read-only views of the map (``aprfast.load_file``'s default, every
  view built in one pass) | ``safe_open(p, "np")`` + ``get_tensor`` for every name
  (safetensors' NumPy back end gives copies: no views to compare with).
* 1,000 tensors spread over the file, owned: ``open(p, mode="pread").get_tensors(names)``
  | ``safe_open(p, "np")`` + ``get_tensor`` per name | per-name
  ``open(p, mode="pread").get_tensor``.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import tempfile

import numpy as np
import timing
from timing import Row, Table, interleaved, read_into

import aprfast

try:
    import safetensors.numpy as st_numpy
    from safetensors import safe_open
except ImportError:  # pragma: no cover
    sys.exit("the benchmarks compare against safetensors: pip install .[bench]")

MiB = 1 << 20


def tiny() -> dict:
    rng = np.random.default_rng(0)
    return {f"t.{i:05d}": rng.standard_normal(256, dtype=np.float32) for i in range(10_000)}


def moe() -> dict:
    rng = np.random.default_rng(1)
    block = rng.standard_normal(1 << 20).astype(np.float16)  # values reused: building is the slow part
    out, at = {}, 0

    def take(shape, dtype=np.float16):
        nonlocal at
        n = int(np.prod(shape))
        if at + n > block.size:
            at = 0
        value = block[at:at + n].astype(dtype).reshape(shape)
        at += n
        return value

    for layer in range(26):
        p = f"model.layers.{layer:02d}"
        for e in range(256):
            out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = take((64, 128))
            out[f"{p}.mlp.experts.{e}.up_proj.weight"] = take((64, 128))
            out[f"{p}.mlp.experts.{e}.down_proj.weight"] = take((128, 64))
        out[f"{p}.mlp.gate.weight"] = take((256, 128))
        for proj in ("q", "k", "v", "o"):
            out[f"{p}.self_attn.{proj}_proj.weight"] = take((128, 128))
        out[f"{p}.input_layernorm.weight"] = take((128,), np.float32)
        out[f"{p}.post_attention_layernorm.weight"] = take((128,), np.float32)
    out["model.norm.weight"] = take((128,), np.float32)
    out["model.embed_tokens.weight"] = take((4096, 128))
    return out


def fresh(nbytes, huge=True):
    buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        buf.madvise(advice)
    return buf


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="tiny,moe")
    parser.add_argument("--md-out", default=None)
    args = parser.parse_args()
    table = Table("Many small tensors: eager loads against one readinto of the same bytes (page cache warm)",
                  "safetensors", versions=f"safetensors {timing.version('safetensors')}")
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models.split(","):
            tensors = {"tiny": tiny, "moe": moe}[name]()
            apr, st = os.path.join(directory, f"{name}.apr"), os.path.join(directory, f"{name}.safetensors")
            aprfast.save_file(tensors, apr, durable=False)
            st_numpy.save_file(tensors, st)
            size = os.path.getsize(apr)
            label = f"{len(tensors):,} tensors, {size / MiB:.1f} MiB"
            print(f"--- {name}: {label}", flush=True)

            def floor(huge=True, path=apr, n=size):
                buf = fresh(n, huge)
                read_into(path, buf)
                return buf

            r = interleaved({"aprfast": lambda: aprfast.load_file(apr, mmap=False),
                             "safetensors.numpy.load_file": lambda: st_numpy.load_file(st),
                             "readinto, huge pages": floor,
                             "readinto, 4 KiB pages": lambda: floor(False)}, args.rounds, min_sample=0.05)
            limits = {k: r.pop(k) for k in ("readinto, huge pages", "readinto, 4 KiB pages")}
            best = min(limits.values(), key=lambda v: v.median)
            ours = r.pop("aprfast")
            table.add(Row(f"{name}: eager load, owned arrays", label, ours, r, None, limits))
            table.notes.append(f"{name}: aprfast eager load at {best.median / ours.median:.2f}x the lower readinto "
                               "floor (target: at least 0.5x).")

            def st_every():
                with safe_open(st, "np") as f:
                    return {n: f.get_tensor(n) for n in f.keys()}

            r = interleaved({"aprfast": lambda: aprfast.load_file(apr),
                             "safe_open(np) get_tensor every name": st_every}, args.rounds, min_sample=0.05)
            table.add(Row(f"{name}: eager load, views of the map", label, r.pop("aprfast"), r))

            names = list(tensors)[::max(1, len(tensors) // 1000)][:1000]

            def st_each():
                with safe_open(st, "np") as f:
                    return {n: f.get_tensor(n) for n in names}

            def apr_each():
                with aprfast.open(apr, mode="pread") as f:
                    return {n: f.get_tensor(n) for n in names}

            def apr_batch():
                with aprfast.open(apr, mode="pread") as f:
                    return f.get_tensors(names)

            r = interleaved({"aprfast": apr_batch, "safe_open(np) get_tensor per name": st_each,
                             "aprfast get_tensor per name": apr_each}, args.rounds, min_sample=0.05)
            table.add(Row(f"{name}: {len(names)} tensors spread over the file, owned", label, r.pop("aprfast"),
                          {"safe_open(np) get_tensor per name": r.pop("safe_open(np) get_tensor per name")}, r))
            os.unlink(apr)
            os.unlink(st)
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
