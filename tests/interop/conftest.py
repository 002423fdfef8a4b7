"""Interop tests against the real Rust implementation of ``.apr`` (crates.io ``apr-format``).

The Rust side is the ``apr-interop`` harness in ``tests/interop/harness`` (see its
README.md).  It is built once per test session with
``cargo build --release --locked``.  Without cargo, or when the build fails (for
example because crates.io cannot be reached), every interop test is skipped, unless
``APRFAST_REQUIRE_INTEROP=1`` is set (CI sets it): then the skip becomes a failure,
so a broken toolchain can't turn the interop suite silently green.

Environment:

* ``APRFAST_INTEROP_TARGET``: cargo target directory (default ``tests/interop/harness/target``).
* ``APRFAST_REQUIRE_INTEROP=1``: fail instead of skipping when the harness can't be built.
* ``CARGO``: the cargo binary to use (default: ``cargo`` on PATH, then ``$CARGO_HOME/bin``
  or ``~/.cargo/bin``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HARNESS_DIR = Path(__file__).resolve().parent / "harness"
# A cold build takes about 40 s; fetching the crates first can take longer.
BUILD_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 60


def _required() -> bool:
    return os.environ.get("APRFAST_REQUIRE_INTEROP", "").strip() not in ("", "0")


def _unavailable(reason: str):
    """Skip (or, when the interop suite is required, fail) with ``reason``."""
    if _required():
        pytest.fail(f"APRFAST_REQUIRE_INTEROP is set but the interop harness is unavailable: {reason}",
                    pytrace=False)
    pytest.skip(f"interop harness unavailable: {reason} (set APRFAST_REQUIRE_INTEROP=1 to make this fail)")


def _find_cargo() -> str | None:
    explicit = os.environ.get("CARGO")
    if explicit and Path(explicit).is_file():
        return explicit
    found = shutil.which("cargo")
    if found:
        return found
    home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    candidate = home / "bin" / ("cargo.exe" if sys.platform == "win32" else "cargo")
    return str(candidate) if candidate.is_file() else None


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _say(config, line: str) -> None:
    """Print ``line`` on the terminal now, past pytest's capture: a cargo build runs inside a
    fixture, whose output pytest would otherwise hold back (and show only on failure)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        if reporter is not None:
            # start on a fresh line, not after the progress dots of the previous module
            writer = getattr(reporter, "_tw", None)
            if writer is not None and writer.width_of_current_line:
                reporter.write("\n")
            reporter.write_line(line)
        else:
            print(line, file=sys.stderr, flush=True)


def _build(config, harness_dir: Path, binary_name: str, target: Path) -> Path:
    """``cargo build --release --locked`` of the harness in ``harness_dir`` into ``target``;
    the binary's path, or a skip/failure by the policy of :func:`_unavailable`.  One line
    goes to the terminal before the build starts (a first build takes minutes)."""
    cargo = _find_cargo()
    if cargo is None:
        _unavailable("cargo was not found (not on PATH, not in $CARGO_HOME/bin or ~/.cargo/bin)")
    target = target.resolve()
    cmd = [cargo, "build", "--release", "--locked", "--manifest-path", str(harness_dir / "Cargo.toml"),
           "--target-dir", str(target)]
    _say(config, f"[interop] cargo build --release of {harness_dir.name} ({binary_name}): several minutes "
                 "the first time, seconds once built")
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=harness_dir)
    except subprocess.TimeoutExpired:
        _unavailable(f"`{' '.join(cmd)}` did not finish within {BUILD_TIMEOUT_S} s")
    except OSError as exc:
        _unavailable(f"cannot run {cargo}: {exc}")
    if proc.returncode != 0:
        _unavailable(f"`{' '.join(cmd)}` failed with exit status {proc.returncode} "
                     f"(no crates.io access?):\n{_tail(proc.stderr)}")
    binary = target / "release" / (binary_name + (".exe" if sys.platform == "win32" else ""))
    if not binary.is_file():
        _unavailable(f"cargo reported success but {binary} does not exist")
    build_seconds = time.monotonic() - started
    if build_seconds > 5:
        _say(config, f"[interop] built {binary_name} in {build_seconds:.1f} s")
    return binary


def _target_dir(harness_dir: Path, shared_subdir: str | None) -> Path:
    """``$APRFAST_INTEROP_TARGET`` (its ``shared_subdir`` for the second and third
    harness) when set, else the harness's own ``target/``."""
    shared = os.environ.get("APRFAST_INTEROP_TARGET")
    if shared:
        return Path(shared) / shared_subdir if shared_subdir else Path(shared)
    return harness_dir / "target"


@pytest.fixture(scope="session")
def harness_bin(pytestconfig) -> Path:
    """Path of the built ``apr-interop`` binary (built once per session)."""
    return _build(pytestconfig, HARNESS_DIR, "apr-interop", _target_dir(HARNESS_DIR, None))


class Harness:
    """Runs ``apr-interop`` subcommands; specs and outputs go to a per-test directory."""

    def __init__(self, binary: Path, workdir: Path):
        self.binary = binary
        self.workdir = workdir
        self._count = 0

    def path(self, stem: str, suffix: str) -> Path:
        self._count += 1
        return self.workdir / f"{stem}-{self._count}{suffix}"

    def run(self, *args) -> dict:
        """Run a subcommand that prints one JSON object; return it parsed."""
        return json.loads(self.run_text(*args))

    def run_text(self, *args) -> str:
        cmd = [str(self.binary), *(str(a) for a in args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited with {proc.returncode} (harness misuse):\n"
                                 f"{proc.stderr.strip()}")
        return proc.stdout

    def misuse(self, *args) -> str:
        """Run a subcommand that must be refused as harness misuse (exit 2); return stderr."""
        cmd = [str(self.binary), *(str(a) for a in args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 2, f"{' '.join(cmd)} exited with {proc.returncode}, not 2:\n{proc.stdout}"
        return proc.stderr

    def write_spec(self, spec: dict, stem: str = "spec") -> Path:
        path = self.path(stem, ".json")
        # ensure_ascii=False keeps text as UTF-8 (serde_json accepts escapes too);
        # allow_nan=False because JSON has no NaN and serde_json would refuse it.
        path.write_text(json.dumps(spec, ensure_ascii=False, allow_nan=False), encoding="utf-8")
        return path

    def write_v2(self, spec: dict, out: Path | None = None) -> tuple[dict, Path]:
        """``write-v2``: build a v2 file with AprV2Writer/AprV2StreamingWriter."""
        out = out or self.path("rust", ".apr")
        result = self.run("write-v2", self.write_spec(spec), out)
        return result, out

    def write_v2_bytes(self, spec: dict) -> bytes:
        """The bytes ``write-v2`` produced; fails the test if apr-format refused."""
        result, out = self.write_v2(spec)
        assert result["ok"], f"apr-format refused to write: {result}"
        return out.read_bytes()

    def read(self, target) -> dict:
        """``read``: what apr-format's reader sees in a file (a path, or bytes to store first)."""
        if isinstance(target, (bytes, bytearray, memoryview)):
            path = self.path("py", ".apr")
            path.write_bytes(bytes(target))
            target = path
        return self.run("read", target)

    def json_value(self, text: str) -> dict:
        """``json-value``: how serde_json parses and prints ``text``."""
        path = self.path("value", ".json")
        path.write_text(text, encoding="utf-8")
        return self.run("json-value", path)


@pytest.fixture
def harness(harness_bin, tmp_path) -> Harness:
    return Harness(harness_bin, tmp_path)


# --- the second harness: aprender-core's encrypted and signed v1 files ------------------
#
# ``apr-crypto-interop`` in ``tests/interop/harness-crypto`` (see its README.md) drives
# ``aprender::format::{save_encrypted, load_encrypted, save_for_recipient,
# load_as_recipient, save_signed, load_verified}`` from the crates.io crate aprender-core.
# It pulls in aprender's whole compute stack, so a cold build takes about 3 minutes.
# Same skip/fail policy as ``harness_bin``.  Its target directory is
# ``$APRFAST_INTEROP_TARGET/harness-crypto`` when that variable is set, else
# ``tests/interop/harness-crypto/target``.

CRYPTO_HARNESS_DIR = Path(__file__).resolve().parent / "harness-crypto"
CRYPTO_BINARY_NAME = "apr-crypto-interop"


@pytest.fixture(scope="session")
def crypto_harness_bin(pytestconfig) -> Path:
    """Path of the built ``apr-crypto-interop`` binary (built once per session)."""
    return _build(pytestconfig, CRYPTO_HARNESS_DIR, CRYPTO_BINARY_NAME,
                  _target_dir(CRYPTO_HARNESS_DIR, "harness-crypto"))


# --- the third harness: Burn's Burnpack format ---------------------------------------------
#
# ``burnpack-interop`` in ``tests/interop/harness-burnpack`` (see its README.md) drives the
# crates.io crate ``burn-pack`` (Burn's Burnpack reader and writer).  A cold build is about
# 2 CPU-minutes: 4-5.5 min of wall time here, on 2 cores shared with other builds.  Same skip/fail policy as
# ``harness_bin``.  Its target directory is ``$APRFAST_INTEROP_TARGET/harness-burnpack`` when
# that variable is set, else ``tests/interop/harness-burnpack/target``.

BURNPACK_HARNESS_DIR = Path(__file__).resolve().parent / "harness-burnpack"
BURNPACK_BINARY_NAME = "burnpack-interop"


@pytest.fixture(scope="session")
def burnpack_bin(pytestconfig) -> Path:
    """Path of the built ``burnpack-interop`` binary (built once per session)."""
    return _build(pytestconfig, BURNPACK_HARNESS_DIR, BURNPACK_BINARY_NAME,
                  _target_dir(BURNPACK_HARNESS_DIR, "harness-burnpack"))


@pytest.fixture
def burnpack(burnpack_bin, tmp_path) -> Harness:
    return Harness(burnpack_bin, tmp_path)
