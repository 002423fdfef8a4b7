"""Every behaviour of the hostile HTTP server (tests/hostile_http.py) against every entry
point that reads a URL: ``aprfast.open`` + ``get_tensor``, ``aprfast.load_file``,
``aprfast.stream``, ``aprfast.convert`` and ``aprfast.remote.cache.download`` (``apr
download``) (issue 25, item 2).

For each case:

- it ends in a typed :class:`aprfast.errors.AprError` (never another exception type),
  or, where the behaviour allows it, succeeds with the right tensors (never wrong data);
- in bounded wall time (small ``timeout``/``min_rate``/``deadline`` in storage_options);
- no secret of the URL (userinfo password, query values) nor of the headers appears
  in the error, its ``path``, or anything chained to it (the whole formatted traceback);
- no file is left behind by a failed download or conversion;
- a redirect to another origin carries no credential there.

The body-size behaviours are also run in a child process that measures its peak RSS
(``test_body_size_behaviours_bound_memory``).  ``APRFAST_HOSTILE_LONG=1`` runs the long
mode (docs/robustness.md): a 1 byte/s drip, a 1 GiB gzip bomb, a 16 MiB payload, the
default-like time bounds; ``APRFAST_HOSTILE_REPEAT=N`` repeats every case N times.
"""

import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest
from hostile_http import BEHAVIOURS, ENTRY_POINTS, LONG, SECRETS, HostileServer, payload

import aprfast
from aprfast import remote
from aprfast.errors import AprError
from aprfast.remote.cache import download

pytestmark = pytest.mark.slow("hostile HTTP server")

REPEAT = max(1, int(os.environ.get("APRFAST_HOSTILE_REPEAT", "1") or 1))
#: the time bounds every case runs with (a drip fails after about ``timeout`` seconds)
if LONG:
    OPTIONS = {"timeout": 5.0, "min_rate": 16 << 10, "deadline": 30.0}
else:
    OPTIONS = {"timeout": 1.0, "min_rate": 64 << 10, "deadline": 3.0}
HEADERS = {"X-Api-Key": "SECRETHEADER", "Cookie": "session=SECRETCOOKIE"}
#: the longest one case may take: a few deadlines (opening and one later request each
#: have one), with room for a machine shared by other jobs
CASE_SECONDS = 4 * OPTIONS["deadline"]
#: bytes a download may take (the endless bodies stop there)
MAX_DOWNLOAD = 4 << 20


@pytest.fixture(scope="module")
def hostile():
    server = HostileServer(payload())
    yield server
    server.close()


@pytest.fixture(scope="module")
def expected(hostile):
    return aprfast.load(hostile.payload)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


def _options():
    return dict(OPTIONS, headers=dict(HEADERS))


def run_entry(entry: str, url: str, workdir):
    """What ``entry`` gives for ``url``: a dict of tensors, or the bytes downloaded."""
    options = _options()
    if entry == "open":
        with aprfast.open(url, storage_options=options) as f:
            return {name: f.get_tensor(name, copy=True) for name in f.keys()}
    if entry == "load_file":
        return aprfast.load_file(url, storage_options=options)
    if entry == "stream":
        return dict(aprfast.stream(url, storage_options=options))
    if entry == "convert":
        out = os.path.join(workdir, "out.apr")
        aprfast.convert(url, out, storage_options=options)
        return aprfast.load_file(out)
    if entry == "download":
        path = download(url, cache_dir=os.path.join(workdir, "cache"), storage_options=options,
                        max_size=MAX_DOWNLOAD)
        return path.read_bytes()
    raise AssertionError(entry)


def chain_text(exc) -> str:
    """Everything a person could be shown of ``exc``: the formatted traceback with every
    chained exception, and each one's ``path``, ``args`` and ``repr``."""
    texts, seen = ["".join(traceback.format_exception(type(exc), exc, exc.__traceback__))], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts += [repr(exc), repr(exc.args), str(getattr(exc, "path", ""))]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def _files(root) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _same_tensors(got: dict, want: dict) -> bool:
    return sorted(got) == sorted(want) and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and np.array_equal(got[k], want[k])
        for k in want)


def check_case(hostile, expected, name: str, entry: str, workdir, case: str):
    behaviour = BEHAVIOURS[name]
    url = hostile.url(name, case)
    start = time.monotonic()
    error = got = None
    try:
        got = run_entry(entry, url, workdir)
    except AprError as exc:
        error = exc
    except BaseException as exc:  # noqa: BLE001 - the finding: re-raised with its traceback
        raise AssertionError(f"{name} / {entry}: an untyped {type(exc).__name__}: {exc}") from exc
    elapsed = time.monotonic() - start
    assert elapsed < CASE_SECONDS, f"{name} / {entry} took {elapsed:.1f} s"
    if error is not None:
        text = chain_text(error)
        assert not [s for s in SECRETS if s in text], f"{name} / {entry} shows a secret:\n{text}"
        assert "alice" not in str(error), str(error)
        assert entry in behaviour.fails, f"{name} / {entry} should succeed, but: {error!r}"
        if entry == "download":
            assert _files(workdir) == [], f"{name}: a failed download left {_files(workdir)}"
        if entry == "convert":
            assert _files(workdir) == [] and os.listdir(workdir) == [], \
                f"{name}: a failed conversion left {os.listdir(workdir)}"
    else:
        assert entry not in behaviour.fails, f"{name} / {entry} should fail, but succeeded"
        if entry == "download":
            entity = behaviour.entity(hostile.payload) if behaviour.entity else hostile.payload
            assert got == entity, f"{name}: downloaded {len(got)} bytes that are not the server's entity"
        else:
            assert _same_tensors(got, expected), f"{name} / {entry}: wrong tensors"
    return error, elapsed


# --- the matrix ------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_hostile_behaviour(hostile, expected, name, entry, tmp_path):
    for i in range(REPEAT):
        workdir = tmp_path / f"r{i}"
        workdir.mkdir()
        check_case(hostile, expected, name, entry, str(workdir), f"{entry}-{i}")


def test_there_are_at_least_24_behaviours():
    assert len(BEHAVIOURS) >= 24
    assert all(b.doc for b in BEHAVIOURS.values())


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_redirect_to_another_origin_carries_no_credential(hostile, expected, entry, tmp_path):
    case = f"cred-{entry}"
    check_case(hostile, expected, "redirect_other_origin", entry, str(tmp_path), case)
    first = hostile.requests_for("redirect_other_origin", case)
    assert first and all("SECRETHEADER" in r and "Authorization: Basic" in r for r in first)
    moved = hostile.other_requests_for(case)
    assert moved, "the redirect was not followed"
    for request in moved:
        lowered = request.lower()
        assert "authorization:" not in lowered and "cookie:" not in lowered and "x-api-key:" not in lowered, request
        assert not [s for s in SECRETS if s in request], request


def test_the_honest_control_reads_in_few_requests(hostile, expected, tmp_path):
    check_case(hostile, expected, "honest", "open", str(tmp_path), "count")
    # the first 64 KiB and the tail in one, then a request per tensor past the first 64 KiB
    assert len(hostile.requests_for("honest", "count")) <= 3


# --- apr download on the command line ----------------------------------------------------------
@pytest.mark.parametrize("name", ["endless_no_length", "redirect_ftp", "reflect_in_status_line",
                                  "status_100_forever", "length_conflict", "garbage"])
def test_apr_download_fails_cleanly(hostile, name, tmp_path, monkeypatch, capsys):
    from aprfast.cli import main

    monkeypatch.setenv("APR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("APR_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    start = time.monotonic()
    rc = main(["download", "--max-size", "4MiB", hostile.url(name, "cli")])
    assert time.monotonic() - start < CASE_SECONDS
    captured = capsys.readouterr()
    assert rc not in (0, None)
    assert "Traceback" not in captured.err
    assert not [s for s in SECRETS if s in captured.out + captured.err], captured.err
    assert _files(tmp_path / "cache") == [] if (tmp_path / "cache").exists() else True


# --- memory: the body-size behaviours in a child ------------------------------------------------
_CHILD = r"""
import gc, json, os, resource, sys, tempfile, shutil
sys.path.insert(0, sys.argv[1])
import test_hostile_http as t
from hostile_http import BEHAVIOURS, ENTRY_POINTS, HostileServer, payload
from aprfast import remote
from aprfast.errors import AprError
remote.RangedSource.backoff = 0.001

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key + ":"))

def reset_peak():
    # Linux: writing 5 to clear_refs sets the peak RSS (VmHWM) to the current RSS
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return status("VmRSS")

with HostileServer(payload()) as server:
    d = tempfile.mkdtemp()
    t.run_entry("open", server.url("honest", "warm"), d)  # imports, pools
    shutil.rmtree(d)
    out = {"payload": len(server.payload), "cases": []}
    for name in ["honest"] + json.loads(sys.argv[2]):
        for entry in ENTRY_POINTS:
            d = tempfile.mkdtemp()
            base = reset_peak()
            try:
                t.run_entry(entry, server.url(name, "mem-" + entry), d)
                outcome = "ok"
            except AprError as exc:
                outcome = type(exc).__name__
            except BaseException as exc:
                outcome = "UNTYPED " + type(exc).__name__
            grown = None if base is None else status("VmHWM") - base
            shutil.rmtree(d)
            out["cases"].append([name, entry, outcome, grown])
print(json.dumps(out))
"""

#: what a case may add to the peak RSS beyond the payload: download's 8 MiB buffer,
#: a part or two in flight, the allocator's slack
MEMORY_SLACK = 24 << 20


def test_body_size_behaviours_bound_memory(tmp_path):
    big = sorted(name for name, b in BEHAVIOURS.items() if b.big)
    assert len(big) >= 6
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(aprfast.__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__), json.dumps(big)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(report))  # shown with -s: the measurements
    for name, entry, outcome, grown in report["cases"]:
        assert not outcome.startswith("UNTYPED"), (name, entry, outcome)
        if grown is None:
            pytest.skip("no /proc/self/clear_refs to reset the peak RSS with")
        assert grown < report["payload"] + MEMORY_SLACK, \
            f"{name} / {entry}: peak RSS grew by {grown >> 20} MiB ({outcome})"
