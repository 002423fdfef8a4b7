"""Signatures in the ecosystem's standard: OpenSSF model signing (Sigstore bundles),
signed and verified offline with a local ECDSA key.

The OpenSSF model-signing format (the ``model-signing`` package, its ``model_signing``
CLI) signs a model directory or a single file: every regular file under the path is
hashed (SHA-256 by default), the list of ``(relative name, digest)`` pairs becomes an
in-toto statement (predicate ``https://model_signing/signature/v1.0``), the statement is
signed as a DSSE envelope, and the envelope is stored in a Sigstore bundle
(``application/vnd.dev.sigstore.bundle.v0.3+json``) beside the model.  docs/FORMAT.md
("Sigstore bundles") says what a bundle covers for an ``.apr`` file and for a sharded
model.

The work is done by the ``model-signing`` package itself (``pip install 'aprfast[signing]'``),
not by a copy of it here: it is the format's reference implementation, kept by the
Sigstore and OpenSSF maintainers, so the bundles aprfast writes are the ones every other
verifier reads, and a change of the format reaches aprfast by upgrading the package.  Its
``key`` method (``use_elliptic_key_signer`` / ``use_elliptic_key_verifier``) touches no
network: no Fulcio certificate, no Rekor log entry, no TUF trust root (importing it opens
no connection either; tests/test_model_signing_interop.py runs it with the network
refused).  It takes ECDSA keys on P-256, P-384 and P-521 only, not Ed25519: ``apr keygen
PATH --type ecdsa-p256`` (:mod:`aprfast.crypto.ecdsa`) makes one.

What aprfast adds: typed errors (a :class:`~aprfast.errors.SignatureError` naming the
changed, added and removed files, a key that is not ECDSA named as such), atomic bundle
writes, the bundle itself left out of a directory's manifest when it is written inside
it, and the ``apr sign --format sigstore`` / ``apr verify --bundle`` commands.  Whether a
bundle is accepted is always the package's decision; aprfast's own reading of the bundle
only explains a refusal.

``model_signing`` is imported on the first call, never by ``import aprfast``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Union

from .._optional import require
from ..errors import AprFileNotFoundError, SignatureError, os_error

__all__ = ["sign_model", "verify_model", "read_bundle", "ModelTamperedError", "BundleError", "FORMATS",
           "BUNDLE_MEDIA_TYPE", "PREDICATE_TYPE", "default_bundle"]

#: the formats :func:`sign_model` writes
FORMATS = ("sigstore",)
#: the Sigstore bundle media type model_signing writes and requires for the key method
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
#: the in-toto predicate type of a model signature (model_signing 1.0 and later)
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
_PREDICATE_TYPE_COMPAT = "https://model_signing/Digests/v0.1"  # model_signing 0.2's statements
_PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: a bundle lists one name and digest per file (about 150 bytes each); 256 MiB is over a
#: million files, and refusing more keeps a hostile bundle from filling memory
MAX_BUNDLE_SIZE = 256 << 20
PathLike = Union[str, "os.PathLike[str]"]
_NAMES_SHOWN = 10  # names an error message lists per kind of change (all are in its attributes)


class BundleError(SignatureError):
    """E006: the bundle is not a model-signing Sigstore bundle this verifier reads."""


class ModelTamperedError(SignatureError):
    """E006: the bundle's signature is valid but the model's files are not the ones it
    signed.  ``changed``, ``added`` and ``removed`` are the files' names relative to the
    model directory (``"."`` for a single-file model); ``path`` is the first of them."""

    def __init__(self, message: str, *, path=None, changed=(), added=(), removed=()):
        super().__init__(message, path=path)
        self.changed, self.added, self.removed = tuple(changed), tuple(added), tuple(removed)

    def __reduce__(self):
        return (_rebuild_tampered, (self.message, self.path, self.changed, self.added, self.removed))


def _rebuild_tampered(message, path, changed, added, removed):
    return ModelTamperedError(message, path=path, changed=changed, added=added, removed=removed)


def _model_signing():
    """The model_signing package, imported on first use (it loads sigstore, pydantic and
    protobuf: about half a second, which ``import aprfast`` must never pay)."""
    package = require("model_signing")
    require("model_signing.signing")
    require("model_signing.verifying")
    require("model_signing.hashing")
    return package


def _model_path(path) -> Path:
    model = Path(os.fspath(path))
    if not model.exists():
        raise AprFileNotFoundError("no such model file or directory", path=model)
    if model.is_file() and model.name.endswith(".index.json"):
        raise ValueError(f"{model} is a sharded model's index, which covers its shards by CRC32 only: sign "
                         f"the directory that holds it and its shards ({model.parent})")
    return model


def default_bundle(path: PathLike) -> Path:
    """Where a model's bundle goes unless told: beside the model, never inside a
    directory model (``model.apr`` -> ``model.apr.sig``, ``llama/`` -> ``llama.sig``).

    Args:
        path: the model directory or file.

    Returns:
        The bundle's path.
    """
    model = Path(os.fspath(path))
    if model.name in ("", ".", ".."):
        model = Path(os.path.abspath(model))
    return model.parent / (model.name + ".sig")


def _relative_inside(model: Path, path: Path) -> Optional[str]:
    """``path`` relative to the directory ``model`` (POSIX separators) when inside it."""
    if not model.is_dir():
        return None
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(model)).as_posix()
    except ValueError:
        return None


def _ignored(model: Path, ignore_paths: Iterable, bundle: Path) -> list:
    ignored = []
    for entry in ignore_paths:
        entry = Path(os.fspath(entry))
        relative = _relative_inside(model, entry) if entry.is_absolute() else entry.as_posix()
        if relative is not None:
            ignored.append(relative)
    inside = _relative_inside(model, bundle)
    if inside is not None:
        ignored.append(inside)  # a bundle inside the model must not sign itself (as model_signing's CLI)
    return ignored


def sign_model(path: PathLike, key: PathLike, format: str = "sigstore",  # noqa: A002
               output: Optional[PathLike] = None, *, password: Optional[Union[str, bytes]] = None,
               ignore_paths: Iterable = (), ignore_git_paths: bool = True, allow_symlinks: bool = False) -> dict:
    """Sign a model directory or file with an ECDSA key, writing an OpenSSF
    model-signing Sigstore bundle that ``model_signing verify key`` accepts.

    Every regular file under ``path`` (or the one file) is hashed with SHA-256 and the
    list is signed; the bundle replaces ``output`` atomically.  Nothing is sent anywhere.

    Args:
        path: a model directory (a sharded model's directory, a Hugging Face style
            folder...) or a single file such as an ``.apr``.
        key: the ECDSA private key PEM file (P-256, P-384 or P-521; ``apr keygen PATH
            --type ecdsa-p256`` makes one, so does ``openssl ecparam -genkey``).
        format: "sigstore", the one format written here (the ``.apr`` file's own Ed25519
            signature is :func:`aprfast.tools.protection.sign_file`).
        output: the bundle to write; default ``path + ".sig"`` beside the model (for a
            directory ``llama/``: ``llama.sig``).  A bundle written inside the model
            directory is left out of what it signs, as model_signing's CLI does.
        password: the private key's password when its PEM is encrypted.
        ignore_paths: paths (relative to the model directory, or absolute inside it)
            left out of the signature; they are recorded in the bundle.
        ignore_git_paths: leave ``.git``, ``.github``, ``.gitattributes`` and
            ``.gitignore`` out (model_signing's default).
        allow_symlinks: follow symbolic links (refused by default, as model_signing does).

    Returns:
        ``{"model", "bundle", "format", "files", "digest", "key_hint"}``: ``files`` the
        signed names, ``digest`` the statement's root SHA-256 over the files' digests,
        ``key_hint`` the SHA-256 of the public key PEM that the bundle names.

    Raises:
        AprFileNotFoundError: the model does not exist.
        FormatError: the key file is not an ECDSA key on a supported curve (an Ed25519
            key says so), or its password is wrong.
        ValueError: an unknown format, a symbolic link without ``allow_symlinks``, a
            sharded model's ``.index.json`` given instead of its directory, or an
            ``output`` that is the model itself or a directory.
        MissingDependencyError: the model-signing package is not installed
            (``pip install 'aprfast[signing]'``).

    Examples:
        >>> import aprfast
        >>> aprfast.sign_model("llama/", "signing.key")  # doctest: +SKIP
        {'model': 'llama', 'bundle': 'llama.sig', 'format': 'sigstore', ...}
    """
    if format not in FORMATS:
        raise ValueError(f"format={format!r}: sign_model writes {', '.join(FORMATS)} (the .apr signature is "
                         "aprfast.tools.protection.sign_file)")
    from ..crypto.ecdsa import key_hint, load_ecdsa_private_key

    model = _model_path(path)
    bundle = Path(os.fspath(output)) if output is not None else default_bundle(model)
    if os.path.abspath(bundle) == os.path.abspath(model) or bundle.is_dir():
        raise ValueError(f"output={os.fspath(bundle)!r} is the model itself or a directory: the bundle is a file "
                         "of its own (default: the model's path + '.sig')")
    private_key = load_ecdsa_private_key(key, password=password)  # typed errors before model_signing's
    ms = _model_signing()
    hashing_config = (ms.hashing.Config()
                      .set_ignored_paths(paths=_ignored(model, ignore_paths, bundle), ignore_git_paths=ignore_git_paths)
                      .set_allow_symlinks(allow_symlinks))
    secret = None if password is None else (password.encode("utf-8") if isinstance(password, str) else password)
    with tempfile.TemporaryDirectory(prefix="aprfast-sign-") as scratch:
        # model_signing writes the bundle with a plain write_text; it goes to a private
        # scratch file first (outside the model, so never hashed) and reaches ``output``
        # whole or not at all
        scratch_bundle = Path(scratch) / "bundle.sig"
        try:
            (ms.signing.Config().use_elliptic_key_signer(private_key=os.fspath(key), password=secret)
             .set_hashing_config(hashing_config).sign(model, scratch_bundle))
        except OSError as exc:
            raise os_error(exc, f"cannot read the model: {exc.strerror or exc}", path=exc.filename or model) from exc
        data = scratch_bundle.read_bytes()
    _write_atomically(bundle, data)
    statement = _statement(json.loads(data), bundle)
    return {"model": str(model), "bundle": str(bundle), "format": "sigstore",
            "files": sorted(_resources(statement, bundle)), "digest": _root_digest(statement),
            "key_hint": key_hint(private_key.public_key())}


def _write_atomically(path: Path, data: bytes) -> None:
    from ..io.atomic import AtomicFile

    target = AtomicFile(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(target.fd, view):]
    except OSError as exc:
        target.abort()
        raise os_error(exc, f"cannot write the bundle: {exc.strerror or exc}", path=path) from exc
    except BaseException:
        target.abort()
        raise
    target.commit()


def read_bundle(bundle: PathLike) -> dict:
    """Read a model-signing bundle without verifying it: what it claims, for display.

    Args:
        bundle: the bundle file.

    Returns:
        ``{"bundle", "media_type", "key_hint", "model_name", "digest", "serialization",
        "files"}``; ``files`` maps each signed name to its ``(algorithm, hex digest)``.
        Nothing here is trusted until :func:`verify_model` accepted the bundle.

    Raises:
        BundleError: not a JSON Sigstore bundle with a DSSE in-toto statement of a model
            signature, or larger than ``MAX_BUNDLE_SIZE``.
        AprIOError: the file cannot be read.
    """
    bundle = Path(os.fspath(bundle))
    document = _load_bundle(bundle)
    statement = _statement(document, bundle)
    public_key = document.get("verificationMaterial", {}).get("publicKey") or {}
    return {"bundle": str(bundle), "media_type": document.get("mediaType"),
            "key_hint": public_key.get("hint") if isinstance(public_key, dict) else None,
            "model_name": _subject(statement).get("name"), "digest": _root_digest(statement),
            "serialization": _serialization(statement), "files": _resources(statement, bundle)}


def _load_bundle(bundle: Path) -> dict:
    try:
        with open(bundle, "rb") as handle:
            data = handle.read(MAX_BUNDLE_SIZE + 1)
    except OSError as exc:
        raise os_error(exc, f"cannot read the bundle: {exc.strerror or exc}", path=bundle) from exc
    if len(data) > MAX_BUNDLE_SIZE:
        raise BundleError(f"larger than {MAX_BUNDLE_SIZE} bytes: not a model-signing bundle", path=bundle)
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: [[[[... nested deep
        raise BundleError(f"not a JSON Sigstore bundle: {type(exc).__name__}: {exc}", path=bundle) from exc
    if not isinstance(document, dict) or not isinstance(document.get("dsseEnvelope"), dict):
        raise BundleError("not a Sigstore bundle holding a DSSE envelope (model_signing's key method writes one)",
                          path=bundle)
    return document


def _envelope(document: dict, bundle: Path):
    envelope = document["dsseEnvelope"]
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = envelope["signatures"]
        signature = base64.b64decode(signatures[0]["sig"], validate=True)
        payload_type = envelope["payloadType"]
    except (KeyError, IndexError, TypeError, ValueError, binascii.Error) as exc:
        raise BundleError(f"a malformed DSSE envelope ({type(exc).__name__}: {exc})", path=bundle) from exc
    return payload_type, payload, signature


def _statement(document: dict, bundle: Path) -> dict:
    payload_type, payload, _ = _envelope(document, bundle)
    if payload_type != _PAYLOAD_TYPE:
        raise BundleError(f"the envelope holds {payload_type!r}, not an in-toto statement", path=bundle)
    try:
        statement = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BundleError(f"the envelope's statement is not JSON: {exc}", path=bundle) from exc
    if not isinstance(statement, dict) or statement.get("predicateType") not in (PREDICATE_TYPE,
                                                                                _PREDICATE_TYPE_COMPAT):
        kind = statement.get("predicateType") if isinstance(statement, dict) else type(statement).__name__
        raise BundleError(f"the statement is {kind!r}, not a model signature ({PREDICATE_TYPE})", path=bundle)
    return statement


def _subject(statement: dict) -> dict:
    subjects = statement.get("subject")
    return subjects[0] if isinstance(subjects, list) and subjects and isinstance(subjects[0], dict) else {}


def _root_digest(statement: dict) -> Optional[str]:
    digest = _subject(statement).get("digest")
    return digest.get("sha256") if isinstance(digest, dict) else None


def _serialization(statement: dict) -> dict:
    predicate = statement.get("predicate")
    serialization = predicate.get("serialization") if isinstance(predicate, dict) else None
    # model_signing 0.2 statements record no serialization: files, SHA-256, no symlinks
    return serialization if isinstance(serialization, dict) else {"method": "files", "hash_type": "sha256",
                                                                  "allow_symlinks": False}


def _resources(statement: dict, bundle: Path) -> dict:
    """name -> (algorithm, hex digest) of every signed resource."""
    if statement.get("predicateType") == _PREDICATE_TYPE_COMPAT:
        entries = [{"name": s.get("name"), "algorithm": "sha256", "digest": (s.get("digest") or {}).get("sha256")}
                   for s in statement.get("subject") or () if isinstance(s, dict)]
    else:
        predicate = statement.get("predicate")
        entries = predicate.get("resources") if isinstance(predicate, dict) else None
    if not isinstance(entries, list):
        raise BundleError("the statement lists no resources", path=bundle)
    resources = {}
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("digest"), str)):
            raise BundleError(f"a malformed resource in the statement: {str(entry)[:200]}", path=bundle)
        resources[entry["name"]] = (str(entry.get("algorithm")), entry["digest"])
    return resources


def _truthy(value) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _hashing_config(ms, serialization: dict, ignored: list, ignore_git_paths: bool, bundle: Path):
    """The hashing model_signing must redo, from what the bundle says was done."""
    method = serialization.get("method")
    algorithm = serialization.get("hash_type", "sha256")
    allow_symlinks = _truthy(serialization.get("allow_symlinks", False))
    config = ms.hashing.Config()
    try:
        if method == "files":
            config.use_file_serialization(hashing_algorithm=algorithm, allow_symlinks=allow_symlinks)
        elif method == "shards":
            config.use_shard_serialization(hashing_algorithm=algorithm, shard_size=int(serialization["shard_size"]),
                                           allow_symlinks=allow_symlinks)
        else:
            raise BundleError(f"an unknown serialization method {method!r}", path=bundle)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"an unusable serialization {serialization}: {exc}", path=bundle) from exc
    recorded = serialization.get("ignore_paths") or []
    paths = [p for p in recorded if isinstance(p, str)] + list(ignored)
    return config.set_ignored_paths(paths=paths, ignore_git_paths=ignore_git_paths).set_allow_symlinks(allow_symlinks)


def verify_model(path: PathLike, bundle: Optional[PathLike] = None, public_key: Optional[PathLike] = None, *,
                 ignore_paths: Iterable = (), ignore_git_paths: bool = True,
                 ignore_unsigned_files: bool = False) -> dict:
    """Verify a model directory or file against an OpenSSF model-signing bundle (from
    :func:`sign_model` or ``model_signing sign key``) with the signer's ECDSA public key.

    The bundle's signature is checked with the key, every file is hashed again, and the
    two lists must match exactly: a file changed, added or removed fails.  Offline.

    Args:
        path: the model directory or file that was signed.
        bundle: the bundle; default ``path + ".sig"`` (where :func:`sign_model` writes it).
            A bundle inside the model directory is left out of the comparison.
        public_key: the signer's ECDSA public key PEM file (required: the key method's
            bundles name their key by a hash only).
        ignore_paths: paths (relative to the model directory) left out of the
            comparison, besides those the bundle records.
        ignore_git_paths: leave git's files out (model_signing's default).
        ignore_unsigned_files: compare only the files the bundle lists (files added since
            are not an error), as ``model_signing verify --ignore_unsigned_files``.

    Returns:
        ``{"model", "bundle", "valid": True, "files", "digest", "key_hint",
        "model_name"}``; ``files`` is the number of files checked.

    Raises:
        ModelTamperedError: a SignatureError (E006) naming the changed, added and removed
            files when the signature is valid but the files differ.
        SignatureError: the bundle was signed by another key, or its signature does not
            verify (the bundle was altered).
        BundleError: a SignatureError for a file that is not a model-signing bundle.
        FormatError: the public key is not an ECDSA key on P-256/P-384/P-521.
        AprFileNotFoundError: the model or the bundle does not exist.
        MissingDependencyError: the model-signing package is not installed.

    Examples:
        >>> import aprfast
        >>> aprfast.verify_model("llama/", "llama.sig", "signing.key.pub")  # doctest: +SKIP
        {'model': 'llama', 'bundle': 'llama.sig', 'valid': True, 'files': 3, ...}
    """
    from ..crypto.ecdsa import key_hint, load_ecdsa_public_key

    if public_key is None:
        raise ValueError("public_key= is required: the signer's ECDSA public key PEM file")
    model = Path(os.fspath(path))
    if not model.exists():
        raise AprFileNotFoundError("no such model file or directory", path=model)
    bundle = Path(os.fspath(bundle)) if bundle is not None else default_bundle(model)
    key = load_ecdsa_public_key(public_key)
    document = _load_bundle(bundle)
    statement = _statement(document, bundle)
    hint = key_hint(key)
    material = document.get("verificationMaterial")
    named = ((material.get("publicKey") or {}).get("hint") if isinstance(material, dict)
             and isinstance(material.get("publicKey"), dict) else None)
    if named and named != hint:
        raise SignatureError(f"the bundle was signed by another key: it names key {named}, and {public_key} is "
                             f"key {hint}", path=bundle)
    if document.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise BundleError(f"media type {document.get('mediaType')!r}: the key method's bundles are "
                          f"{BUNDLE_MEDIA_TYPE}", path=bundle)
    ms = _model_signing()
    ignored = _ignored(model, ignore_paths, bundle)
    config = _hashing_config(ms, _serialization(statement), ignored, ignore_git_paths, bundle)
    verifier = (ms.verifying.Config().use_elliptic_key_verifier(public_key=os.fspath(public_key))
                .set_hashing_config(config))
    if ignore_unsigned_files:
        verifier.set_ignore_unsigned_files(True)
    try:
        verifier.verify(model, bundle)
    except OSError as exc:
        raise os_error(exc, f"cannot read the model: {exc.strerror or exc}", path=exc.filename or model) from exc
    except Exception as exc:  # model_signing refused: ValueError, cryptography's InvalidSignature, ...
        raise _explain_refusal(exc, ms, model, bundle, document, statement, key, ignored, ignore_git_paths,
                               ignore_unsigned_files) from exc
    resources = _resources(statement, bundle)
    return {"model": str(model), "bundle": str(bundle), "valid": True, "files": len(resources),
            "digest": _root_digest(statement), "key_hint": hint, "model_name": _subject(statement).get("name")}


def _dsse_signature_valid(key, payload: bytes, signature: bytes) -> bool:
    """DSSE v1's pre-authentication encoding, checked with the key: only to tell a
    forged or altered bundle from a changed model after model_signing refused."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    digest = {256: hashes.SHA256, 384: hashes.SHA384, 521: hashes.SHA512}[key.curve.key_size]()
    pae = b"DSSEv1 %d %s %d %s" % (len(_PAYLOAD_TYPE), _PAYLOAD_TYPE.encode(), len(payload), payload)
    try:
        key.verify(signature, pae, ec.ECDSA(digest))
        return True
    except InvalidSignature:
        return False


def _explain_refusal(exc, ms, model, bundle, document, statement, key, ignored, ignore_git_paths,
                     ignore_unsigned_files) -> SignatureError:
    _, payload, signature = _envelope(document, bundle)
    if not _dsse_signature_valid(key, payload, signature):
        return SignatureError("the bundle's signature does not verify with this key: the bundle was altered, or "
                              "signed by another key", path=bundle)
    expected = _resources(statement, bundle)
    serialization = _serialization(statement)
    config = _hashing_config(ms, serialization, ignored, ignore_git_paths, bundle)
    files_to_hash = None
    if ignore_unsigned_files:
        files_to_hash = [model / _file_of(name, serialization) for name in expected]
    try:
        actual_manifest = config.hash(model, files_to_hash=files_to_hash)
    except OSError as error:
        return os_error(error, f"cannot read the model: {error.strerror or error}", path=error.filename or model)
    except ValueError as error:  # a symbolic link where the signer allowed none, ...
        return SignatureError(f"the model cannot be hashed as it was signed: {error}", path=model)
    actual = {d.identifier: d.digest.digest_hex for d in actual_manifest.resource_descriptors()}
    wanted = {name: digest for name, (_, digest) in expected.items()}
    by_file = serialization.get("method") == "shards"

    def files(names):
        return sorted({_file_of(n, serialization) if by_file else n for n in names})

    changed = files(n for n in wanted.keys() & actual.keys() if wanted[n] != actual[n])
    added = [n for n in files(actual.keys() - wanted.keys()) if n not in changed]
    removed = [n for n in files(wanted.keys() - actual.keys()) if n not in changed]
    if not (changed or added or removed):
        return SignatureError(f"model_signing refused the bundle: {exc}", path=bundle)
    parts = []
    for what, names in (("changed", changed), ("added", added), ("removed", removed)):
        if names:
            shown = ", ".join(names[:_NAMES_SHOWN]) + (f" and {len(names) - _NAMES_SHOWN} more"
                                                       if len(names) > _NAMES_SHOWN else "")
            parts.append(f"{what}: {shown}")
    first = (changed or added or removed)[0]
    where = model if first == "." else model / first
    return ModelTamperedError(f"the model does not match its signature ({bundle}): " + "; ".join(parts),
                              path=where, changed=changed, added=added, removed=removed)


def _file_of(name: str, serialization: dict) -> str:
    """A manifest name's file: shard names are ``file:start:end``."""
    if serialization.get("method") == "shards":
        return name.rsplit(":", 2)[0]
    return name

