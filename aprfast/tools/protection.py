"""Sign, verify, encrypt and decrypt whole model files, and make key pairs: the
library side of ``apr sign / verify / encrypt / decrypt / keygen``.

Each function looks at the file's magic and hands it to the container's
implementation.  v1 (``APRN``) files are done here over :mod:`aprfast.v1` and its
byte layout; v2 files (``APR2``/``APR\\0``) over :mod:`aprfast.security`
(docs/FORMAT.md §3.2), where anything that changes the security block changes every
chunk's AAD, so signing, encrypting and decrypting a v2 file re-save it (the key is
needed to sign an encrypted v2 file), and verifying checks the digests of the stored
(encrypted) chunks without the key.

* :func:`sign_file` signs a v1 file where it lies, byte for byte: the header gains
  SIGNED, the Ed25519 signature over header || metadata || stored payload and the
  public key are appended, the CRC32 is recomputed.  Metadata and payload (encrypted
  or not) are copied unchanged, so signing needs no decryption key.
* :func:`verify_file` checks the CRC32 and the signature without decrypting anything.
* :func:`encrypt_file` / :func:`decrypt_file` load the model and save it again with
  or without encryption (the payload changes, so a signature over it cannot survive:
  pass ``signing_key`` to sign the result).
* :func:`generate_keypair` writes a private key file (mode 0600) and its public key.

docs/guide/encryption.md shows them in use; docs/FORMAT.md §3.2 and §10 have the bytes.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

from ..errors import AprIOError, FormatError, SignatureError, os_error

__all__ = ["sign_file", "verify_file", "encrypt_file", "decrypt_file", "generate_keypair", "container_of"]

V1_MAGIC = b"APRN"
V2_MAGICS = (b"APR2", b"APR\0")
#: Key kinds generate_keypair makes, by purpose.
KEYPAIR_KINDS = {"ed25519": "signing (sign, verify)", "x25519": "encryption to a recipient (encrypt, decrypt)",
                 # the OpenSSF model-signing format's key method takes ECDSA on these curves only
                 "ecdsa-p256": "signing Sigstore bundles (sign --format sigstore)",
                 "ecdsa-p384": "signing Sigstore bundles (sign --format sigstore)",
                 "ecdsa-p521": "signing Sigstore bundles (sign --format sigstore)"}


def container_of(path) -> str:
    """"v1" or "v2" from the file's first four bytes; FormatError for anything else.

    Args:
        path: The file.

    Returns:
        "v1" (``APRN``) or "v2" (``APR2`` or ``APR\\0``).

    Raises:
        FormatError: Another magic.
        AprIOError: The file cannot be read (AprFileNotFoundError when missing).

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast import v1
        >>> from aprfast.tools.protection import container_of
        >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "v2.apr")
        >>> v1.save_model({"w": np.zeros(2, np.float32)}, "v1.apr")
        >>> container_of("v2.apr"), container_of("v1.apr")
        ('v2', 'v1')
    """
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


def _refuse_existing(path, force: bool) -> None:
    from ..convert import DestinationExistsError

    if os.path.lexists(path) and not force:
        raise DestinationExistsError("output exists; pass force=True to replace it", path=path)


# --- reading a v1 file's regions without decrypting --------------------------------
class _V1Bytes:
    """A v1 file mapped read-only, its CRC checked and its regions located."""

    def __init__(self, path):
        from ..layouts import chunk_index
        from ..layouts import v1 as layout

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
    from ..crypto import core as crypto
    from ..layouts import v1 as layout

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
def verify_file(path, *, trusted_keys=None, require_signature: bool = True, password=None,
                private_key=None) -> dict:
    """Check a file's CRC32 and signature, decrypting nothing.  Returns ``{"container",
    "signed", "signer" (hex), "trusted" (None without trusted_keys), "encrypted"}``;
    ChecksumError for a CRC mismatch, SignatureError for a bad or untrusted signature
    or (``require_signature``) none at all.

    A v2 file also has its security block CRC, footer CRC and every chunk's digest
    checked (over the stored bytes, so an encrypted file needs no key), and the result
    says ``"chunks"`` (how many were checked) and ``"digest"``.  ``password`` /
    ``private_key`` (v2 only) check each chunk's AES-GCM tag as well; they are needed
    when the names are encrypted, or when an encrypted file has no digest manifest
    (DecryptError otherwise: its chunks cannot be checked without the key).

    Args:
        path: The ``.apr`` file (v1 or v2).
        trusted_keys: Ed25519 public keys one of which must have signed.
        require_signature: Refuse an unsigned file.
        password: (v2) Check the chunks' AES-GCM tags with this password too.
        private_key: (v2) Check them with this X25519 private key.

    Returns:
        A dict as above.

    Raises:
        ChecksumError: A CRC32 does not match.
        SignatureError: A bad or untrusted signature, a chunk digest that does not
            match, or no signature when one is required.
        DecryptError: (v2) A key that does not open the chunks, or one needed and not given.
        FormatError: Not an ``.apr`` file.
        ValueError: A key given for a v1 file (its signature is checked without one).

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> from aprfast.tools.protection import sign_file, verify_file
        >>> seed, public = v1.generate_signing_key()
        >>> v1.save_model({"w": np.zeros(2, np.float32)}, "m.apr")
        >>> verify_file("m.apr", require_signature=False)["signed"]
        False
        >>> _ = sign_file("m.apr", seed)
        >>> result = verify_file("m.apr", trusted_keys=[public])
        >>> result["container"], result["signed"], result["trusted"]
        ('v1', True, True)
    """
    if container_of(path) == "v2":
        return _verify_v2(path, trusted_keys=trusted_keys, require_signature=require_signature,
                          password=password, private_key=private_key)
    if password is not None or private_key is not None:
        raise ValueError("a v1 file's signature is checked without its key; give no password or private key")
    from ..layouts import v1 as layout

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


def sign_file(path, signing_key, *, output=None, replace_signature: bool = False, force: bool = False,
              password=None, private_key=None, verify: bool = True) -> dict:
    """Sign a v1 file with an Ed25519 seed (32 bytes), writing ``output`` (default:
    ``path`` itself, replaced atomically).  A file signed already keeps its signature
    unless ``replace_signature``.  STREAMING files are refused: their chunk index
    carries a second signature that only a re-save can make.

    A v2 file is saved again in the apr2 layout with ``signing_key`` (its metadata,
    compression, digest and encryption kept; a file in aprender's layout gets a
    :class:`aprfast.LayoutChangeWarning`: aprender does not read the result): the
    signature covers every chunk's tag,
    which binds the security block, so an encrypted v2 file needs ``password`` or
    ``private_key`` (single-recipient files only: the other recipients' public keys are
    not in a multi-recipient file).

    Args:
        path: The ``.apr`` file (v1 or v2).
        signing_key: The Ed25519 seed (32 bytes).
        output: Where to write (default: replace ``path``).
        replace_signature: Sign a file that is signed already.
        force: Replace an existing ``output``.
        password: (v2) The password of an encrypted file.
        private_key: (v2) The X25519 private key of an encrypted file.
        verify: Check a v2 file's CRC32 while its tensors are read, before the output
            is committed (no pass of its own; an encrypted or signed file's chunks and
            CRC whole, first); a v1 file's CRC is always checked (its signature covers
            the stored bytes).

    Returns:
        A dict: ``file`` (the path written) and ``signer`` (the public key, hex); v2
        files add ``container`` and ``encrypted``.

    Raises:
        ValueError: A file signed already without ``replace_signature``, a seed that is
            not 32 bytes, or a key given for a v1 file.
        NotImplementedError: A STREAMING v1 file (re-save it with
            :func:`aprfast.v1.save_model`).
        DestinationExistsError: ``output`` exists and ``force`` is not set.
        ChecksumError: The file's CRC32 does not match.
        DecryptError: (v2) An encrypted file without the right key.
        FormatError: Not an ``.apr`` file.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast import v1
        >>> from aprfast.tools.protection import sign_file
        >>> seed, public = v1.generate_signing_key()
        >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "m.apr", layout="apr2")  # aprender's: a warning
        >>> sign_file("m.apr", seed, output="signed.apr")["signer"] == public.hex()
        True
        >>> aprfast.open("signed.apr", trusted_keys=[public]).close()
    """
    if container_of(path) == "v2":
        return _sign_v2(path, signing_key, output=output, replace_signature=replace_signature, force=force,
                        password=password, private_key=private_key, verify=verify)
    if password is not None or private_key is not None:
        raise ValueError("a v1 file is signed as stored, without its key; give no password or private key")
    from ..crypto import core as crypto
    from ..layouts import v1 as layout

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
    from ..io.atomic import AtomicFile

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
    from .. import v1
    from ..layouts.v1 import Flag

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
    from ..layouts.v1 import Flag

    f = _V1Bytes(path)
    try:
        return bool(f.header.flag_set & Flag.ENCRYPTED)
    finally:
        f.close()


def encrypt_file(path, output, *, password=None, recipients=None, signing_key=None, encrypt_names: bool = False,
                 force: bool = False, verify: bool = True) -> dict:
    """Encrypt a v1 file's payload with a password (Argon2id) or to X25519 recipients'
    public keys, writing ``output``.  An encrypted file is refused (decrypt it first).
    A v2 file is saved again in the apr2 layout with its tensors sealed (FORMAT §3.2;
    ``encrypt_names`` seals metadata and index too), its metadata and compression kept
    (from aprender's layout with a :class:`aprfast.LayoutChangeWarning`: aprender does
    not read APR2).

    Args:
        path: The ``.apr`` file (v1 or v2).
        output: Where to write the encrypted file.
        password: Encrypt under this password.
        recipients: Encrypt for these X25519 public keys instead.
        signing_key: Sign the result with this Ed25519 seed.
        encrypt_names: (v2) Encrypt the metadata and tensor index too.
        force: Replace an existing ``output``.
        verify: Check a v2 file's CRC32 (and signature) while its tensors are read,
            before the output is committed (no pass of its own); a v1 file's CRC is
            always checked.

    Returns:
        A dict: ``file``, ``encryption`` ("password", "recipient" or
        "multi-recipient"), ``was_signed``, ``signed``; v2 files add ``container``.

    Raises:
        ValueError: Neither or both of ``password`` and ``recipients``, a file already
            encrypted, or ``encrypt_names`` for a v1 file.
        DestinationExistsError: ``output`` exists and ``force`` is not set.
        FormatError: Not an ``.apr`` file.
        ChecksumError: The input's CRC32 does not match.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.protection import encrypt_file
        >>> aprfast.save_file({"w": np.float32([1, 2])}, "m.apr", layout="apr2")  # aprender's: a warning
        >>> encrypt_file("m.apr", "sealed.apr", password="pw")["encryption"]
        'password'
        >>> aprfast.load_file("sealed.apr", password="pw")["w"].tolist()
        [1.0, 2.0]
    """
    from .. import v1

    if (password is None) == (not recipients):
        raise ValueError("give a password or recipients (public keys), one of the two")
    if container_of(path) == "v2":
        return _encrypt_v2(path, output, password=password, recipients=recipients, signing_key=signing_key,
                           encrypt_names=encrypt_names, force=force, verify=verify)
    if encrypt_names:
        raise ValueError("encrypt_names is for v2 files: a v1 file's metadata is never encrypted")
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
    it required) and write the plaintext model to ``output``.  A v2 file is written
    with its metadata and compression in the layout save_file picks (aprender's when it
    can hold the file); an uncompressed, unsigned result is written one tensor at a
    time (memory: the largest tensor).

    Args:
        path: The encrypted ``.apr`` file (v1 or v2).
        output: Where to write the plaintext file.
        password: The password it was encrypted under.
        private_key: Or the X25519 private key it was encrypted for.
        trusted_keys: Ed25519 public keys one of which must have signed it.
        signing_key: Sign the result with this Ed25519 seed.
        force: Replace an existing ``output``.

    Returns:
        A dict: ``file``, ``was`` (the encryption removed), ``was_signed``, ``signed``;
        v2 files add ``container``.

    Raises:
        ValueError: Neither or both of ``password`` and ``private_key``.
        DecryptError: A wrong password or key, or an altered file.
        SignatureError: A bad or untrusted signature.
        DestinationExistsError: ``output`` exists and ``force`` is not set.
        FormatError: Not an ``.apr`` file.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.protection import decrypt_file
        >>> aprfast.save_file({"w": np.float32([1, 2])}, "sealed.apr", password="pw")
        >>> decrypt_file("sealed.apr", "plain.apr", password="pw")["was"]
        'password'
        >>> aprfast.load_file("plain.apr")["w"].tolist()
        [1.0, 2.0]
    """
    from .. import v1

    if (password is None) == (private_key is None):
        raise ValueError("give a password or a private key, one of the two")
    if container_of(path) == "v2":
        return _decrypt_v2(path, output, password=password, private_key=private_key, trusted_keys=trusted_keys,
                           signing_key=signing_key, force=force)
    _refuse_existing(output, force)
    model = v1.load_model(path, password=password, private_key=private_key, trusted_keys=trusted_keys)
    _resave(model, output, signing_key=signing_key)
    return {"file": os.fspath(output), "was": model.encryption, "was_signed": model.signer is not None,
            "signed": signing_key is not None}


# --- v2 (APR2) files: docs/FORMAT.md §3.2 -----------------------------------------------
def _open_v2(path, **keys):
    from ..api import open as open_apr

    return open_apr(path, **{k: v for k, v in keys.items() if v is not None})


def _tensor_codec(f) -> str | None:
    """The per-tensor codec the file's compressed tensors use (the most used one when
    they differ: save_file takes one), None when none is compressed."""
    from collections import Counter

    from ..codecs.blocks import CODEC_MASK, CODECS

    names = {v: k for k, v in CODECS.items()}
    used = Counter(f.info(n).flags & CODEC_MASK for n in f.keys())
    used.pop(0, None)
    return names.get(used.most_common(1)[0][0]) if used else None


def _resave_v2(f, output, *, layout: str, security: dict, verify: bool = False) -> None:
    """Write the tensors and caller metadata of the open v2 file ``f`` to ``output``
    (atomically), with its per-tensor codec and the given security options.  Unsealed,
    unsigned and uncompressed output goes through a planned Writer, one tensor at a
    time; otherwise the writer holds every tensor until it writes (as save_file does
    for sealed or compressed tensors).

    ``verify``: check ``f``'s integrity while its tensors are read
    (:class:`aprfast.files.integrity.CheckedReader`: the footer CRC over the bytes read,
    no pass of its own; a sealed file whole, at once) and before ``output`` is
    committed, so a damaged file is a ChecksumError and nothing is written."""
    from ..api import save_file
    from ..files.integrity import CheckedReader
    from ..files.writer import Writer

    reader = CheckedReader(f, verify=verify)
    compression = _tensor_codec(f)
    names = sorted(f.keys())  # the data order save_file uses, so the bytes are save_file's
    if compression is None and not any(security.values()):
        plan = [(n, f.info(n).dtype_name, f.info(n).shape) for n in names]
        with Writer(output, f.metadata, plan=plan, layout=layout) as w:
            for name in names:
                w.add(name, reader.get_tensor(name))
            reader.finish()  # inside the block: a mismatch aborts the writer, nothing is committed
        return
    read = dict(reader.items(names))  # file order: the disk read front to back
    reader.finish()
    tensors = {name: read[name] for name in names}
    del read
    save_file(tensors, output, f.metadata, layout=layout, compression=compression, **security)


def _same_encryption(state: dict, password, private_key, path) -> dict:
    """The ``save_file`` arguments that seal a copy as the original was sealed."""
    from ..crypto import core as crypto

    mode = state["encryption"]
    if mode == "password":
        return {"password": password}
    if mode == "recipient":
        return {"recipients": [crypto.x25519_public_key(private_key)]}
    raise NotImplementedError(f"{path} is encrypted to several recipients, whose public keys the file does not "
                              "hold: decrypt it and encrypt it again with apr encrypt --recipient ... "
                              "--signing-key KEY")


def _encrypted_needs_key(exc, path, what: str):
    from ..errors import DecryptError

    return DecryptError(f"{exc.message}; {what} an encrypted v2 file seals it again (every chunk's tag depends on "
                        "the security block, FORMAT §3.2), so it needs the key", path=path)


def _sign_v2(path, signing_key, *, output, replace_signature, force, password, private_key, verify=True) -> dict:
    from ..crypto import core as crypto
    from ..errors import DecryptError

    target = os.fspath(output if output is not None else path)
    if output is not None:
        _refuse_existing(target, force)
    public = bytes(crypto.public_key_of(signing_key))
    try:
        f = _open_v2(path, password=password, private_key=private_key)
    except DecryptError as exc:
        if password is None and private_key is None:
            raise _encrypted_needs_key(exc, path, "signing") from None
        raise
    with f:
        state = f.security or {"signed": False, "encrypted": False, "digest": "none", "names_encrypted": False}
        if state["signed"] and not replace_signature:
            raise ValueError(f"{path} is signed already; pass replace_signature=True (apr sign --resign) "
                             "to sign it anew")
        security = {"signing_key": signing_key, "digest": None if state["digest"] == "none" else state["digest"]}
        if state["encrypted"]:
            security.update(_same_encryption(state, password, private_key, path),
                            encrypt_names=state["names_encrypted"])
        _resave_v2(f, target, layout="apr2", security=security, verify=verify)
        if f.layout == "aprender":  # said once written: a damaged input is refused without it
            from ..layouts import warn_layout_change

            warn_layout_change(path, target, "a signature", stacklevel=4)
    return {"file": target, "signer": public.hex(), "container": "v2", "encrypted": state["encrypted"]}


def _v2_is_encrypted(path) -> bool:
    from ..errors import DecryptError
    from ..files.reader import AprFile

    try:  # listing: an encrypted file opens without its key unless its names are sealed
        with AprFile(path, keys={"listing": True}) as f:
            return bool(f.security and f.security["encrypted"])
    except DecryptError:
        return True


def _encrypt_v2(path, output, *, password, recipients, signing_key, encrypt_names, force, verify=True) -> dict:
    _refuse_existing(output, force)
    recipients = list(recipients or [])
    if _v2_is_encrypted(path):
        raise ValueError(f"{path} is encrypted already; decrypt it first")
    with _open_v2(path) as f:
        state = f.security or {"signed": False, "encrypted": False, "digest": "none"}
        security = {"password": password, "recipients": recipients or None, "signing_key": signing_key,
                    "encrypt_names": encrypt_names,
                    "digest": None if state["digest"] == "none" else state["digest"]}
        _resave_v2(f, output, layout="apr2", security=security, verify=verify)
        if f.layout == "aprender":  # said once written: a damaged input is refused without it
            from ..layouts import warn_layout_change

            warn_layout_change(path, output, "encryption", stacklevel=4)
    return {"file": os.fspath(output), "container": "v2",
            "encryption": "password" if password is not None else
            ("recipient" if len(recipients) == 1 else "multi-recipient"),
            "was_signed": state["signed"], "signed": signing_key is not None}


def _decrypt_v2(path, output, *, password, private_key, trusted_keys, signing_key, force) -> dict:
    _refuse_existing(output, force)
    with _open_v2(path, password=password, private_key=private_key, trusted_keys=trusted_keys) as f:
        state = f.security
        # "auto": aprender's layout when nothing needs apr2, as save_file picks for a plain file
        _resave_v2(f, output, layout="auto", security={"signing_key": signing_key})
    return {"file": os.fspath(output), "container": "v2", "was": state["encryption"], "was_signed": state["signed"],
            "signed": signing_key is not None}


def _verify_v2(path, *, trusted_keys, require_signature, password, private_key) -> dict:
    """Open (block CRC, signature, and with a key the context tag), then the footer CRC
    and every chunk: digest over the stored bytes, and with a key its AES-GCM tag."""
    from ..errors import DecryptError
    from ..files.reader import AprFile

    has_key = password is not None or private_key is not None
    keys = {"trusted_keys": trusted_keys, "require_signature": bool(require_signature or trusted_keys)}
    if has_key:  # verify hands out no plaintext: a key for a file that is not encrypted does no harm
        keys.update(password=password, private_key=private_key, allow_unencrypted=True)
    else:
        keys["listing"] = True  # an encrypted file whose names are readable opens without its key
    try:
        f = AprFile(path, keys=keys)
    except DecryptError as exc:
        if has_key:
            raise
        # listing without a key fails only on sealed names, after the block CRC and the
        # signature were checked; the chunks cannot be located without the index
        raise DecryptError(f"{exc.message}. Its security block CRC and signature are valid, but its tensor "
                           "chunks cannot be located without the key (apr verify --password-env / --key-file)",
                           path=path) from None
    with f:
        sec = f._file.security
        result = {"container": "v2", "layout": f.layout, "signed": False, "signer": None, "trusted": None,
                  "encrypted": False, "digest": "none", "chunks": 0, "tags_checked": False}
        if sec is None:
            f.verify()
            return result
        state = sec.describe()
        result.update(signed=state["signed"], signer=state["signer"], encrypted=state["encrypted"],
                      digest=state["digest"], chunks=sec.block.chunk_count)
        if state["signed"] and trusted_keys:
            result["trusted"] = True  # open refused any other signer
        if has_key or not sec.sealed:
            f.verify()  # footer CRC, then every chunk's digest and (sealed) tag
            result["tags_checked"] = sec.sealed
        elif sec.digest is not None:
            _check_footer_crc(f)
            _check_stored_digests(sec, f._raw_source)
        else:
            raise DecryptError("the file is encrypted without a digest manifest: its chunks are checked by their "
                               "AES-GCM tags, which need the key (password= or private_key=)", path=path)
        return result


def _check_footer_crc(f) -> None:
    from ..errors import ChecksumError

    raw, end = f._raw_source, f._file.footer_crc_offset
    crc, piece = 0, 16 << 20
    buf = memoryview(bytearray(min(piece, end)))
    for at in range(0, end, piece):
        n = min(piece, end - at)
        crc = raw.readinto(at, buf[:n], crc=crc)
    if crc != f._file.stored_crc:
        raise ChecksumError(f"footer CRC32 is {f._file.stored_crc:#010x} but bytes 0..{end} give {crc:#010x}",
                            path=f.path)


def _check_stored_digests(sec, raw, piece: int = 16 << 20) -> None:
    """Every chunk's digest against the manifest, over the bytes as stored (ciphertext:
    FORMAT §3.2 digests after sealing), through one buffer of ``piece`` bytes; chunks of
    a piece are hashed in parallel.  Signed manifest: SignatureError; else ChecksumError."""
    from ..errors import ChecksumError
    from ..security.block import SIGNED
    from ..security.sealing import run_jobs

    step = sec.block.chunk_size
    piece = max(step, piece // step * step)
    buf = memoryview(bytearray(min(piece, int(sec.sizes.max()) if len(sec.sizes) else 0)))
    error = SignatureError if sec.block.flags & SIGNED else ChecksumError

    def check(job):
        i, k, view = job
        if sec.digest(view) != sec.block.digest(int(sec.first[i]) + k):
            raise error(f"tensor {sec._name(i)!r}: chunk {k} of {int(sec.counts[i])} does not match its "
                        f"{sec.digest_name} digest in the {'signed ' if error is SignatureError else ''}manifest",
                        path=sec.path)

    for i, start in zip(sec.order.tolist(), sec.starts.tolist()):
        size = int(sec.sizes[i])
        for at in range(0, size, piece):
            n = min(piece, size - at)
            view = buf[:n]
            raw.readinto(start + at, view)
            jobs = [(i, (at + s) // step, view[s:min(s + step, n)]) for s in range(0, n, step)]
            run_jobs(check, jobs, n)


def generate_keypair(path, kind: str = "ed25519", *, format: str | None = None, force: bool = False,  # noqa: A002
                     password=None) -> dict:
    """Write a new key pair: the private key to ``path`` (mode 0600) and the public key
    to ``path + ".pub"``.

    Args:
        path: the private key file.
        kind: "ed25519" (signs .apr files), "x25519" (receives encrypted models) or
            "ecdsa-p256" / "ecdsa-p384" / "ecdsa-p521" (signs OpenSSF model-signing
            bundles: :func:`aprfast.tools.model_signing.sign_model`).
        format: "pem" (the default: PKCS#8 / SubjectPublicKeyInfo, which say what
            they hold and need no package), "openssh" (Ed25519) or "raw" (32 bytes
            that do not say whether they are the private or the public key); ECDSA
            keys are PEM only.
        force: replace existing key files.
        password: ECDSA only: encrypt the private key PEM with it.

    Returns:
        ``{"private", "public", "kind", "format", "public_key"}``; ``public_key`` is the raw
        public key in hex for Ed25519/X25519 (which add ``fingerprint``:
        :func:`aprfast.crypto.key_fingerprint`) and, for ECDSA, the key's hint (SHA-256
        of its public PEM, the identifier a bundle carries).

    Raises:
        ValueError: an unknown kind, or a format the kind has no encoding in.
        DestinationExistsError: a key file exists and ``force`` is false.
        MissingDependencyError: "openssh" or an ECDSA key without the
            ``cryptography`` package.
        AprIOError: a file cannot be written.

    Examples:
        >>> from aprfast import crypto
        >>> from aprfast.tools.protection import generate_keypair
        >>> made = generate_keypair("signing")
        >>> made["public"], len(bytes.fromhex(made["public_key"]))
        ('signing.pub', 32)
        >>> crypto.load_key("signing", kind="ed25519-private")[0]
        'ed25519-private'
    """
    if kind not in KEYPAIR_KINDS:
        raise ValueError(f"kind={kind!r}: one of {', '.join(KEYPAIR_KINDS)}")
    path = os.fspath(path)
    public_path = path + ".pub"
    if kind.startswith("ecdsa-"):
        if format not in (None, "pem"):
            raise ValueError(f"ECDSA keys are written as PEM (the model-signing tools read PEM), not {format!r}")
        for p in (path, public_path):
            _refuse_existing(p, force)
        from ..crypto.ecdsa import save_ecdsa_keypair

        written = save_ecdsa_keypair(path, kind[len("ecdsa-"):], password=password)
        return {"private": path, "public": public_path, "kind": kind, "format": "pem",
                "public_key": written["key_hint"]}
    if password is not None:
        raise ValueError("password= encrypts ECDSA private keys only")
    format = format or "pem"  # noqa: A001 - self-describing: a public key cannot pass for a private one
    from ..crypto import core as crypto

    for p in (path, public_path):
        _refuse_existing(p, force)
    secret, public = crypto.generate_signing_key() if kind == "ed25519" else crypto.generate_x25519_key()
    crypto.save_key(path, secret, kind=f"{kind}-private", format=format)
    crypto.save_key(public_path, public, kind=f"{kind}-public", format=format)
    return {"private": path, "public": public_path, "kind": kind, "format": format, "public_key": bytes(public).hex(),
            "fingerprint": crypto.key_fingerprint(public, f"{kind}-public")}
