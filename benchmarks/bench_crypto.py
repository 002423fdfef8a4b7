"""aprfast's v1 (APRN) loads and aprfast.crypto beside the raw primitives they are built on.

    python benchmarks/bench_crypto.py           # 256 MiB payload, 5 rounds
    python benchmarks/bench_crypto.py --quick   # 32 MiB, 3 rounds

No other tool reads aprender's v1 container, so every row is aprfast against a *limit*:
the same work done with the raw primitives and no format around it.

* password-encrypted ``v1.load_model`` (magic, CRC32 of the file, header, Argon2id,
  AES-256-GCM, an owned plaintext) | one Argon2id with aprfast's parameters (argon2-cffi
  ``hash_secret_raw``, m=19456 KiB, t=2, p=1) plus AES-256-GCM decryption of the same
  plaintext size in 1 MiB chunks with cryptography's ``AESGCM.decrypt_into`` into one
  preallocated buffer, from a memory map; and the same Argon2id plus one libsodium
  decryption of the file's own ciphertext.
* ``crypto.decrypt_with_password`` of a mapped blob against the same limits.
* plain / zstd / LZ4 ``v1.load_model`` (CRC32 of the file, header, payload to an owned
  buffer) | ``open().read()`` of the file, plus ``zstandard`` / ``lz4.block`` decompression
  of its payload for the compressed ones.
* ``crypto.verify`` (Ed25519) of a mapped file in 3 memoryview parts | one
  ``hashlib.sha512`` pass over the same bytes.
* peak RSS above the process while each decrypting load runs, in fresh processes.
* APR2 (aprfast.security, docs/FORMAT.md §3.2): open a signed file of 2 MiB tensors and
  read one tensor | ``hashlib.sha256`` of that tensor's 2 MiB (the target: under 5 ms
  plus that hashing); the eager ``load_file(mmap=False)`` of an encrypted file (X25519
  recipient, and password with its Argon2id) | ``open().read()`` of the file, in GB/s.

    python benchmarks/bench_crypto.py --only apr2 --size-mib 64   # just those rows
    python benchmarks/bench_crypto.py --only v1-save,v1-load --size-mib 64 --rounds 7
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import subprocess
import sys
import tempfile

import numpy as np
import timing
from timing import Row, Samples, Table, interleaved, unlinker

from aprfast import v1
from aprfast.crypto import core as crypto

try:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    CRYPTOGRAPHY_WHY = None
except ImportError as exc:
    AESGCM = None
    CRYPTOGRAPHY_WHY = (f"not installed ({exc.name}): the 1 MiB-chunk AESGCM limit needs it; "
                        "pip install cryptography")

from argon2.low_level import Type as Argon2Type
from argon2.low_level import hash_secret_raw
from nacl._sodium import ffi as sodium_ffi
from nacl._sodium import lib as sodium_lib

MiB = 1 << 20
CHUNK = MiB
PASSWORD = "benchmark password"


def argon2id(salt: bytes) -> bytes:
    """One Argon2id with the parameters aprfast (and aprender) use, straight from argon2-cffi."""
    return hash_secret_raw(secret=PASSWORD.encode(), salt=salt, time_cost=crypto.ARGON2_TIME,
                           memory_cost=crypto.ARGON2_MEMORY_KIB, parallelism=crypto.ARGON2_PARALLELISM,
                           hash_len=crypto.KEY_SIZE, type=Argon2Type.ID, version=0x13)


def payload_bytes(size: int) -> bytes:
    """Weights-like bytes: float16-rounded normals as float32 (zstd/LZ4 find some redundancy)."""
    rng = np.random.default_rng(0)
    return rng.standard_normal(size // 4, dtype=np.float32).astype(np.float16).astype(np.float32).tobytes()


class Mapped:
    """A read-only map of a file, opened per call as the loaders open theirs."""

    def __init__(self, path):
        self.handle = open(path, "rb")
        self.map = mmap.mmap(self.handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.view = memoryview(self.map)

    def close(self):
        self.view.release()
        self.map.close()
        self.handle.close()

    def __enter__(self):
        return self.view

    def __exit__(self, *exc):
        self.close()


def write_chunked(path, payload, salt):
    """salt || for each 1 MiB chunk: nonce(12) || ciphertext || tag(16), for the chunked limit."""
    key = argon2id(salt)
    aes = AESGCM(key)
    with open(path, "wb") as f:
        f.write(salt)
        view = memoryview(payload)
        for i, start in enumerate(range(0, len(view), CHUNK)):
            nonce = i.to_bytes(12, "little")
            f.write(nonce)
            f.write(aes.encrypt(nonce, view[start:start + CHUNK], None))


def chunked_decrypt(path, size):
    """The limit: Argon2id, then 1 MiB AES-256-GCM chunks decrypted into one buffer."""
    with Mapped(path) as view:
        key = argon2id(bytes(view[:16]))
        aes = AESGCM(key)
        out = bytearray(size)
        target = memoryview(out)
        pos = 16
        for start in range(0, size, CHUNK):
            n = min(CHUNK, size - start)
            nonce = bytes(view[pos:pos + 12])
            with view[pos + 12:pos + 12 + n + 16] as sealed, target[start:start + n] as into:
                if hasattr(aes, "decrypt_into"):
                    aes.decrypt_into(nonce, sealed, None, into)
                else:  # older cryptography: one copy per chunk
                    into[:] = aes.decrypt(nonce, sealed, None)
            pos += 12 + n + 16
        target.release()
        return out


def sodium_decrypt(blob_path):
    """The same Argon2id plus one libsodium AES-256-GCM decrypt of aprfast's own blob, read
    in place from the map into one new buffer (libsodium through PyNaCl's cffi module:
    nacl.bindings itself takes only bytes, which would add a copy of the ciphertext)."""
    with Mapped(blob_path) as view:
        key = argon2id(bytes(view[:16]))
        nonce = bytes(view[16:28])
        out = bytearray(len(view) - 28 - 16)
        with view[28:] as sealed, sodium_ffi.from_buffer("unsigned char[]", out, require_writable=True) as m, \
                sodium_ffi.from_buffer("unsigned char[]", sealed) as c:
            rc = sodium_lib.crypto_aead_aes256gcm_decrypt(m, sodium_ffi.NULL, sodium_ffi.NULL, c, len(sealed),
                                                          sodium_ffi.NULL, 0, nonce, key)
        if rc != 0:
            raise RuntimeError("libsodium: authentication failed")
        return out


def plain_read(path):
    with open(path, "rb") as f:
        return f.read()


def password_rows(table, directory, size, rounds):
    payload = payload_bytes(size)
    salt = os.urandom(16)
    blob_path = os.path.join(directory, "payload.enc")
    v1_path = os.path.join(directory, "model.apr")
    chunked_path = os.path.join(directory, "payload.chunked")
    with open(blob_path, "wb") as f:
        f.write(crypto.encrypt_with_password(payload, PASSWORD))
    v1.save_model(payload, v1_path, model_type="Custom", password=PASSWORD, durable=False)
    limits = {"Argon2id + 1 libsodium decrypt": lambda: sodium_decrypt(blob_path)}
    if bytes(sodium_decrypt(blob_path)) != payload:
        sys.exit("the libsodium limit does not round-trip")
    if AESGCM is not None:
        write_chunked(chunked_path, payload, salt)
        limits["Argon2id + 1 MiB-chunk AESGCM (cryptography)"] = lambda: chunked_decrypt(chunked_path, size)
        if bytes(chunked_decrypt(chunked_path, size)) != payload:
            sys.exit("the chunked limit does not round-trip")
    else:
        table.skip("cryptography (chunked AES-GCM limit)", CRYPTOGRAPHY_WHY)
    del payload
    os.sync()

    def load():
        return v1.load_model(v1_path, password=PASSWORD)

    def decrypt_mapped():
        with Mapped(blob_path) as view:
            return crypto.decrypt_with_password(view, PASSWORD)

    r = interleaved({"load": load, "decrypt": decrypt_mapped, **limits}, rounds)
    size_text = f"{size // MiB} MiB"
    lim = {k: r[k] for k in limits}
    table.add(Row("v1.load_model, password-encrypted", size_text, r["load"], limits=lim))
    table.add(Row("crypto.decrypt_with_password, mmap input", size_text, r["decrypt"], limits=lim))

    return blob_path


def peak_rows(table, directory, size):
    """Peak RSS of the decrypting loads, each in a fresh process."""
    payload = payload_bytes(size)
    blob_path = os.path.join(directory, "payload.enc")
    v1_path = os.path.join(directory, "model.apr")
    chunked_path = os.path.join(directory, "payload.chunked")
    if not os.path.exists(blob_path):
        with open(blob_path, "wb") as f:
            f.write(crypto.encrypt_with_password(payload, PASSWORD))
    if not os.path.exists(v1_path):
        v1.save_model(payload, v1_path, model_type="Custom", password=PASSWORD, durable=False)
    if AESGCM is not None and not os.path.exists(chunked_path):
        write_chunked(chunked_path, payload, os.urandom(16))
    del payload
    size_text = f"{size // MiB} MiB"
    peaks = {k: Samples() for k in ("v1_load", "raw_nacl", "chunked")}
    for _ in range(2):
        peaks["v1_load"].append(peak(["v1_load", v1_path, size]))
        peaks["raw_nacl"].append(peak(["raw_nacl", blob_path, size]))
        if AESGCM is not None:
            peaks["chunked"].append(peak(["chunked", chunked_path, size]))
    lim = {"Argon2id + 1 libsodium decrypt": peaks["raw_nacl"]}
    if peaks["chunked"]:
        lim["Argon2id + 1 MiB-chunk AESGCM"] = peaks["chunked"]
    table.add(Row("v1.load_model, password: peak RSS above the process (fresh)", size_text, peaks["v1_load"],
                  limits=lim, unit="B"))


def save_rows(table, directory, size, rounds):
    """v1.save_model with a password against the same work with raw primitives: Argon2id,
    1 MiB AES-256-GCM chunks, a write.  Both write to a path that does not exist (removed
    before each call, untimed), without fsync."""
    size_text = f"{size // MiB} MiB"
    payload = payload_bytes(size)
    ours, limit = os.path.join(directory, "save.apr"), os.path.join(directory, "save.chunked")
    tools = {"save": lambda: v1.save_model(payload, ours, model_type="Custom", password=PASSWORD, durable=False)}
    setup = {"save": unlinker(ours)}
    if AESGCM is not None:
        tools["Argon2id + 1 MiB-chunk AESGCM + write (cryptography)"] = \
            lambda: write_chunked(limit, payload, os.urandom(16))
        setup["Argon2id + 1 MiB-chunk AESGCM + write (cryptography)"] = unlinker(limit)
    r = interleaved(tools, rounds, setup=setup)
    ours_s = r.pop("save")
    table.add(Row("v1.save_model, password-encrypted, to a fresh path (no fsync)", size_text, ours_s, limits=r))
    for path in (ours, limit):
        unlinker(path)()


def compression_rows(table, directory, size, rounds):
    payload = payload_bytes(size)
    import lz4.block
    import zstandard

    paths, tools, limits = {}, {}, {}
    for name in ("none", "zstd", "lz4"):
        path = os.path.join(directory, f"{name}.apr")
        v1.save_model(payload, path, model_type="Custom", compression=name, durable=False)
        paths[name] = path
        stored = v1.inspect_model(path)["header"]["payload_size"]
        start = os.path.getsize(path) - 4 - stored  # unsigned: the payload ends where the CRC32 begins
        tools[name] = (lambda p=path: v1.load_model(p))
        if name == "none":
            limits[name] = {"read()": lambda p=path: plain_read(p)}
        elif name == "zstd":
            limits[name] = {"read() + zstandard.decompress": lambda p=path, s=start: zstandard.ZstdDecompressor()
                            .decompress(memoryview(plain_read(p))[s:-4], max_output_size=size)}
        else:
            limits[name] = {"read() + lz4.block.decompress": lambda p=path, s=start: lz4.block.decompress(
                memoryview(plain_read(p))[s:-4])}
        check = next(iter(limits[name].values()))()
        if name != "none" and bytes(check) != payload or v1.load_model(path).payload != payload:
            sys.exit(f"{name}: the limit does not give the payload back")
    del payload
    os.sync()
    flat = {}
    for name in paths:
        flat["apr " + name] = tools[name]
        flat.update({f"{name}: {k}": fn for k, fn in limits[name].items()})
    r = interleaved(flat, rounds)
    for name in paths:
        ratio = os.path.getsize(paths[name]) / size
        table.add(Row(f"v1.load_model, compression {name} (file {ratio:.2f}x the payload)", f"{size // MiB} MiB",
                      r["apr " + name], limits={k: r[f"{name}: {k}"] for k in limits[name]}))


def verify_rows(table, blob_path, size, rounds):
    with open(blob_path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        seed, public = crypto.generate_signing_key()
        parts = [view[:32], view[32:4096], view[4096:]]  # header, metadata, payload
        signature = crypto.sign(parts, seed)
        r = interleaved({"verify": lambda: crypto.verify(parts, signature, public),
                         "sign": lambda: crypto.sign(parts, seed),
                         "sha512": lambda: hashlib.sha512(view).digest()}, rounds)
        table.add(Row("crypto.verify (Ed25519), 3 memoryview parts of an mmap", f"{size // MiB} MiB",
                      r["verify"], limits={"one hashlib.sha512 pass": r["sha512"]}))
        table.add(Row("crypto.sign (Ed25519 hashes the message twice)", f"{size // MiB} MiB", r["sign"],
                      limits={"one hashlib.sha512 pass": r["sha512"]}))
        for part in parts:
            part.release()
        view.release()


_PEAK_CHILD = r"""
import sys
sys.path.insert(0, {here!r})
import bench_crypto  # imports everything each call needs, before the baseline is taken


def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024

who, path = sys.argv[1], sys.argv[2]
size = int(sys.argv[3])
base = status('VmRSS')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # VmHWM := the current RSS: measure the call alone
if who == 'v1_load':
    from aprfast import v1
    model = v1.load_model(path, password=bench_crypto.PASSWORD)
elif who == 'raw_nacl':
    plaintext = bench_crypto.sodium_decrypt(path)
elif who == 'chunked':
    plaintext = bench_crypto.chunked_decrypt(path, size)
print(status('VmHWM') - base)
"""


def peak(args):
    if not os.path.exists("/proc/self/clear_refs"):
        return float("nan")
    code = _PEAK_CHILD.format(here=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"peak child {args[0]} failed:\n{out.stderr}")
    return float(out.stdout.strip().splitlines()[-1])


def apr2_rows(table, directory, size, rounds):
    """Signed random access and encrypted eager loads of the APR2 layout."""
    import aprfast

    count = max(1, size // (2 * MiB))
    rng = np.random.default_rng(0)
    block = rng.standard_normal(MiB // 2, dtype=np.float32)  # 2 MiB, one buffer reused with a twist per tensor
    tensors = {f"layer{i:04d}.weight": block + np.float32(i) for i in range(count)}
    total = sum(t.nbytes for t in tensors.values())
    size_text = f"{total // MiB} MiB"
    seed, public = crypto.generate_signing_key()
    secret, recipient = crypto.generate_x25519_key()
    signed = os.path.join(directory, "signed.apr")
    sealed = os.path.join(directory, "sealed.apr")
    password = os.path.join(directory, "password.apr")
    aprfast.save_file(tensors, signed, signing_key=seed, durable=False)
    aprfast.save_file(tensors, sealed, recipients=[recipient], durable=False)
    aprfast.save_file(tensors, password, password=PASSWORD, durable=False)
    middle = f"layer{count // 2:04d}.weight"
    want = tensors[middle]
    del tensors

    def one_signed():
        with aprfast.open(signed, trusted_keys=[public]) as f:
            return f.get_tensor(middle)

    if not np.array_equal(one_signed(), want):
        sys.exit("apr2 signed: the tensor read back differs")
    r = interleaved({"ours": one_signed, "sha256": lambda: hashlib.sha256(want).digest()}, max(rounds, 5),
                    min_sample=0.05)
    ours = r.pop("ours")
    row = table.add(Row("APR2 signed: open + verify signature + read one 2 MiB tensor", size_text, ours,
                        limits={"hashlib.sha256 of that tensor": r["sha256"]}))
    table.notes.append(f"APR2 signed random access: {(row.aprfast.median - r['sha256'].median) * 1e3:.2f} ms beyond "
                       "hashing the tensor (target: under 5 ms).")
    loads = {"recipient": lambda: aprfast.load_file(sealed, mmap=False, private_key=secret),
             "password": lambda: aprfast.load_file(password, mmap=False, password=PASSWORD),
             "read()": lambda: plain_read(sealed)}
    got = loads["recipient"]()
    if not np.array_equal(got[middle], want):
        sys.exit("apr2 encrypted: the tensor read back differs")
    del got
    r = interleaved(loads, rounds)
    for kind in ("recipient", "password"):
        row = table.add(Row(f"APR2 encrypted eager load_file(mmap=False), {kind}", size_text, r[kind],
                            limits={"read() of the file": r["read()"]}))
        table.notes.append(f"APR2 encrypted eager load ({kind}): {total / row.aprfast.median / 1e9:.2f} GB/s "
                           "(target: at least 2.5 GB/s).")
    for path in (signed, sealed, password):
        unlinker(path)()


#: The row groups --only selects (all of them by default), in the order they run.
GROUPS = ("v1-password", "v1-save", "v1-load", "verify", "apr2")


def _groups(text: str) -> list:
    chosen = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown row group(s) {unknown}; choose from {', '.join(GROUPS)}")
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 MiB payload, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--only", type=_groups, default=None,
                        help=f"run only these row groups, comma-separated: {', '.join(GROUPS)}")
    parser.add_argument("--size-mib", type=int, default=None,
                        help="payload size (default 256 MiB for the v1 rows, 512 for APR2; 32 with --quick)")
    args = parser.parse_args()
    size = args.size_mib * MiB if args.size_mib else (32 if args.quick else 256) * MiB
    apr2_size = args.size_mib * MiB if args.size_mib else (32 if args.quick else 512) * MiB
    rounds = 3 if args.quick else args.rounds
    versions = (f"AES-GCM backend {crypto.AEAD_BACKEND}, cryptography "
                f"{timing.version('cryptography') if AESGCM else 'absent'}, PyNaCl {timing.version('pynacl')}, "
                f"argon2-cffi {timing.version('argon2-cffi')}")
    table = Table(f"v1 container and crypto ({size // MiB} MiB payload)", "peer", versions=versions)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        only = set(args.only or GROUPS)
        blob = None
        if "v1-password" in only:
            blob = password_rows(table, directory, size, rounds)
        if "v1-save" in only:
            save_rows(table, directory, size, rounds)
        if "v1-password" in only:
            peak_rows(table, directory, size)
        if "v1-load" in only:
            compression_rows(table, directory, size, rounds)
        if "verify" in only:
            if blob is None:
                blob = os.path.join(directory, "payload.enc")
                with open(blob, "wb") as f:
                    f.write(crypto.encrypt_with_password(payload_bytes(size), PASSWORD))
            verify_rows(table, blob, size, rounds)
        if "apr2" in only:
            apr2_rows(table, directory, apr2_size, rounds)
    table.notes.append("The 1 MiB-chunk AESGCM limit decrypts a chunked ciphertext of the same plaintext (a tag per "
                       "chunk, a format v1 does not have): it bounds what a streaming decrypt could cost.")
    table.notes.append("No other tool reads aprender's v1 files: the limits are the same work with raw primitives "
                       "and no format (no CRC32, no header checks); a ratio below 1 is the format's overhead.")
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
