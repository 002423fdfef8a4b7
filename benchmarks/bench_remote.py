"""Remote reads (aprfast.remote) against loopback servers: moto's S3 server and a
counting HTTP server on 127.0.0.1 (tests/servers.py).  Nothing leaves the machine.

    python benchmarks/bench_remote.py              # 512 MiB model, 5 rounds
    python benchmarks/bench_remote.py --quick      # 64 MiB, 3 rounds
    python benchmarks/bench_remote.py --size-mib 256

Rows (issue 15's targets):

* ``inspect`` of a 200-tensor model over HTTP: the number of requests (target: 1).
* ``load_file`` of the model from S3 (open through s3fs, then ``connections``
  parallel ranged GETs of a presigned URL into the final aligned buffer, CRC checked)
  | the *limit*: the same bytes fetched with the same number of parallel ranged GETs
  of a presigned URL (http.client), each body read into one preallocated buffer, with
  no format around them (target: within 1.3x); and the peer ``s3fs.cat_file(path)`` +
  ``aprfast.load`` (target: at least 2x slower than aprfast).  The same ranged GETs
  through s3fs (``cat_file(path, start, end)`` in a thread pool) are in the notes.
* one 2 MiB tensor from the model: on a fresh handle and on an open one, over S3
  (time, and requests as botocore sends them) and over HTTP (requests counted by the
  server); targets: at most 2 fresh, 1 open.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import timing
from timing import Row, Table, interleaved

import aprfast

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
from servers import HttpObjectServer, S3Server, free_port  # noqa: E402 - the loopback servers the tests use

MiB = 1 << 20
CONNECTIONS = 8


class MotoProcess(S3Server):
    """moto's S3 server in its own process (``python -m moto.server``), so the server
    does not share this process's GIL with the client being measured."""

    def __init__(self):  # noqa: D107 - S3Server's attributes, another way to start
        self.port = free_port()
        self._process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                          str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.storage_options = {"key": "testing", "secret": "testing",
                                "client_kwargs": {"endpoint_url": self.endpoint_url}}
        for _ in range(200):
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("moto's server did not start")

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)


class GoFakeS3Process(S3Server):
    """gofakes3 (github.com/johannesboyne/gofakes3, a Go S3 server) in its own process,
    serving objects from files in a temporary directory (its "fs" backend), so a ranged
    GET reads only its range: the kind of server the S3 load_file target assumes, which
    moto (a whole-object copy per GET) is not.  Build it with
    ``go install github.com/johannesboyne/gofakes3/cmd/gofakes3@v1.2.0``."""

    def __init__(self, binary: str):  # noqa: D107 - S3Server's attributes, another way to start
        self.port = free_port()
        self._directory = tempfile.TemporaryDirectory()
        self._process = subprocess.Popen([binary, "-host", f"127.0.0.1:{self.port}", "-backend", "fs",
                                          "-fs.path", self._directory.name, "-fs.create", "-autobucket"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        # gofakes3 sends the whole object's checksum with a ranged answer, which botocore
        # would check against the range: checksums only where S3 requires them
        self.storage_options = {"key": "testing", "secret": "testing",
                                "client_kwargs": {"endpoint_url": self.endpoint_url},
                                "config_kwargs": {"response_checksum_validation": "when_required",
                                                  "request_checksum_calculation": "when_required"}}
        for _ in range(200):
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).close()
                return
            except OSError as exc:
                if getattr(exc, "code", None):  # an HTTP error answer: the server is up
                    return
                time.sleep(0.05)
        raise RuntimeError("gofakes3 did not start")

    def make_bucket(self, name: str | None = None) -> str:
        try:
            return super().make_bucket(name)
        except FileExistsError:  # -autobucket: every bucket name already answers
            return name or "bench"

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)
        self._directory.cleanup()


_HTTP_CHILD = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from servers import HttpObjectServer
server = HttpObjectServer()
with open(sys.argv[2], "rb") as f:
    server.put("big.apr", f.read())
print(server.port, flush=True)
threading.Event().wait()
"""


class HttpProcess:
    """The tests' HTTP server in its own process, serving one file as /big.apr."""

    def __init__(self, path: str):
        tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests")
        self._process = subprocess.Popen([sys.executable, "-c", _HTTP_CHILD, tests, path], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
        self.url = f"http://127.0.0.1:{int(self._process.stdout.readline())}/big.apr"

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)


#: (host, port) -> one kept-alive http.client connection per part, reused from call to
#: call as load_file reuses its pool's (a fresh connection starts with a small TCP window)
_LIMIT_CONNECTIONS: dict = {}


def ranged_gets_into_a_buffer(host: str, port: int, target: str, size: int, alloc=None) -> np.ndarray:
    """The transport's limit: ``size`` bytes in CONNECTIONS parallel ranged GETs
    (http.client, kept-alive connections), each body read straight into its part of
    one preallocated buffer; no format, no CRC, no checks.  The buffer comes from
    ``aprfast.aligned_empty`` (huge pages where the kernel has them), as load_file's
    does, so the two differ by the transport and the format, not by page faults."""
    import http.client

    out = aprfast.aligned_empty(size) if alloc is None else alloc(size)
    step = -(-size // CONNECTIONS)
    conns = _LIMIT_CONNECTIONS.setdefault((host, port), [http.client.HTTPConnection(host, port)
                                                         for _ in range(CONNECTIONS)])

    def part(i):
        a = i * step
        b = min(size, a + step)
        conn = conns[i]
        conn.request("GET", target, headers={"Range": f"bytes={a}-{b - 1}"})
        resp = conn.getresponse()
        view, got = memoryview(out)[a:b], 0
        while got < b - a:
            k = resp.readinto(view[got:])
            if not k:
                raise OSError(f"the body of bytes {a}-{b - 1} ended early")
            got += k
        if resp.will_close:
            conn.close()  # http.client reconnects on the next request

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        list(pool.map(part, range(-(-size // step))))
    return out


def http_load_rows(table: Table, data: bytes, directory: str, rounds: int) -> None:
    path = os.path.join(directory, "big.apr")
    with open(path, "wb") as f:
        f.write(data)
    server = HttpProcess(path)
    size = len(data)
    try:
        url = server.url
        port = int(url.split(":")[2].split("/")[0])

        def limit():
            return ranged_gets_into_a_buffer("127.0.0.1", port, "/big.apr", size)

        def whole_then_load():
            with urllib.request.urlopen(url) as resp:
                return aprfast.load(resp.read())

        r = interleaved({"aprfast": lambda: aprfast.load_file(url), "limit": limit, "get+load": whole_then_load},
                        rounds, slow=60)
        table.add(Row(f"load_file, HTTP, {CONNECTIONS} connections", timing.fmt_bytes(size), r["aprfast"],
                      primary={"one GET + aprfast.load": r["get+load"]},
                      limits={f"{CONNECTIONS} ranged GETs into a buffer": r["limit"]}))
    finally:
        server.stop()
        os.unlink(path)


def model_bytes(size: int) -> tuple[bytes, str]:
    """A model of ``size`` bytes: 2 MiB float32 tensors (the last one named ``probe``)."""
    n = max(2, size // (2 * MiB))
    tensors = {f"layer.{i:04d}.weight": np.full(MiB // 2, i, np.float32) for i in range(n - 1)}
    tensors["probe"] = np.arange(MiB // 2, dtype=np.float32)
    return aprfast.save(tensors), "probe"


def small_model() -> bytes:
    rng = np.random.default_rng(0)
    return aprfast.save({f"blk.{i:03d}.attn.weight": rng.standard_normal((8, 8)).astype(np.float32)
                         for i in range(200)})


def inspect_rows(table: Table, http: HttpObjectServer, rounds: int) -> None:
    url = http.put("small.apr", small_model())
    http.reset()
    info = aprfast.inspect(url)
    count = http.count
    r = interleaved({"inspect": lambda: aprfast.inspect(url)}, rounds, min_sample=0.05)
    table.add(Row("inspect, 200 tensors, HTTP", f"{len(info['tensors'])} t", r["inspect"],
                  note=f"{count} request(s) (target 1)"))


def load_rows(table: Table, s3: S3Server, bucket: str, data: bytes, rounds: int, server: str = "moto") -> None:
    fs = s3.fs()
    path = f"{bucket}/big.apr"
    url = f"s3://{path}"
    options = dict(s3.storage_options, connections=CONNECTIONS)
    size = len(data)

    def ours():
        return aprfast.load_file(url, storage_options=options)

    def limit_s3fs():
        out = np.empty(size, np.uint8)
        step = -(-size // CONNECTIONS)

        def part(a):
            b = min(size, a + step)
            out[a:b] = np.frombuffer(fs.cat_file(path, start=a, end=b), np.uint8)

        with ThreadPoolExecutor(CONNECTIONS) as pool:
            list(pool.map(part, range(0, size, step)))
        return out

    def limit_presigned():
        parts = urllib.parse.urlsplit(fs.url(path, expires=600))  # signed here, no request
        return ranged_gets_into_a_buffer(parts.hostname, parts.port, f"{parts.path}?{parts.query}", size)

    def cat_then_load():
        return aprfast.load(fs.cat_file(path))

    check = ours()
    assert check["probe"][5] == 5
    del check
    assert limit_presigned()[-16:].tobytes() == data[-16:]
    r = interleaved({"aprfast": ours, "limit": limit_presigned, "limit s3fs": limit_s3fs,
                     "cat_file+load": cat_then_load}, rounds, slow=60)
    row = Row(f"load_file, S3 ({server}), {CONNECTIONS} connections", timing.fmt_bytes(size), r["aprfast"],
              primary={"s3fs cat_file + aprfast.load": r["cat_file+load"]},
              limits={f"{CONNECTIONS} presigned ranged GETs into a buffer": r["limit"]})
    table.add(row)
    over = r["aprfast"].median / r["limit"].median
    over_s3fs = r["aprfast"].median / r["limit s3fs"].median
    peer = r["cat_file+load"].median / r["aprfast"].median
    table.notes.append(f"load_file / limit = {over:.2f}x (target at most 1.3x; the limit: {CONNECTIONS} "
                       f"parallel ranged GETs of a presigned URL, http.client reading each body into one "
                       f"preallocated buffer); cat_file+load / load_file = {peer:.2f}x (target at least 2x).")
    table.notes.append(f"The same {CONNECTIONS} ranged GETs through s3fs (cat_file(path, start, end) in a thread "
                       f"pool, copied into one buffer): {r['limit s3fs'].text('s')}; load_file / that = "
                       f"{over_s3fs:.2f}x. Not the limit any more: it measures s3fs's one event-loop thread and "
                       f"its copies, which load_file no longer goes through.")


def tensor_rows(table: Table, s3: S3Server, bucket: str, http: HttpObjectServer, data: bytes, probe: str,
                rounds: int) -> None:
    url = f"s3://{bucket}/big.apr"
    options = s3.storage_options

    def fresh():
        with aprfast.open(url, storage_options=options) as f:
            return f.get_tensor(probe)

    handle = aprfast.open(url, storage_options=options)
    # S3 requests counted as the client sends them (the server may be another process):
    # botocore's (open) and the presigned GETs sent by aprfast.remote.http.Endpoint;
    # fresh handles share this s3fs instance (fsspec caches it per storage_options)
    from aprfast.remote.http import Endpoint

    sent = []
    handle._source.fs.s3.meta.events.register("before-send.s3", lambda request, **kw: sent.append(request.method))
    real_send = Endpoint.send

    def counted_send(self, target, headers):
        sent.append("GET")
        return real_send(self, target, headers)

    Endpoint.send = counted_send
    try:
        fresh()
        s3_fresh = len(sent)
        sent.clear()
        handle.get_tensor(probe)
        s3_open = len(sent)
    finally:
        Endpoint.send = real_send
    r = interleaved({"fresh": fresh, "open": lambda: handle.get_tensor(probe)}, rounds)
    handle.close()

    http_url = http.put("big.apr", data)
    http.reset()
    with aprfast.open(http_url) as f:
        f.get_tensor(probe)
        fresh_count = http.count
        http.reset()
        got = f.get_tensor(probe)
        open_count = http.count
    np.testing.assert_array_equal(got, np.arange(MiB // 2, dtype=np.float32))
    size = timing.fmt_bytes(len(data))
    table.add(Row("one 2 MiB tensor, fresh handle, S3", size, r["fresh"],
                  note=f"S3: {s3_fresh}, HTTP: {fresh_count} requests (target at most 2)"))
    table.add(Row("one 2 MiB tensor, open handle, S3", size, r["open"],
                  note=f"S3: {s3_open}, HTTP: {open_count} request(s) (target 1)"))
    r_http = interleaved({"fresh": lambda: _fresh_http(http_url, probe)}, rounds)
    table.add(Row("one 2 MiB tensor, fresh handle, HTTP", size, r_http["fresh"]))


def _fresh_http(url, probe):
    with aprfast.open(url) as f:
        return f.get_tensor(probe)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 MiB model, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size-mib", type=int, default=None, help="model size (default 512, 64 with --quick)")
    parser.add_argument("--gofakes3", default=None, metavar="BINARY",
                        help="serve S3 with this gofakes3 binary (files on disk) instead of moto")
    parser.add_argument("--moto-in-process", action="store_true",
                        help="run moto in a thread of this process (default: its own process)")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    args = parser.parse_args()
    size = (args.size_mib or (64 if args.quick else 512)) * MiB
    rounds = 3 if args.quick else args.rounds
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ[key] = value
    versions = f"s3fs {timing.version('s3fs')}, fsspec {timing.version('fsspec')}, " + (
        "gofakes3 (fs backend)" if args.gofakes3 else f"moto {timing.version('moto')}")
    table = Table(f"Remote reads over loopback ({size // MiB} MiB model)", "peer", versions=versions)
    http = HttpObjectServer()
    if args.gofakes3:
        s3 = GoFakeS3Process(args.gofakes3)
    else:
        s3 = S3Server() if args.moto_in_process else MotoProcess()
    server = "gofakes3" if args.gofakes3 else "moto"
    try:
        inspect_rows(table, http, rounds)
        bucket = s3.make_bucket()
        data, probe = model_bytes(size)
        s3.fs().pipe(f"{bucket}/big.apr", data)
        load_rows(table, s3, bucket, data, rounds, server)
        with tempfile.TemporaryDirectory() as directory:
            http_load_rows(table, data, directory, rounds)
        tensor_rows(table, s3, bucket, http, data, probe, rounds)
    finally:
        http.close()
        s3.stop()
    if args.gofakes3:
        table.notes.append("S3 served by gofakes3 (Go) from files in a temporary directory on 127.0.0.1: a ranged "
                           "GET reads only its range, as S3 does.")
    else:
        table.notes.append("Servers on 127.0.0.1 on this machine: moto serves S3 from Python (in its own process "
                           "unless --moto-in-process), so every S3 row measures moto as much as the client. "
                           "moto copies the whole object under a lock for every GET, ranged or not (FakeKey.value "
                           "in moto/s3/models.py), so N parallel ranged GETs cost it N whole-object copies in "
                           "series: against moto, fewer and larger requests win whatever the client does "
                           "(--gofakes3 BINARY serves S3 from files instead).")
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
