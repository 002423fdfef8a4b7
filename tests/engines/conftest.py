"""The engine tests: models aprfast converts must run in llama.cpp and transformers.

Toolchain (installed by ``.ci/run``; see tests/engines/README.md):

* transformers (with torch and tokenizers): builds the tiny models and is the oracle
  for Hugging Face logits and loading;
* llama-cpp-python built from its sdist (CPU only): llama.cpp's own logits;
* llama.cpp's ``convert_hf_to_gguf.py`` from that sdist's ``vendor/llama.cpp``, found
  through ``APRFAST_LLAMA_CPP_SRC`` (the sdist's root or its ``vendor/llama.cpp``):
  the second oracle for what a GGUF of each model holds.

Each missing piece skips the tests that need it with the reason, unless
``APRFAST_REQUIRE_ENGINES=1`` (CI sets it): then the skip is a failure, so a broken
toolchain cannot turn these tests silently green.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _required() -> bool:
    return os.environ.get("APRFAST_REQUIRE_ENGINES", "").strip() not in ("", "0")


def unavailable(reason: str):
    """Skip (or, when the engines are required, fail) with ``reason``."""
    if _required():
        pytest.fail(f"APRFAST_REQUIRE_ENGINES is set but {reason}", pytrace=False)
    pytest.skip(f"{reason} (set APRFAST_REQUIRE_ENGINES=1 to make this fail)")


@pytest.fixture(scope="session")
def transformers_lib():
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        unavailable(f"transformers, tokenizers and torch are needed ({exc})")
    return transformers


@pytest.fixture(scope="session")
def transformers_gguf(transformers_lib):
    """transformers able to load a GGUF (``from_pretrained(dir, gguf_file=...)``): it
    needs the ``gguf`` package, and ``accelerate`` for the model."""
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as exc:
        unavailable(f"transformers' GGUF loader needs gguf and accelerate ({exc})")
    return transformers_lib


@pytest.fixture(scope="session")
def llama_cpp_lib():
    try:
        import llama_cpp
    except ImportError as exc:
        unavailable(f"llama-cpp-python is not installed ({exc})")
    return llama_cpp


def _llama_cpp_source() -> Path | None:
    root = os.environ.get("APRFAST_LLAMA_CPP_SRC")
    if not root:
        return None
    for candidate in (Path(root), Path(root) / "vendor" / "llama.cpp"):
        if (candidate / "convert_hf_to_gguf.py").is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def reference_converter(transformers_lib):
    """``convert(model_dir, out, outtype, pre)``: llama.cpp's convert_hf_to_gguf.py."""
    source = _llama_cpp_source()
    if source is None:
        unavailable("llama.cpp's convert_hf_to_gguf.py was not found (APRFAST_LLAMA_CPP_SRC: the "
                    "llama-cpp-python sdist's root or its vendor/llama.cpp)")

    def convert(model_dir, out, outtype, pre):
        result = subprocess.run([sys.executable, str(HERE / "reference_convert.py"), str(source), str(model_dir),
                                 str(out), outtype, pre], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return out

    return convert


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, transformers_lib):
    """``tiny_model(arch)``: (directory, transformers model) of the tiny checkpoint,
    built once per session."""
    import tiny_models

    built = {}

    def get(arch):
        if arch not in built:
            directory = tmp_path_factory.mktemp(f"hf-{arch}")
            built[arch] = (directory, tiny_models.make_model(arch, directory))
        return built[arch]

    return get
