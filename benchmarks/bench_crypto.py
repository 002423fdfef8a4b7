"""Time and measure aprfast.crypto on a large payload beside the raw primitives.

    python benchmarks/bench_crypto.py           # 256 MiB payload
    python benchmarks/bench_crypto.py --quick   # 32 MiB, 2 repeats

(a) Password decryption: ``decrypt_with_password`` (Argon2id + AES-256-GCM) against the
    same Argon2id plus one raw ``nacl.bindings.crypto_aead_aes256gcm_decrypt`` of the same
    ciphertext.  Target: within 1.3x.  Peak memory is measured in a fresh process reading
    the blob through mmap, as the v1 loader does: peak RSS above the process before the
    call, divided by the payload size, so the touched ciphertext pages count (target < 2.2).
(b) Signature verification: ``verify`` of a message given as memoryview slices against a
    single ``hashlib.sha512`` pass over the same bytes.  Target: within 1.3x, no copy.

Ratios are aprfast time divided by baseline time: below 1 means aprfast is faster.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import mmap
import os
import subprocess
import sys
import tempfile
import tracemalloc

import nacl.bindings as nb

from aprfast import crypto, v1
from timing import best

MiB = 1 << 20
PASSWORD = "benchmark password"




def ratio_line(name, ours, baseline, target):
    verdict = "ok" if ours / baseline <= target else "ABOVE TARGET"
    print(f"{name:44} aprfast {ours * 1e3:8.1f} ms   baseline {baseline * 1e3:8.1f} ms   "
          f"ratio {ours / baseline:5.2f} (target <= {target}) {verdict}", flush=True)


def password_decrypt_times(blob_path, repeat):
    with open(blob_path, "rb") as handle:
        blob = handle.read()
    salt, nonce, ciphertext = blob[:16], blob[16:28], blob[28:]  # slices made once, untimed

    def ours():
        crypto.decrypt_with_password(blob, PASSWORD)

    def raw_nacl():
        key = crypto.derive_password_key(PASSWORD, salt)
        nb.crypto_aead_aes256gcm_decrypt(ciphertext, None, nonce, key)

    with open(blob_path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)

        def ours_mapped():
            crypto.decrypt_with_password(view, PASSWORD)

        mapped_time = best(ours_mapped, repeat)
        view.release()
    return best(ours, repeat), mapped_time, best(raw_nacl, repeat)


_PEAK_CHILD = r"""
import mmap, sys
import nacl.bindings as nb
from aprfast import crypto


def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024

who, path, password, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
handle = open(path, 'rb')
mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
view = memoryview(mapped)
base = status('VmRSS')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # reset VmHWM to the current RSS: measure the call alone
if who == 'decrypt_with_password':
    plaintext = crypto.decrypt_with_password(view, password)
elif who == 'raw_nacl':
    key = crypto.derive_password_key(password, bytes(view[:16]))
    plaintext = nb.crypto_aead_aes256gcm_decrypt(bytes(view[28:]), None, bytes(view[16:28]), key)
elif who == 'v1_load':
    from aprfast import v1
    model = v1.load_model(path, password=password)
elif who == 'verify':
    signature, public = sys.argv[5], sys.argv[6]
    crypto.verify([view[:32], view[32:4096], view[4096:]], bytes.fromhex(signature),
                  bytes.fromhex(public))
print((status('VmHWM') - base) / size)
"""


def peak_ratio(who, path, size, *extra):
    """Peak RSS above the process before the call, in payload sizes (fresh process)."""
    if not os.path.exists("/proc/self/clear_refs"):
        return float("nan")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _PEAK_CHILD, who, path, PASSWORD, str(size), *extra],
                            capture_output=True, text=True, check=True, env=env)
    return float(result.stdout.strip())


def verify_times(message_path, repeat):
    with open(message_path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return _time_verify(view, repeat)
        finally:
            view.release()  # the map can close only once no view of it is left


def _time_verify(view, repeat):
    seed, public = crypto.generate_signing_key()
    parts = [view[:32], view[32:4096], view[4096:]]  # header, metadata, payload
    signature = crypto.sign(parts, seed)
    ours = best(lambda: crypto.verify(parts, signature, public), repeat)
    baseline = best(lambda: hashlib.sha512(view).digest(), repeat)
    sign_time = best(lambda: crypto.sign(parts, seed), repeat)
    tracemalloc.start()
    crypto.verify(parts, signature, public)
    python_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    for part in parts:
        part.release()
    return ours, baseline, sign_time, python_peak, signature, public


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 MiB payload, 2 repeats")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    args = parser.parse_args()
    size = (32 if args.quick else 256) * MiB
    repeat = 2 if args.quick else args.repeat
    print(f"aprfast.crypto: AES-GCM backend {crypto.AEAD_BACKEND}, payload {size // MiB} MiB, "
          f"{os.cpu_count()} cores, best of {repeat}")

    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        blob_path = os.path.join(directory, "payload.enc")
        v1_path = os.path.join(directory, "model.apr")
        payload = os.urandom(size)
        with open(blob_path, "wb") as handle:
            handle.write(crypto.encrypt_with_password(payload, PASSWORD))
        v1.save_model(payload, v1_path, model_type="Custom", password=PASSWORD, durable=False)
        del payload
        gc.collect()

        ours, ours_mapped, raw = password_decrypt_times(blob_path, repeat)
        ratio_line("(a) decrypt_with_password, bytes input", ours, raw, 1.3)
        ratio_line("(a) decrypt_with_password, mmap input", ours_mapped, raw, 1.3)
        ours_peak = peak_ratio("decrypt_with_password", blob_path, size)
        raw_peak = peak_ratio("raw_nacl", blob_path, size)
        print(f"(a) peak RSS above the process, in payloads (ciphertext included): aprfast "
              f"{ours_peak:.2f}x (target < 2.2)   raw nacl {raw_peak:.2f}x", flush=True)
        # The whole v1 load: magic, CRC over the file, header checks, then the decryption.
        load_time = best(lambda: v1.load_model(v1_path, password=PASSWORD), repeat)
        ratio_line("(a) v1.load_model, password-encrypted file", load_time, raw, 1.3)
        print(f"(a) v1.load_model peak RSS above the process, in payloads: "
              f"{peak_ratio('v1_load', v1_path, size):.2f}x (target < 2.2)", flush=True)

        verify_time, sha_time, sign_time, python_peak, signature, public = verify_times(blob_path, repeat)
        ratio_line("(b) verify, 3 memoryview parts of an mmap", verify_time, sha_time, 1.3)
        print(f"(b) sign (two SHA-512 passes, as Ed25519 needs) {sign_time * 1e3:.1f} ms "
              f"= {sign_time / sha_time:.2f}x one SHA-512 pass")
        verify_peak = peak_ratio("verify", blob_path, size, signature.hex(), public.hex())
        print(f"(b) verify allocations traced by Python: {python_peak / 1024:.1f} KiB; peak RSS "
              f"above the process {verify_peak:.2f}x the message (1.00 = the mapped pages alone)")


if __name__ == "__main__":
    main()
