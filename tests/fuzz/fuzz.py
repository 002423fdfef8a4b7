#!/usr/bin/env python3
"""atheris driver: ``python tests/fuzz/fuzz.py TARGET [libFuzzer flags] [CORPUS_DIR ...]``.

TARGET is one of tests/fuzz/harness.py's TARGETS (load, open, inspect, v1_load,
v1_inspect, v1_open, stream, pytorch, v2_security, gguf, safetensors, onnx, burnpack,
mle, v1_index, remote_index); the ``fuzz_<target>.py`` files beside this one are the same
with the target fixed (the last nine keep their target and seeds there).  Everything
after TARGET goes to libFuzzer, e.g.::

    python tests/fuzz/fuzz.py open -rss_limit_mb=2048 -timeout=10 -max_total_time=3600 \
        -artifact_prefix=crashes/ corpus/open

The oracle is harness.run_one: an AprError is a refusal, anything else is a finding
(uncaught: atheris prints the traceback and writes the input to crash-<sha1>).
Warnings are errors too, as in the test suite (pyproject's filterwarnings).
APRFAST_FUZZ_IGNORE_KNOWN=1 does not count the open bugs of harness.KNOWN_OPEN.

Big allocations: libFuzzer's -malloc_limit_mb needs a sanitizer's malloc hooks, which a
plain Python process lacks, and an untouched allocation never shows in the RSS.  So the
address space is capped at what the process uses after start-up plus
APRFAST_FUZZ_AS_HEADROOM_MB (default 2048, 0 = no cap; the cap is skipped under ASan,
which reserves terabytes): an input that makes aprfast ask for more gets a MemoryError,
which is a finding.
"""

from __future__ import annotations

import os
import resource
import sys
import warnings

import atheris

with atheris.instrument_imports(include=["aprfast"]):
    import aprfast  # noqa: F401
    import aprfast.api  # noqa: F401
    import aprfast.codecs  # noqa: F401
    import aprfast.codecs.blocks  # noqa: F401
    import aprfast.convert  # noqa: F401
    import aprfast.convert._common  # noqa: F401
    import aprfast.convert._pickle_vm  # noqa: F401
    import aprfast.convert._remote  # noqa: F401
    import aprfast.convert.burnpack  # noqa: F401
    import aprfast.convert.gguf  # noqa: F401
    import aprfast.convert.mle  # noqa: F401
    import aprfast.convert.onnx  # noqa: F401
    import aprfast.convert.pytorch  # noqa: F401
    import aprfast.convert.safetensors  # noqa: F401
    import aprfast.crypto  # noqa: F401
    import aprfast.dtypes  # noqa: F401
    import aprfast.files.reader  # noqa: F401
    import aprfast.files.shards  # noqa: F401
    import aprfast.io.sources  # noqa: F401
    import aprfast.layouts  # noqa: F401
    import aprfast.layouts.chunk_index  # noqa: F401
    import aprfast.layouts.rmp  # noqa: F401
    import aprfast.layouts.serde_json  # noqa: F401
    import aprfast.layouts.trueno  # noqa: F401
    import aprfast.numerics.quantization  # noqa: F401
    import aprfast.security  # noqa: F401
    import aprfast.stream  # noqa: F401
    import aprfast.tensors  # noqa: F401
    import aprfast.v1  # noqa: F401
    import aprfast.v1.chunks  # noqa: F401
    import aprfast.v1.licensing  # noqa: F401
    import aprfast.v1.load  # noqa: F401
    import aprfast.v1.reader  # noqa: F401

import harness  # noqa: E402  (imported after aprfast is instrumented)


def _cap_address_space() -> None:
    headroom = int(os.environ.get("APRFAST_FUZZ_AS_HEADROOM_MB", "2048"))
    if headroom <= 0 or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    with open("/proc/self/status") as f:
        vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = (vm_kb << 10) + (headroom << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def main(target_name: str, argv: list) -> None:
    target = harness.TARGETS[target_name]
    warnings.simplefilter("error")

    ignore_known = os.environ.get("APRFAST_FUZZ_IGNORE_KNOWN", "0") == "1"

    def one_input(data: bytes) -> None:
        harness.run_one(target, data, ignore_known=ignore_known)

    # libFuzzer's threads (RSS watcher) start in Setup/Fuzz; cap after imports.
    atheris.Setup(argv, one_input)
    _cap_address_space()
    with harness.fuzz_environment():
        atheris.Fuzz()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in harness.TARGETS:
        sys.exit(f"usage: {sys.argv[0]} TARGET [libFuzzer flags] [corpus ...]; targets: {', '.join(harness.TARGETS)}")
    main(sys.argv[1], [sys.argv[0]] + sys.argv[2:])
