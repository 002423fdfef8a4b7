"""Optional dependencies, imported when a feature needs them.

The core (the v2 layouts, zero-copy reads, quantization kernels) needs NumPy only.
Everything else is an extra, and asking for a feature whose package is missing raises
:class:`MissingDependencyError` (an ImportError) that names the feature and the exact
``pip install`` line, instead of failing at ``import aprfast`` or with a bare
ModuleNotFoundError deep inside a call.  The extras are declared in pyproject.toml;
``EXTRAS`` here must name the same ones (tests/test_optional_dependencies.py checks).
"""

from __future__ import annotations

import importlib

__all__ = ["MissingDependencyError", "require", "EXTRAS"]

#: module -> (extra that brings it, what needs it)
EXTRAS = {
    "msgpack": ("v1", "v1 (APRN) container metadata"),
    "zstandard": ("compression", "zstd compression"),
    "lz4": ("compression", "LZ4 compression"),
    "nacl": ("crypto", "encryption and signing"),
    "argon2": ("crypto", "password-based encryption (Argon2id)"),
    "cryptography": ("keyfiles", "PEM/OpenSSH key files"),
    "blake3": ("blake3", "BLAKE3 digests"),
    "onnx": ("onnx", "ONNX import"),
    "cbor2": ("burnpack", "Burnpack (Burn) conversion"),
    "rich": ("cli", "progress bars"),
    "fsspec": ("remote", "remote files (fsspec URLs such as s3://)"),
    "s3fs": ("remote", "s3:// files"),
    "huggingface_hub": ("hf", "hf:// models"),
    "textual": ("tui", "the terminal UI (apr tui)"),
    "torch": ("torch", "torch tensors (aprfast.torch, safe_open(framework='pt'))"),
    "jax": ("jax", "JAX arrays (aprfast.jax, safe_open(framework='jax'))"),
    "model_signing": ("signing", "OpenSSF model signing (Sigstore bundles)"),
}


class MissingDependencyError(ImportError):
    """A feature's optional package is not installed; the message says what to install."""


def require(module: str):
    """``importlib.import_module(module)``, or MissingDependencyError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra, feature = EXTRAS.get(top, (None, module))
        package = {"nacl": "pynacl", "argon2": "argon2-cffi", "model_signing": "model-signing"}.get(top, top)
        hint = f"pip install 'aprfast[{extra}]' (or pip install {package})" if extra else f"pip install {package}"
        raise MissingDependencyError(f"{feature} needs the '{package}' package, which is not installed: "
                                     f"{hint}") from exc
