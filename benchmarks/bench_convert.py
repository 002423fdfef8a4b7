"""aprfast.convert beside doing the same job by hand with each format's own library.

    python benchmarks/bench_convert.py            # a 512 MiB model, 5 rounds
    python benchmarks/bench_convert.py --quick    # 32 MiB, 3 rounds
    python benchmarks/bench_convert.py --quick --sharded-gib 2   # and a 2 GiB sharded checkpoint
    python benchmarks/bench_convert.py --mixed-only   # only the mixed K/IQ GGUF rows

Rows (issue #12's targets):

* safetensors -> .apr: ``aprfast.convert`` against ``safetensors.numpy.load_file`` +
  ``aprfast.save_file`` (the whole model in memory), both without fsync.
* GGUF -> .apr, .apr -> GGUF and both in a row, each against ``GGUFReader`` +
  ``GGUFWriter`` copying the same file once (GGUF -> GGUF: one read, one write, so the
  round trip, which writes the model twice, starts at a 2x handicap); the model half
  float32, half Q8_0 blocks.
* GGUF -> .apr of a GGUF of mixed K and IQ types (Q2_K, Q3_K, Q5_K, IQ1_S, IQ2_XXS, IQ2_XS,
  IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0) against the same call on a Q4_K_M-like
  GGUF (Q4_K, attn_v/ffn_down-style tensors Q6_K) of the same byte size (issue #27's
  target: the same speed), without validation and with convert's default validation
  (its tensors are named ``blk.N.weight``, which no §10.9 rule names, so only NaN/Inf
  could fail them and ``aprfast.stats.known_finite`` rules those out from the blocks'
  float16 scales without decoding them); half the model's size in quantized bytes.  The types
  aprfast quantizes hold aprfast.quantize's blocks of random normal values, the others
  random bytes under a valid f16 scale of 0.01.
* peak RSS above the imports, in a fresh process per sample, for the first row's tools
  (the streaming converter, validating as by default, should stay near the largest
  tensor, 1/16 of the model; issue #12's bound: the largest tensor plus 64 MiB).
* ``--sharded-gib N`` (2 in the full run): a TinyLlama-like float16 checkpoint of N GiB in
  four ``model-0000K-of-00004.safetensors`` shards with ``model.safetensors.index.json``,
  converted to .apr (validation on) in a fresh process: its whole peak RSS, interpreter
  and imports included (issue #12's bound: 256 MiB), and its time.

Every destination is removed before each call (setup, untimed); outputs are checked
once against the source before timing, and the inputs written back to disk (``os.sync``)
before the first timed row.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import gguf
import numpy as np
import safetensors.numpy as sn
import timing
from timing import Row, Samples, Table, interleaved

import aprfast
from aprfast.dtypes import by_name
from aprfast.numerics.quantization import quant_type

MiB = 1 << 20
N_TENSORS = 16


def make_safetensors(path, total):
    rows = total // N_TENSORS // (4 * 1024)
    rng = np.random.default_rng(0)
    tensors = {f"layers.{i}.weight": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(N_TENSORS)}
    sn.save_file(tensors, path)
    return tensors


def make_gguf(path, total):
    """Half the tensors float32, half Q8_0 blocks (rows of 1024 values)."""
    rows = total // N_TENSORS // (4 * 1024)
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("bench")
    for i in range(N_TENSORS):
        values = rng.standard_normal((rows, 1024), dtype=np.float32)
        if i % 2:
            w.add_tensor(f"blk.{i}.weight", gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(f"blk.{i}.weight", values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


#: The mixed GGUF's types (a tensor each, cycled) and the Q4_K_M one's.
MIXED_TYPES = ("Q2_K", "Q3_K", "Q5_K", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
               "TQ1_0")
Q4_K_M_TYPES = ("Q4_K", "Q4_K", "Q4_K", "Q6_K")


def make_quantized_gguf(path, nbytes, types):
    """A GGUF of N_TENSORS tensors of rows of 1024 values, tensor i of ``types[i % len]``,
    each about ``nbytes / N_TENSORS`` bytes: blocks aprfast.quantize makes of random
    normal values, or (for the types it cannot quantize) random bytes whose f16 scale
    at byte 0 of each block is 0.01."""
    rng = np.random.default_rng(2)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("bench")
    for i in range(N_TENSORS):
        name = types[i % len(types)]
        elems, block_bytes = by_name(name).block_elems, by_name(name).block_bytes
        row_bytes = 1024 // elems * block_bytes
        rows = max(1, nbytes // N_TENSORS // row_bytes)
        if quant_type(name).can_quantize:
            raw = np.asarray(aprfast.quantize(rng.standard_normal((rows, 1024), dtype=np.float32), name).data)
            raw = raw.reshape(rows, row_bytes)
        else:
            raw = rng.integers(0, 256, (rows * 1024 // elems, block_bytes), dtype=np.uint8)
            raw[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
            raw = raw.reshape(rows, row_bytes)
        w.add_tensor(f"blk.{i}.weight", raw, raw_dtype=getattr(gguf.GGMLQuantizationType, name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mixed_rows(table, d, total, rounds):
    """GGUF -> .apr of mixed K/IQ types vs the same call on a Q4_K_M-like GGUF of the same size."""
    make_quantized_gguf(f"{d}/mixed.gguf", total // 2, MIXED_TYPES)
    make_quantized_gguf(f"{d}/q4km.gguf", total // 2, Q4_K_M_TYPES)
    aprfast.convert(f"{d}/mixed.gguf", f"{d}/mx.apr", durable=False, validate="off")
    with aprfast.open(f"{d}/mx.apr") as f:  # every type there, every block decodes to finite values
        assert sorted({f.info(n).dtype_name for n in f.keys()}) == sorted(MIXED_TYPES)
        for name in f.keys():
            assert np.isfinite(f.get_tensor(name, dequantize=True)).all(), name
    if hasattr(os, "sync"):
        os.sync()
    mixed_size, q4_size = os.path.getsize(f"{d}/mixed.gguf"), os.path.getsize(f"{d}/q4km.gguf")
    same = "the same call on a Q4_K_M GGUF of this size"
    by_hand = "GGUFReader + GGUFWriter (one GGUF -> GGUF copy)"
    for label, validate in (("off", "off"), ("strict", "strict")):
        mx = interleaved({"mixed": lambda v=validate: aprfast.convert(f"{d}/mixed.gguf", f"{d}/mx.apr", durable=False,
                                                                      validate=v),
                          same: lambda v=validate: aprfast.convert(f"{d}/q4km.gguf", f"{d}/q4.apr", durable=False,
                                                                   validate=v),
                          by_hand: lambda: gguf_by_hand(f"{d}/mixed.gguf", f"{d}/mh.gguf")},
                         rounds, setup=remover(f"{d}/mx.apr", f"{d}/q4.apr", f"{d}/mh.gguf"))
        table.add(Row(f"GGUF of mixed K/IQ types -> .apr, validate=\"{label}\"", timing.fmt_bytes(mixed_size),
                      mx["mixed"], {by_hand: mx[by_hand]}, {same: mx[same]}))
    values = {}
    for which in ("mixed", "q4km"):
        reader = gguf.GGUFReader(f"{d}/{which}.gguf")
        values[which] = sum(int(t.n_elements) for t in reader.tensors)
        del reader
    table.notes.append(f"mixed K/IQ GGUF: {', '.join(MIXED_TYPES)}, {N_TENSORS} tensors cycling through them, "
                       f"{timing.fmt_bytes(mixed_size)}, {values['mixed'] / 1e6:.0f} M values; the Q4_K_M-like "
                       f"GGUF (Q4_K, every fourth tensor Q6_K) {timing.fmt_bytes(q4_size)}, "
                       f"{values['q4km'] / 1e6:.0f} M values (validate=\"strict\": no rule names blk.N.weight, and "
                       f"every block's float16 scales are finite, so no value is decoded; a tensor a rule "
                       f"names, or one with a NaN/Inf scale, would be decoded and measured value by value)")
    remover(f"{d}/mixed.gguf", f"{d}/q4km.gguf")()


def gguf_by_hand(src, dst):
    """GGUFReader + GGUFWriter: every key (but the ones the writer adds itself) and tensor copied."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, field.contents(), field.types[0],
                        sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in r.tensors:
        raw = t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


HIDDEN = 2048


def make_sharded(directory, total, n_shards=4):
    """A sharded checkpoint of about ``total`` bytes, written a 1 MiB piece at a time
    (never a shard in memory): a 32000 x 2048 embedding (125 MiB, the largest tensor),
    8192 x 2048 MLP weights (32 MiB) and a final norm, float16.  Returns the largest
    tensor's size."""
    os.makedirs(directory, exist_ok=True)
    specs = [("model.embed_tokens.weight", (32000, HIDDEN))]
    size, i = 32000 * HIDDEN * 2, 0
    while size + 8192 * HIDDEN * 2 <= total:
        specs.append((f"model.layers.{i // 2}.mlp.{'up' if i % 2 == 0 else 'down'}_proj.weight", (8192, HIDDEN)))
        size += 8192 * HIDDEN * 2
        i += 1
    specs.append(("model.norm.weight", (HIDDEN,)))
    per = -(-len(specs) // n_shards)
    groups = [specs[k:k + per] for k in range(0, len(specs), per)]
    piece = (np.random.default_rng(2).standard_normal(MiB // 2, dtype=np.float32) * 0.02).astype(np.float16)
    piece = piece.view(np.uint8)
    weight_map, written = {}, 0
    for k, group in enumerate(groups):
        name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tensor, shape in group:
            n = int(np.prod(shape)) * 2
            header[tensor] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[tensor] = name
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for tensor, shape in group:
                n = int(np.prod(shape)) * 2
                if tensor.endswith("norm.weight"):
                    f.write(np.ones(shape, np.float16).tobytes())
                    continue
                for start in range(0, n, MiB):
                    f.write(piece[:min(MiB, n - start)])
        written += offset
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": written}, "weight_map": weight_map}, f, indent=2)
    return max(int(np.prod(shape)) * 2 for _, shape in specs)


def remover(*paths):
    def setup():
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
    return setup


def check_outputs(d, tensors):
    aprfast.convert(f"{d}/m.safetensors", f"{d}/c.apr", durable=False)
    got = aprfast.load_file(f"{d}/c.apr")
    assert all(got[k].tobytes() == v.tobytes() for k, v in tensors.items()), "convert changed a tensor"
    aprfast.convert(f"{d}/m.gguf", f"{d}/c.apr2", to="apr", durable=False)
    aprfast.convert(f"{d}/c.apr2", f"{d}/c.gguf", durable=False)
    a, b = gguf.GGUFReader(f"{d}/m.gguf"), gguf.GGUFReader(f"{d}/c.gguf")
    assert [(t.name, t.data.tobytes()) for t in a.tensors] == [(t.name, t.data.tobytes()) for t in b.tensors]
    remover(f"{d}/c.apr", f"{d}/c.apr2", f"{d}/c.gguf")()


# The peak is reset after the imports ("5" > clear_refs resets VmHWM to VmRSS), so the
# import-time peak cannot hide the conversion's; the result is VmHWM minus that VmRSS.
_RSS_CHILD = """
import sys, aprfast
import safetensors.numpy as sn
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
if sys.argv[1] == "convert":
    aprfast.convert(sys.argv[2], sys.argv[3], durable=False)
else:
    aprfast.save_file(sn.load_file(sys.argv[2]), sys.argv[3], durable=False)
print(status("VmHWM:") - before)
"""


def peak_rss(tool, src, dst, rounds):
    samples = Samples()
    for _ in range(rounds):
        remover(dst)()
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, tool, src, dst], capture_output=True, text=True,
                             check=True)
        samples.append(int(out.stdout.strip()) * 1024)
    remover(dst)()
    return samples


# The whole peak (VmHWM, kB), interpreter and imports included, and the conversion's time.
_SHARDED_CHILD = """
import sys, time, aprfast
start = time.perf_counter()
aprfast.convert(sys.argv[1], sys.argv[2], durable=False)
elapsed = time.perf_counter() - start
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")), elapsed)
"""


def sharded_rows(table, d, gib, rounds):
    ckpt = f"{d}/ckpt"
    largest = make_sharded(ckpt, int(gib * 1024) * MiB)
    size = timing.fmt_bytes(sum(os.path.getsize(os.path.join(ckpt, n)) for n in os.listdir(ckpt)))
    peaks, times = Samples(), Samples()
    for _ in range(rounds):
        remover(f"{d}/sharded.apr")()
        out = subprocess.run([sys.executable, "-c", _SHARDED_CHILD, ckpt, f"{d}/sharded.apr"], capture_output=True,
                             text=True, check=True)
        kib, seconds = out.stdout.split()
        peaks.append(int(kib) * 1024)
        times.append(float(seconds))
    remover(f"{d}/sharded.apr")()
    table.add(Row(f"sharded safetensors ({gib:g} GiB, 4 shards) -> .apr, validated, fresh process", size, times))
    table.add(Row(f"sharded safetensors ({gib:g} GiB) -> .apr, whole peak RSS (imports included; bound 256 MiB)",
                  size, peaks, unit="MiB",
                  note="✅ under 256 MiB" if peaks.hi < 256 * MiB else "❌ over 256 MiB"))
    table.notes.append(f"sharded checkpoint: largest tensor {timing.fmt_bytes(largest)} (a 32000 x 2048 float16 "
                       "embedding), 32 MiB MLP weights")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 MiB, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--sharded-gib", type=float, default=None,
                        help="size of the sharded-checkpoint row in GiB (default: 2, or 0 = none with --quick)")
    parser.add_argument("--mixed-only", action="store_true", help="only the mixed K/IQ GGUF -> .apr rows")
    args = parser.parse_args()
    sharded_gib = args.sharded_gib if args.sharded_gib is not None else (0 if args.quick else 2)
    total = (32 if args.quick else 512) * MiB
    rounds = 3 if args.quick else args.rounds
    versions = f"safetensors {timing.version('safetensors')}, gguf {timing.version('gguf')}"
    table = Table("Conversions: aprfast.convert vs each format's library by hand", "by hand", versions=versions)
    if args.mixed_only:
        with tempfile.TemporaryDirectory(dir=os.environ.get("APRFAST_BENCH_DIR")) as d:
            mixed_rows(table, d, total, rounds)
        table.finish(args.md_out)
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get("APRFAST_BENCH_DIR")) as d:
        tensors = make_safetensors(f"{d}/m.safetensors", total)
        make_gguf(f"{d}/m.gguf", total)
        check_outputs(d, tensors)
        del tensors
        if hasattr(os, "sync"):
            os.sync()  # the inputs just written go to disk now, not during the timed rows
        size = timing.fmt_bytes(os.path.getsize(f"{d}/m.safetensors"))
        # Like for like: the by-hand peers check nothing, so the main rows convert with
        # validate="off"; one row adds convert's default (strict §10.9 statistics per tensor).
        st = interleaved({
            "aprfast.convert": lambda: aprfast.convert(f"{d}/m.safetensors", f"{d}/a.apr", durable=False,
                                                       validate="off"),
            "validated": lambda: aprfast.convert(f"{d}/m.safetensors", f"{d}/v.apr", durable=False),
            "load_file + save_file": lambda: aprfast.save_file(sn.load_file(f"{d}/m.safetensors"), f"{d}/b.apr",
                                                               durable=False),
        }, rounds, setup=remover(f"{d}/a.apr", f"{d}/b.apr", f"{d}/v.apr"))
        table.add(Row("safetensors -> .apr", size, st["aprfast.convert"],
                      {"load_file + save_file": st["load_file + save_file"]}))
        table.add(Row("safetensors -> .apr, validate=\"strict\" (the default: statistics of every tensor)", size,
                      st["validated"], {"load_file + save_file": st["load_file + save_file"]}))

        def apr_round_trip():
            aprfast.convert(f"{d}/m.gguf", f"{d}/g.apr", durable=False, validate="off")
            aprfast.convert(f"{d}/g.apr", f"{d}/g.gguf", durable=False, validate="off")

        gsize = timing.fmt_bytes(os.path.getsize(f"{d}/m.gguf"))
        by_hand = "GGUFReader + GGUFWriter (one GGUF -> GGUF copy)"
        # the source of the .apr -> GGUF row
        aprfast.convert(f"{d}/m.gguf", f"{d}/keep.apr", durable=False, validate="off")
        gg = interleaved({"to_apr": lambda: aprfast.convert(f"{d}/m.gguf", f"{d}/g1.apr", durable=False,
                                                             validate="off"),
                          "to_gguf": lambda: aprfast.convert(f"{d}/keep.apr", f"{d}/g1.gguf", durable=False,
                                                            validate="off"),
                          "both": apr_round_trip,
                          by_hand: lambda: gguf_by_hand(f"{d}/m.gguf", f"{d}/h.gguf")},
                         rounds, setup=remover(f"{d}/g.apr", f"{d}/g.gguf", f"{d}/g1.apr", f"{d}/g1.gguf",
                                               f"{d}/h.gguf"))
        table.add(Row("GGUF -> .apr", gsize, gg["to_apr"], {by_hand: gg[by_hand]}))
        table.add(Row(".apr -> GGUF", gsize, gg["to_gguf"], {by_hand: gg[by_hand]}))
        table.add(Row("GGUF -> .apr -> GGUF (two conversions, two full writes)", gsize, gg["both"],
                      {by_hand: gg[by_hand]}))

        mixed_rows(table, d, total, rounds)

        peaks = peak_rss("convert", f"{d}/m.safetensors", f"{d}/r.apr", rounds)
        bound = total // N_TENSORS + 64 * MiB  # issue #12: the largest tensor plus 64 MiB
        table.add(Row("safetensors -> .apr, validated, fresh process, peak RSS above imports", size, peaks,
                      {"load_file + save_file": peak_rss("by_hand", f"{d}/m.safetensors", f"{d}/r.apr", rounds)},
                      unit="MiB", note=f"{'✅ under' if peaks.hi < bound else '❌ over'} largest tensor + 64 MiB "
                                       f"({timing.fmt_bytes(bound)})"))
        table.notes.append(f"largest tensor: {timing.fmt_bytes(total // N_TENSORS)} (the model is {N_TENSORS} "
                           "equal tensors); files in a temporary directory (APRFAST_BENCH_DIR to choose one)")
        if sharded_gib:
            sharded_rows(table, d, sharded_gib, rounds)
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
