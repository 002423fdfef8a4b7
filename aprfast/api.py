"""The safetensors-shaped public API: save_file, save, load_file, load, open, inspect."""

from __future__ import annotations

import io
import os

from . import layouts, remote
from .errors import AprFileNotFoundError, LayoutError
from .files import shards
from .files.reader import AprFile
from .files.writer import SAVE_BACKENDS, save_to
from .io import direct as direct_io
from .io.pickling import reopenable
from .io.sources import Source, open_source
from .limits import Limits
from .security import SecurityOptions, refuse_keys
from .tensors import as_inputs

__all__ = ["save_file", "save", "load_file", "load", "open", "inspect"]


def _plan(tensors, metadata, layout, alignment, compression=None, compression_level=None, security=None,
          reserve=0):
    if not hasattr(tensors, "items"):
        raise TypeError(f"tensors must be a mapping of name to array, not {type(tensors).__name__}")
    options = SecurityOptions.from_keywords(**(security or {}))  # checked before any tensor is reduced
    inputs = as_inputs(tensors)
    return layouts.plan(inputs, metadata, layout=layout, alignment=alignment, compression=compression,
                        compression_level=compression_level, security=options, reserve=reserve)


def save_file(tensors, path, metadata=None, *, layout: str = "auto", alignment: int = 64,
              durable: bool = True, compression: str | None = None, compression_level: int | None = None,
              password=None, recipients=None, signing_key=None, digest: str | None = None,
              encrypt_names: bool = False, max_shard_size=None, storage_options=None, reserve: int = 0,
              backend: str = "auto") -> None:
    """Write ``tensors`` (name -> array) to ``path`` atomically.

    ``layout`` is "aprender" (APR\\0, readable by aprender), "apr2" (the spec's APR2) or
    "auto": aprender's layout whenever it can hold everything asked for, else apr2.
    ``durable=False`` skips the fsyncs (the rename is still atomic).  ``path`` may also
    be a writable file object, including a pipe, or a URL (``s3://...``, any fsspec
    URL; ``storage_options`` go to fsspec): the bytes stream into an upload (s3fs: a
    multipart upload) published only once complete, so a failed save leaves no object.
    See docs/guide/saving-and-loading.md.

    ``compression`` ("lz4" or "zstd") stores each tensor as independent blocks (LZ4:
    64 KiB, zstd: 128 KiB) that readers decode independently; it needs the apr2 layout
    ("auto" picks it; "aprender" is refused).  A tensor compression would not shrink is
    stored raw and stays zero-copy.  ``compression_level``: zstd's level (default 3), or
    LZ4 HC's 1-12 (default: LZ4's fast mode).  Compressed tensors are held in memory
    until the file is written (docs/guide/compression.md).

    **Encryption and signing** (apr2 layout; "auto" picks it; docs/FORMAT.md §3.2,
    docs/guide/encryption.md):
    ``password=`` (Argon2id, as v1) or ``recipients=[X25519 public keys]`` seal every
    tensor in 1 MiB chunks with AES-256-GCM under a random per-file key, after
    compression; readers still read one tensor or one slice without the rest.  The
    index (names, dtypes, shapes, sizes) and metadata stay readable without the key
    unless ``encrypt_names=True``.  ``signing_key=`` (Ed25519 seed) adds a digest per
    chunk and a signature over header, metadata, index and digests; ``digest=``
    ("sha256", the default, or "blake3", which readers need the blake3 package for)
    picks the hash, and given alone writes the digests without a signature.  Sealed
    tensors are held in memory until the file is written; tied weights are stored
    once per name.

    **Room for edits:** ``reserve=`` (bytes; 0, the default, writes exactly aprender's
    bytes) leaves that much zeroed room between the index and the data (and a 32- or
    64-byte commit slot after the header), so :func:`aprfast.edit` can change metadata,
    rename or drop tensors later by writing a few KiB in place instead of rewriting the
    file (docs/guide/editing.md, docs/FORMAT.md §5.2).  Readers, aprender's included,
    read such a file as any other.

    **Sharding** (docs/guide/sharding.md, :mod:`aprfast.files.shards`): ``max_shard_size``
    (bytes, or a string such as "2GB" / "500MiB") splits the tensors, in the order given,
    into complete ``.apr`` files of at most that many tensor bytes each (a larger tensor
    gets a shard of its own), ``{stem}-0000N-of-0000M.apr`` next to ``path``, plus the
    manifest ``{stem}.apr.index.json``; ``aprfast.open(path)`` then reads them as one
    model.  When everything fits one shard, ``path`` is written as a plain file.  Not
    with encryption or signing (the manifest is not authenticated).

    ``backend="direct"`` keeps the file out of the page cache: each 64 MiB written is
    handed to ``posix_fadvise(POSIX_FADV_DONTNEED)`` as the writer moves on, and the
    whole file after the final ``fsync`` (made even with ``durable=False``), so a save
    of a model larger than memory does not push everything else out of the cache
    (:mod:`aprfast.io.direct`).  "auto" (the default) writes through the cache.

    Args:
        tensors: A mapping of tensor name (str) to array: NumPy arrays, anything with
            ``__array__`` or the buffer protocol, :class:`aprfast.RawTensor` or
            :class:`aprfast.QuantizedTensor`.
        path: A file path, a writable file object (a pipe too) or a URL.
        metadata: JSON-serialisable dict stored with the tensors (``None``: none).
        layout: "auto", "aprender" or "apr2".
        alignment: Byte alignment of each tensor's data in the file.
        durable: fsync the file and its directory before returning.
        compression: "lz4", "zstd" or ``None``.
        compression_level: The codec's level (``None``: its default).
        password: Encrypt under this password (str or bytes).
        recipients: Encrypt for these X25519 public keys (32 bytes each).
        signing_key: Sign with this Ed25519 seed (32 bytes).
        digest: "sha256" or "blake3": the per-chunk digest of a signed file.
        encrypt_names: Encrypt the index and metadata too.
        max_shard_size: Split into shards of at most this many tensor bytes.
        storage_options: Options passed to fsspec for a URL ``path``.
        reserve: Bytes of room to leave for in-place edits (at most 64 MiB).
        backend: "auto" or "direct" (a local path's pages leave the page cache).

    Returns:
        None.

    Raises:
        ValueError: An unknown ``backend``.
        LayoutError: The layout cannot hold what was asked (an unknown layout, an
            unsupported dtype, a non-str name, metadata that is not JSON, compression or
            encryption with ``layout="aprender"``, sharding with encryption or to a URL).
        AprIOError: The operating system refused the write (disk full, no permission,
            broken pipe); a path is left as it was.
        TypeError: ``tensors`` is not a mapping.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
        ...                   "model.apr", metadata={"arch": "tiny"})
        >>> aprfast.load_file("model.apr")["w"]
        array([[0., 1., 2.],
               [3., 4., 5.]], dtype=float32)
        >>> aprfast.save_file({"w": np.zeros(4096, np.float32)}, "small.apr", compression="zstd")
        >>> aprfast.save_file({"w": np.zeros(4096, np.float32)}, "uncached.apr", backend="direct")
    """
    if backend not in SAVE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, SAVE_BACKENDS))}, not {backend!r}")
    if max_shard_size is not None:
        if _is_url(path):
            raise LayoutError("sharded saves go to a local directory; a URL target takes one file (upload the "
                              "shards and their manifest afterwards)")
        _save_sharded(tensors, path, metadata, max_shard_size, layout, alignment, durable, compression,
                      compression_level, _security(password, recipients, signing_key, digest, encrypt_names), reserve)
        return
    save_to(path, _plan(tensors, metadata, layout, alignment, compression, compression_level,
                        _security(password, recipients, signing_key, digest, encrypt_names), reserve),
            durable=durable, storage_options=storage_options, backend=backend)


def _save_sharded(tensors, path, metadata, max_shard_size, layout, alignment, durable, compression,
                  compression_level, security, reserve=0) -> None:
    if any(v not in (None, False) for v in security.values()):
        raise LayoutError("sharded files cannot be encrypted or signed: the manifest that maps tensors to "
                          "shards is not authenticated")
    if not hasattr(tensors, "items"):
        raise TypeError(f"tensors must be a mapping of name to array, not {type(tensors).__name__}")

    def plan_shard(inputs, shard_metadata):
        return layouts.plan(inputs, shard_metadata, layout=layout, alignment=alignment, compression=compression,
                            compression_level=compression_level, reserve=reserve)

    shards.save_sharded(as_inputs(tensors), path, metadata, max_shard_size, plan_shard=plan_shard,
                        write_plan=lambda target, plan: save_to(target, plan, durable=durable), durable=durable)


def _security(password, recipients, signing_key, digest, encrypt_names):
    return dict(password=password, recipients=recipients, signing_key=signing_key, digest=digest,
                encrypt_names=encrypt_names)


def save(tensors, metadata=None, *, layout: str = "auto", alignment: int = 64, compression: str | None = None,
         compression_level: int | None = None, password=None, recipients=None, signing_key=None,
         digest: str | None = None, encrypt_names: bool = False, reserve: int = 0) -> bytes:
    """The bytes :func:`save_file` would write, as a ``bytes`` object.

    Args:
        tensors: A mapping of tensor name to array, as for :func:`save_file`.
        metadata: JSON-serialisable dict stored with the tensors.
        layout: "auto", "aprender" or "apr2".
        alignment: Byte alignment of each tensor's data.
        compression: "lz4", "zstd" or ``None``.
        compression_level: The codec's level (``None``: its default).
        password: Encrypt under this password.
        recipients: Encrypt for these X25519 public keys.
        signing_key: Sign with this Ed25519 seed.
        digest: "sha256" or "blake3" (signed files).
        encrypt_names: Encrypt the index and metadata too.
        reserve: Bytes of room to leave for in-place edits, as for :func:`save_file`.

    Returns:
        The complete file.

    Raises:
        LayoutError: As for :func:`save_file`.
        TypeError: ``tensors`` is not a mapping.

    Examples:
        >>> import numpy as np, aprfast
        >>> blob = aprfast.save({"b": np.ones(3, np.float32)})
        >>> blob[:4]
        b'APR\\x00'
        >>> aprfast.load(blob)["b"]
        array([1., 1., 1.], dtype=float32)
    """
    plan = _plan(tensors, metadata, layout, alignment, compression, compression_level,
                 _security(password, recipients, signing_key, digest, encrypt_names), reserve)
    out = io.BytesIO()
    save_to(out, plan)
    return out.getvalue()


@reopenable  # handles pickle by reopening with these arguments (aprfast.io.pickling)
def open(target, *, mode: str | None = None, limits: Limits | None = None, unknown_dtypes: str = "error",
         verify: bool = False, alignment: int = 64, password=None, private_key=None, trusted_keys=None,
         require_signature: bool | None = None, allow_unencrypted: bool = False,
         storage_options=None, backend: str | None = None):  # noqa: A001 - mirrors safe_open
    """Open any ``.apr`` file (path, URL, file object or bytes-like) for lazy tensor access.

    A URL (``http(s)://``, or any fsspec URL such as ``s3://`` with the ``remote``
    extra) is read with ranged requests (:mod:`aprfast.remote`, docs/guide/remote.md):
    one request to open when the prefix fits 64 KiB, one per tensor after that;
    ``storage_options`` go to fsspec (or ``headers``/``timeout``/``connections`` for the
    native HTTP reader).

    v2 files of either layout give an :class:`AprFile`; v1 (``APRN``) tensor files give
    an :class:`aprfast.v1.reader.V1File` with the same methods (plain files zero-copy,
    compressed or encrypted ones decoded once, STREAMING files one tensor's chunks at a
    time).  ``password`` / ``private_key`` open encrypted files, ``trusted_keys`` makes a
    signature from one of those Ed25519 keys required (``require_signature`` overrides
    that).  A key given for a file that is not encrypted is refused (DecryptError)
    unless ``allow_unencrypted=True``, and a required signature on an unsigned file is
    refused (SignatureError), whatever the variant.

    An encrypted or signed APR2 file is checked at open (block CRC, signature by a
    trusted key, content key, header/metadata/index authentication); each tensor chunk
    is checked (digest, AES-GCM tag) when read, so reading one tensor costs one
    signature check plus the chunks read.  Its tensors are owned arrays, never views.
    See docs/guide/encryption.md.

    A sharded model (a ``*.apr.index.json`` manifest, a directory holding one, or the
    ``x.apr`` path a sharded ``save_file`` was given) gives a
    :class:`aprfast.files.shards.ShardedFile`: each shard's size is checked at open, each
    shard opened when a tensor in it is first asked for, its CRC checked by
    ``verify()`` and loads.  At a URL the manifest (``...index.json``), the first shard
    (``{stem}-00001-of-0000N.apr``, when the manifest is next to it) or the ``x.apr``
    given to the sharded save (when no object ``x.apr`` exists) opens the model: one
    request for the manifest, then each shard opened (one request) when first needed.
    See docs/guide/sharding.md.

    ``mode="direct"`` (or ``backend="direct"``, safetensors 0.8's name for it) reads
    tensors into owned memory around the page cache: ``O_DIRECT`` reads, or buffered
    reads whose pages are dropped after them where the filesystem refuses direct I/O
    (:mod:`aprfast.io.direct`); nothing is mapped.

    Args:
        target: A path, a URL, a readable seekable file object, or bytes-like data.
        mode: "mmap" (the default for local files), "private", "pread" or "direct".
        limits: Bounds on what the parser believes (:class:`aprfast.Limits`).
        unknown_dtypes: "error" (refuse at open) or "raw" (return tensors of unknown
            dtype ids as :class:`aprfast.RawTensor`).
        verify: Check the whole-file CRC32 (and every chunk of a sealed file) at open.
        alignment: Alignment of owned arrays handed out.
        password: Password of an encrypted file.
        private_key: X25519 private key of a recipient of an encrypted file.
        trusted_keys: Ed25519 public keys; a signature by one of them becomes required.
        require_signature: Require (True) or waive (False) a trusted signature.
        allow_unencrypted: Accept a file that is not encrypted although a key was given.
        storage_options: Options passed to fsspec (or the native HTTP reader) for a URL.
        backend: The same choice as ``mode`` under safetensors' name: "auto" (the
            default mode), "mmap", "pread" or "direct"; give one of the two.

    Returns:
        An :class:`AprFile`, :class:`aprfast.v1.reader.V1File` or
        :class:`aprfast.files.shards.ShardedFile`; use it as a context manager.

    Raises:
        AprFileNotFoundError: ``target`` does not exist.
        FormatError: The bytes are not an ``.apr`` file (UnknownDTypeError: a dtype id
            this build does not know, with ``unknown_dtypes="error"``).
        CorruptError: Sizes, offsets or contents contradict each other
            (ChecksumError: a CRC does not match, with ``verify=True``).
        VersionError: A layout version or feature this build does not read.
        LimitError: The file asks for more than ``limits`` allow.
        DecryptError: A wrong key or password, or a key for a file that is not encrypted.
        SignatureError: A required signature is missing, untrusted or wrong.
        ValueError: An unknown ``mode`` or ``backend``, or both given and different.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"a": np.zeros((2, 2), np.float16), "b": np.ones(3)}, "m.apr")
        >>> with aprfast.open("m.apr") as f:
        ...     print(f.keys(), f.get_tensor("b"), f.get_slice("a")[1].tolist())
        ['a', 'b'] [1. 1. 1.] [0.0, 0.0]
        >>> with aprfast.open("m.apr", backend="direct") as f:
        ...     print(f.get_tensor("b"))
        [1. 1. 1.]
    """
    mode = _mode_of(mode, backend)
    def sharded(manifest):
        refuse_keys(dict(password=password, private_key=private_key, trusted_keys=trusted_keys,
                         require_signature=require_signature, allow_unencrypted=allow_unencrypted),
                    getattr(manifest, "url", manifest))
        opened = shards.ShardedFile(manifest, open_one=_open_single, limits=limits, storage_options=storage_options,
                                    open_options=dict(mode=mode, unknown_dtypes=unknown_dtypes, alignment=alignment))
        if verify:
            try:
                opened.verify()
            except BaseException:
                opened.close()
                raise
        return opened

    manifest = _find_manifest(target, storage_options)
    if manifest is not None:
        return sharded(manifest)
    source = _open_source_or_manifest(target, mode, storage_options)
    if not isinstance(source, Source):
        return sharded(source)
    return _open_single(source, limits=limits, unknown_dtypes=unknown_dtypes, verify=verify, alignment=alignment,
                        password=password, private_key=private_key, trusted_keys=trusted_keys,
                        require_signature=require_signature, allow_unencrypted=allow_unencrypted)


def _mode_of(mode, backend):
    """The source mode of open(mode=..., backend=...): backend is safetensors' name."""
    if backend is None:
        return mode
    if backend not in direct_io.BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, direct_io.BACKENDS))}, not {backend!r}")
    chosen = None if backend == "auto" else backend
    if mode is not None and mode != chosen:
        raise ValueError(f"mode={mode!r} and backend={backend!r} disagree: give one of them")
    return chosen


def _open_single(source, *, mode=None, limits=None, unknown_dtypes="error", verify=False, alignment=64,
                 password=None, private_key=None, trusted_keys=None, require_signature=None,
                 allow_unencrypted=False, storage_options=None):
    """One file (a Source, path or URL; never a sharded model: what ShardedFile opens its
    shards with, so a shard named like a first shard is never taken for the whole set)."""
    if not isinstance(source, Source):
        source = open_source(source, mode=mode, storage_options=storage_options)
    try:
        is_v1 = layouts.is_v1(source)
        if is_v1:
            from .v1.reader import V1File

            return V1File(source, password=password, private_key=private_key, trusted_keys=trusted_keys,
                          require_signature=require_signature, limits=limits, unknown_dtypes=unknown_dtypes,
                          allow_unencrypted=allow_unencrypted)._verified(verify)
        if password is not None and private_key is not None:
            raise ValueError("give password= or private_key=, not both")
    except BaseException:
        source.close()
        raise
    keys = dict(password=password, private_key=private_key, trusted_keys=trusted_keys,
                require_signature=require_signature, allow_unencrypted=allow_unencrypted)
    return AprFile(source, limits=limits, unknown_dtypes=unknown_dtypes, verify=verify, alignment=alignment,
                   keys=keys)


def _refuse_keys_for_v2(password, private_key, trusted_keys, require_signature, allow_unencrypted, path):
    """A v2 file that is neither encrypted nor signed (the aprender layout never is): a
    caller who expects either must not get plaintext or unverified tensors back silently."""
    refuse_keys(dict(password=password, private_key=private_key, trusted_keys=trusted_keys,
                     require_signature=require_signature, allow_unencrypted=allow_unencrypted), path)


def load_file(path, *, mmap: bool = True, verify: bool | None = None, limits: Limits | None = None,
              unknown_dtypes: str = "error", threads: int = 0, storage_options=None, backend: str = "auto",
              **keys) -> dict:
    """Every tensor of ``path`` (any ``.apr`` variant), by name.

    With ``mmap`` (the default) arrays are read-only views of the mapped file, valid
    as long as they live, and nothing is checked until asked: a damaged byte inside a
    tensor is not noticed (pass ``verify=True``, or ``aprfast.open(path,
    verify=True)``, to check the footer CRC32 and a signature first; docs/quickstart.md).
    With ``mmap=False`` the data section is read with parallel
    ``pread`` into one aligned buffer and the arrays are owned and writable; the
    whole-file CRC is checked on the way unless ``verify=False``.  Tensors of an
    encrypted or signed APR2 file are owned arrays whatever ``mmap`` says (each checked
    as it is read).  See docs/guide/saving-and-loading.md.

    A URL is always loaded as with ``mmap=False``: the data section in parallel ranged
    requests straight into the aligned buffer, CRC checked on the way unless
    ``verify=False`` (``storage_options`` as for :func:`open`).

    ``backend`` (safetensors 0.8's name) picks how a local file is read: "mmap" gives
    views (as ``mmap=True``), "pread" owned arrays read through the page cache,
    "direct" owned arrays read around it (``O_DIRECT``: no second copy of the model in
    the cache; :mod:`aprfast.io.direct`), and "auto" (the default) follows ``mmap``,
    an owned load then reading direct where that measured faster or saves memory: a
    file of 64 MiB or more mostly not in the page cache (sampled with ``mincore``), on
    a network filesystem, or, where the cache cannot be sampled, larger than half the
    available memory (:func:`aprfast.io.direct.choose_backend`), and through the cache
    otherwise (a file mostly cached always).

    Args:
        path: A path, a URL or a sharded model's manifest.
        mmap: Return read-only views of the mapped file instead of owned arrays.
        verify: Check the CRC: by default only without ``mmap`` (``True`` checks a
            mapped file too, ``False`` never).
        limits: Bounds on what the parser believes.
        unknown_dtypes: "error" or "raw", as for :func:`open`.
        threads: Threads for the parallel read (0: one per idle core).
        storage_options: Options for a URL, as for :func:`open`.
        backend: "auto", "mmap", "pread" or "direct".
        **keys: ``password``, ``private_key``, ``trusted_keys``, ``require_signature``,
            ``allow_unencrypted``, as for :func:`open`.

    Returns:
        A dict of name to NumPy array (or :class:`aprfast.QuantizedTensor` /
        :class:`aprfast.RawTensor` for packed or unknown dtypes), in file order.

    Raises:
        AprFileNotFoundError: ``path`` does not exist.
        ChecksumError: The CRC does not match the bytes.
        FormatError: Not an ``.apr`` file.
        CorruptError: The file contradicts itself.
        LimitError: The file asks for more than ``limits`` allow.
        DecryptError: A wrong key or password.
        SignatureError: A required signature is missing or wrong.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.arange(3, dtype=np.int64)}, "model.apr")
        >>> tensors = aprfast.load_file("model.apr", mmap=False)
        >>> tensors["w"].tolist(), tensors["w"].dtype.name, tensors["w"].flags.writeable
        ([0, 1, 2], 'int64', True)
        >>> aprfast.load_file("model.apr", backend="direct")["w"].tolist()
        [0, 1, 2]
    """
    if backend not in direct_io.BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, direct_io.BACKENDS))}, not {backend!r}")
    if backend != "auto":
        mmap = backend == "mmap"
    if _is_url(path):
        with open(path, mode="pread", limits=limits, unknown_dtypes=unknown_dtypes, storage_options=storage_options,
                  **keys) as f:
            return _load_owned(f, verify is not False, threads)
    if mmap:
        with open(path, mode="mmap", limits=limits, unknown_dtypes=unknown_dtypes, verify=bool(verify), **keys) as f:
            return f.tensors()
    mode = backend if backend in ("pread", "direct") else _owned_mode(path)
    with open(path, mode=mode, limits=limits, unknown_dtypes=unknown_dtypes, **keys) as f:
        return _load_owned(f, verify is not False, threads)


def _owned_mode(path) -> str:
    """backend="auto" for an owned load of a local file: "direct" or "pread"
    (aprfast.io.direct.choose_backend); "pread" when the file cannot be looked at here
    (a directory, a manifest: open reports those)."""
    if not isinstance(path, (str, os.PathLike)):
        return "pread"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return "pread"
    try:
        size = os.fstat(fd).st_size
        if size < direct_io.AUTO_MIN:
            return "pread"
        return direct_io.choose_backend(fd, size, path)[0]
    finally:
        os.close(fd)


def load(data, *, verify: bool = True, limits: Limits | None = None, unknown_dtypes: str = "error",
         **keys) -> dict:
    """Every tensor of an in-memory file (any ``.apr`` variant), as owned arrays.

    Args:
        data: The file's bytes (bytes, bytearray, memoryview).
        verify: Check the CRC over the bytes.
        limits: Bounds on what the parser believes.
        unknown_dtypes: "error" or "raw", as for :func:`open`.
        **keys: ``password``, ``private_key``, ``trusted_keys``, ``require_signature``,
            ``allow_unencrypted``, as for :func:`open`.

    Returns:
        A dict of name to owned array, in file order.

    Raises:
        TypeError: ``data`` is a path (use :func:`load_file`).
        FormatError: Not an ``.apr`` file.
        ChecksumError: The CRC does not match the bytes.
        CorruptError: The file contradicts itself.
        DecryptError: A wrong key or password.
        SignatureError: A required signature is missing or wrong.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.load(aprfast.save({"x": np.float32([1.5, 2.5])}))
        {'x': array([1.5, 2.5], dtype=float32)}
        >>> aprfast.load(b"not a model file")
        Traceback (most recent call last):
        ...
        aprfast.errors.FormatError: [E001] ...
    """
    if isinstance(data, (str, os.PathLike)):
        raise TypeError("load() takes the file's bytes; use load_file() for a path")
    with open(data, limits=limits, unknown_dtypes=unknown_dtypes, **keys) as f:
        return _load_owned(f, verify, 0)


def _load_owned(f, verify: bool, threads: int) -> dict:
    if isinstance(f, (AprFile, shards.ShardedFile)):
        return f.load_all(verify=verify, threads=threads)
    if verify:
        f.verify()
    return f.tensors(copy=True)


def _is_url(target) -> bool:
    return isinstance(target, str) and "://" in target and remote.is_url(target)


def _find_manifest(target, storage_options):
    """The sharded model ``target`` names (a path, a URL or a fetched RemoteManifest),
    or None for a single file (shards.find_manifest / find_remote_manifest)."""
    if _is_url(target):
        return shards.find_remote_manifest(target, storage_options)
    return shards.find_manifest(target)


def _model_in_directory(target):
    """``target`` itself, or for a local directory (which holds no sharded manifest: that
    was looked for first) the one ``.apr`` file in it; a directory with none or several
    is an error that says so instead of "Is a directory"."""
    if not isinstance(target, (str, os.PathLike)) or _is_url(target) or not os.path.isdir(target):
        return target
    found = sorted(name for name in os.listdir(target) if name.endswith(".apr") and not name.startswith(".")
                   and os.path.isfile(os.path.join(target, name)))
    if len(found) == 1:
        return os.path.join(target, found[0])
    if not found:
        raise AprFileNotFoundError("the directory holds no .apr model (no *.apr file and no *.apr.index.json "
                                   "manifest)", path=os.fspath(target))
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise LayoutError(f"the directory holds {len(found)} .apr files ({shown}): name the one to open",
                      path=os.fspath(target))


def _open_source_or_manifest(target, mode, storage_options):
    """The Source of ``target``; for a URL ``x.apr`` with no object behind it, the
    manifest ``x.apr.index.json`` a sharded save of ``x.apr`` leaves, when there is one
    (as a missing local ``x.apr`` does), else the original not-found error.  A local
    directory opens the one ``.apr`` file it holds."""
    target = _model_in_directory(target)
    try:
        return open_source(target, mode=mode, storage_options=storage_options)
    except AprFileNotFoundError:
        candidate = shards.manifest_url_for_missing(target) if _is_url(target) else None
        if candidate is None:
            raise
        try:
            return shards.fetch_manifest(candidate, storage_options)
        except AprFileNotFoundError:
            pass
        raise


def inspect(target, *, limits: Limits | None = None, storage_options=None) -> dict:
    """Header, metadata and index of a file, reading nothing else.

    For a v1 container: its header and metadata, without checking the CRC or decrypting
    anything; for a sharded model: the manifest, and each tensor's entry with its
    ``shard``.  A URL costs one request when its prefix fits 64 KiB (:mod:`aprfast.remote`).

    A v2 file's ``tensors`` is ``{name: {"dtype", "shape", "offset", "nbytes"}}`` (plus
    ``raw_size`` and ``flags`` for a compressed tensor) in index order, as a
    :class:`~aprfast.layouts._common.TensorIndex`: a dict that builds an entry when it
    is asked for, so inspecting a million tensors costs about the parse of their index.
    It compares, copies, pickles and JSON-encodes as the plain dict it stands for; the
    index was checked in full before ``inspect`` returned.

    Args:
        target: A path, URL, file object or bytes-like data, as for :func:`open`.
        limits: Bounds on what the parser believes.
        storage_options: Options for a URL, as for :func:`open`.

    Returns:
        A dict with ``layout``, ``header``, ``metadata`` (everything the metadata block
        holds, layout defaults included) and ``tensors``.

    Raises:
        AprFileNotFoundError: ``target`` does not exist.
        FormatError: Not an ``.apr`` file.
        CorruptError: The header or index contradicts itself.
        LimitError: The file asks for more than ``limits`` allow.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.zeros((2, 3), np.float32)}, "m.apr", metadata={"k": "v"})
        >>> info = aprfast.inspect("m.apr")
        >>> info["layout"], info["metadata"]["k"]
        ('aprender', 'v')
        >>> info["tensors"]["w"]["dtype"], info["tensors"]["w"]["shape"]
        ('F32', [2, 3])
    """
    manifest = _find_manifest(target, storage_options)
    if manifest is not None:
        return shards.inspect(manifest, open_one=_open_single, limits=limits, storage_options=storage_options)
    source = _open_source_or_manifest(target, None, storage_options)  # opened once: AprFile takes it over for v2
    if not isinstance(source, Source):
        return shards.inspect(source, open_one=_open_single, limits=limits, storage_options=storage_options)
    try:
        is_v1 = layouts.is_v1(source)
    except BaseException:
        source.close()
        raise
    if is_v1:
        try:
            return layouts.v1.inspect(source)
        finally:
            source.close()
    # an encrypted file whose names are not encrypted lists without its key
    with AprFile(source, limits=limits, unknown_dtypes="raw", keys={"listing": True}) as f:
        # Every entry was checked while parsing (a hostile index fails here, not on
        # access); "tensors" builds each entry's dict when asked for, so inspect costs
        # the parse, not a million dicts.  An index read from a caller's buffer is
        # copied first: the caller may change or reuse the buffer afterwards.
        return {
            "layout": f.layout,
            "header": f.header,
            "metadata": f.stored_metadata,
            "tensors": f._file.tensor_index(),
        }

