"""Sign, verify, encrypt and decrypt whole model files, and make key pairs: the
library side of ``apr sign / verify / encrypt / decrypt / keygen``.

Each function looks at the file's magic and hands it to the container's
implementation.  v1 (``APRN``) files are done here over :mod:`aprfast.v1` and its
byte layout; v2 files (``APR2``/``APR\\0``) are refused with NotImplementedError
until the v2 encryption and signing API exists (:data:`V2_PENDING` says what is
missing; a v2 implementation plugs in as another entry of ``_CONTAINERS``).

* :func:`sign_file` signs a v1 file where it lies, byte for byte: the header gains
  SIGNED, the Ed25519 signature over header || metadata || stored payload and the
  public key are appended, the CRC32 is recomputed.  Metadata and payload (encrypted
  or not) are copied unchanged, so signing needs no decryption key.
* :func:`verify_file` checks the CRC32 and the signature without decrypting anything.
* :func:`encrypt_file` / :func:`decrypt_file` load the model and save it again with
  or without encryption (the payload changes, so a signature over it cannot survive:
  pass ``signing_key`` to sign the result).
* :func:`generate_keypair` writes a private key file (mode 0600) and its public key.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

from .errors import AprIOError, FormatError, SignatureError, os_error

__all__ = ["sign_file", "verify_file", "encrypt_file", "decrypt_file", "generate_keypair", "container_of",
           "V2_PENDING"]

V1_MAGIC = b"APRN"
V2_MAGICS = (b"APR2", b"APR\0")
#: What v2 needs before these operations can accept it.
V2_PENDING = ("v2 files have no signature or encryption fields yet: sign/verify/encrypt/decrypt of v2 files "
              "needs the v2 encryption and signing API (being built); use a v1 (APRN) file meanwhile")
#: Key kinds generate_keypair makes, by purpose.
KEYPAIR_KINDS = {"ed25519": "signing (sign, verify)", "x25519": "encryption to a recipient (encrypt, decrypt)"}


def container_of(path) -> str:
    """"v1" or "v2" from the file's first four bytes; FormatError for anything else."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise os_error(exc, "cannot open the model", path=path) from exc
    if magic == V1_MAGIC:
        return "v1"
    if magic in V2_MAGICS:
        return "v2"
    raise FormatError(f"not an .apr file (magic {magic!r})", path=path)


def _require_v1(path) -> None:
    if container_of(path) == "v2":
        raise NotImplementedError(V2_PENDING)


def _refuse_existing(path, force: bool) -> None:
    from .convert import DestinationExistsError

    if os.path.lexists(path) and not force:
        raise DestinationExistsError("output exists; pass force=True to replace it", path=path)


# --- reading a v1 file's regions without decrypting --------------------------------
class _V1Bytes:
    """A v1 file mapped read-only, its CRC checked and its regions located."""

    def __init__(self, path):
        from .layouts import chunk_index
        from .layouts import v1 as layout

        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < layout.HEADER_SIZE + layout.CRC_SIZE:
                    raise FormatError(f"{size} bytes is too short for a v1 file", path=self.path)
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise os_error(exc, "cannot read the model", path=self.path) from exc
        self.view = memoryview(self._map)
        layout.check_crc(self.view, path=self.path)
        self.header = layout.Header.from_bytes(self.view[:layout.HEADER_SIZE], path=self.path)
        index_size = None
        if self.header.flag_set & layout.Flag.STREAMING:
            start = layout.HEADER_SIZE + self.header.metadata_size
            head = bytes(self.view[start:start + chunk_index.HEADER_SIZE])
            index_size = chunk_index.peek_size(head, path=self.path)
        self.regions = layout.locate(self.header, len(self.view), path=self.path, index_size=index_size)

    def region(self, span):
        return self.view[span[0]:span[1]]

    def close(self) -> None:
        self.view.release()
        self._map.close()


def _signature_state(f: _V1Bytes, trusted_keys) -> dict:
    from . import crypto
    from .layouts import v1 as layout

    start, end = f.regions.signature
    signature = bytes(f.view[start:end])
    signer = bytes(f.view[end:end + layout.PUBLIC_KEY_SIZE])
    try:
        crypto.verify([f.view[:f.regions.signed_end]], signature, signer)
    except SignatureError as exc:
        raise SignatureError(f"signature does not verify: {exc.message}", path=f.path) from None
    trusted = None
    if trusted_keys:
        trusted = signer in {bytes(k) for k in trusted_keys}
        if not trusted:
            raise SignatureError(f"signed by key {signer.hex()}, which is not among the {len(trusted_keys)} "
                                 "trusted key(s)", path=f.path)
    return {"signer": signer.hex(), "trusted": trusted}


# --- the operations ------------------------------------------------------------------
def verify_file(path, *, trusted_keys=None, require_signature: bool = True) -> dict:
    """Check a file's CRC32 and signature, decrypting nothing.  Returns ``{"container",
    "signed", "signer" (hex), "trusted" (None without trusted_keys), "encrypted"}``;
    ChecksumError for a CRC mismatch, SignatureError for a bad or untrusted signature
    or (``require_signature``) none at all."""
    _require_v1(path)
    from .layouts import v1 as layout

    f = _V1Bytes(path)
    try:
        result = {"container": "v1", "signed": f.regions.signature is not None, "signer": None, "trusted": None,
                  "encrypted": bool(f.header.flag_set & layout.Flag.ENCRYPTED)}
        if f.regions.signature is None:
            if require_signature or trusted_keys:
                raise SignatureError("the file is not signed", path=f.path)
            return result
        result.update(_signature_state(f, trusted_keys))
        return result
    finally:
        f.close()


def sign_file(path, signing_key, *, output=None, replace_signature: bool = False, force: bool = False) -> dict:
    """Sign a v1 file with an Ed25519 seed (32 bytes), writing ``output`` (default:
    ``path`` itself, replaced atomically).  A file signed already keeps its signature
    unless ``replace_signature``.  STREAMING files are refused: their chunk index
    carries a second signature that only a re-save can make."""
    _require_v1(path)
    from . import crypto
    from .layouts import v1 as layout

    target = os.fspath(output if output is not None else path)
    if output is not None:
        _refuse_existing(target, force)
    public = bytes(crypto.public_key_of(signing_key))
    f = _V1Bytes(path)
    try:
        if f.header.flag_set & layout.Flag.STREAMING:
            raise NotImplementedError("signing a STREAMING v1 file needs its chunk index re-signed: load it and "
                                      "save it again with aprfast.v1.save_model(..., streaming=True, signing_key=)")
        if f.regions.signature is not None and not replace_signature:
            raise ValueError(f"{f.path} is signed already; pass replace_signature=True (apr sign --resign) "
                             "to sign it anew")
        header = dataclasses.replace(f.header, flags=f.header.flags | layout.Flag.SIGNED)
        # the views are released before the map is closed (an exported view blocks it)
        with f.region(f.regions.metadata) as metadata, f.region(f.regions.payload) as payload:
            signature = bytes(crypto.sign([header.to_bytes(), metadata, payload], signing_key))
            _write_parts(target, layout.assemble(header, metadata, payload, signature + public))
    finally:
        f.close()
    return {"file": target, "signer": public.hex()}


def _write_parts(path, parts) -> None:
    from .writer import AtomicFile

    atomic = AtomicFile(path)
    try:
        for part in parts:
            view = memoryview(part)
            while len(view):
                view = view[os.write(atomic.fd, view):]
    except OSError as exc:
        atomic.abort()
        raise AprIOError(f"write failed: {exc.strerror or exc}", path=path) from exc
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()


def _resave(model, output, *, signing_key=None, **encryption) -> None:
    """Save a loaded v1 model again with the same type, metadata, compression, quality
    score, license and (STREAMING) layout, and the encryption given."""
    from . import v1
    from .layouts.v1 import Flag

    flags = model.header.flag_set
    if flags & Flag.TRUENO_NATIVE and any(v is not None for v in encryption.values()):
        raise NotImplementedError("a TRUENO_NATIVE payload is stored unencrypted (seed 000 §9.9); convert it to a "
                                  "plain v1 tensor file first")
    options = {"streaming": True} if flags & Flag.STREAMING else {}
    if flags & Flag.TRUENO_NATIVE:
        options = {"trueno_native": True}
    metadata = dict(model.metadata)
    custom = metadata.get("custom")
    if model.is_tensors and isinstance(custom, dict) and v1.PAYLOAD_FORMAT_KEY in custom:
        custom = {k: v for k, v in custom.items() if k != v1.PAYLOAD_FORMAT_KEY}  # save_model marks it again
        metadata["custom"] = custom
    v1.save_model(model.payload, output, model_type=model.header.model_type, metadata=metadata,
                  compression=model.header.compression, quality_score=model.header.quality_score or None,
                  license=model.license, signing_key=signing_key, **encryption, **options)


def _is_encrypted(path) -> bool:
    from .layouts.v1 import Flag

    f = _V1Bytes(path)
    try:
        return bool(f.header.flag_set & Flag.ENCRYPTED)
    finally:
        f.close()


def encrypt_file(path, output, *, password=None, recipients=None, signing_key=None, force: bool = False) -> dict:
    """Encrypt a v1 file's payload with a password (Argon2id) or to X25519 recipients'
    public keys, writing ``output``.  An encrypted file is refused (decrypt it first)."""
    _require_v1(path)
    from . import v1

    if (password is None) == (not recipients):
        raise ValueError("give a password or recipients (public keys), one of the two")
    _refuse_existing(output, force)
    if _is_encrypted(path):
        raise ValueError(f"{path} is encrypted already; decrypt it first")
    model = v1.load_model(path)
    recipients = list(recipients or [])
    encryption = {"password": password} if password is not None else \
        ({"recipient": recipients[0]} if len(recipients) == 1 else {"recipients": recipients})
    _resave(model, output, signing_key=signing_key, **encryption)
    return {"file": os.fspath(output), "encryption": "password" if password is not None else
            ("recipient" if len(recipients) == 1 else "multi-recipient"),
            "was_signed": model.signer is not None, "signed": signing_key is not None}


def decrypt_file(path, output, *, password=None, private_key=None, trusted_keys=None, signing_key=None,
                 force: bool = False) -> dict:
    """Decrypt a v1 file (its signature, if any, checked first; ``trusted_keys`` makes
    it required) and write the plaintext model to ``output``."""
    _require_v1(path)
    from . import v1

    if (password is None) == (private_key is None):
        raise ValueError("give a password or a private key, one of the two")
    _refuse_existing(output, force)
    model = v1.load_model(path, password=password, private_key=private_key, trusted_keys=trusted_keys)
    _resave(model, output, signing_key=signing_key)
    return {"file": os.fspath(output), "was": model.encryption, "was_signed": model.signer is not None,
            "signed": signing_key is not None}


def generate_keypair(path, kind: str = "ed25519", *, format: str = "raw", force: bool = False) -> dict:  # noqa: A002
    """Write a new key pair: the private key to ``path`` (mode 0600) and the public key
    to ``path + ".pub"``.  ``kind``: "ed25519" (signing) or "x25519" (encryption)."""
    from . import crypto

    if kind not in KEYPAIR_KINDS:
        raise ValueError(f"kind={kind!r}: one of {', '.join(KEYPAIR_KINDS)}")
    path = os.fspath(path)
    public_path = path + ".pub"
    for p in (path, public_path):
        _refuse_existing(p, force)
    secret, public = crypto.generate_signing_key() if kind == "ed25519" else crypto.generate_x25519_key()
    crypto.save_key(path, secret, kind=f"{kind}-private", format=format)
    crypto.save_key(public_path, public, kind=f"{kind}-public", format=format)
    return {"private": path, "public": public_path, "kind": kind, "format": format, "public_key": bytes(public).hex()}

