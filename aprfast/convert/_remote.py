"""Converter sources at a URL: ``hf://`` through huggingface_hub's cache, anything else
(``http(s)://``, ``s3://``, any fsspec URL) fetched into a temporary directory.

A conversion reads every tensor of its source, so the source is made local first and
then converted like a file (the format modules read local files: maps, ``pread``,
``copy_file_range``):

- ``hf://org/repo[@revision]/path/file``: the file huggingface_hub has cached is used
  where it lies (no request, no copy); with ``HF_HUB_OFFLINE=1`` only the cache is used
  (a file missing from it is :class:`~aprfast.errors.AprFileNotFoundError`, nothing is
  sent); otherwise ``hf_hub_download`` fetches it into that cache (tokens from
  ``storage_options={"token": ...}``, ``HF_TOKEN`` or the cached login).  The files a
  checkpoint needs beside it come the same way: the shards an index names
  (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``, an ``.apr``
  manifest) and, for safetensors, ``tokenizer.json`` when the repository has one.
- any other URL: the object (and the shards / tokenizer beside it, as above) is read
  with parallel ranged requests (:mod:`aprfast.remote`) straight into a file in a
  temporary directory next to the destination (an
  :class:`aprfast.io.atomic.TempDirectory`: named and locked as every temporary of
  the package, so one a killed conversion leaves is swept by the next save there),
  which is removed when the conversion ends, whatever happens.  Nothing is cached, so
  ``APR_CACHE`` is not involved (``apr download`` puts a copy there for repeated use).

Shard names taken from an index must be plain file names (no "/", "\\", "..", no
URL syntax), checked before anything is fetched.  Errors show URLs redacted
(:func:`aprfast.remote.redact_url`: no userinfo, no query).
"""

from __future__ import annotations

import mmap
import os

from ..errors import AprFileNotFoundError, AprIOError, CorruptError, FormatError, LimitError

__all__ = ["local_source"]

#: An index / manifest fetched to find shards is refused above this size.
MAX_INDEX_BYTES = 256 << 20
_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json", ".apr.index.json")


class LocalCopy:
    """A local path for a URL source, and what to remove afterwards (a context manager):
    ``temporary``, a :class:`~aprfast.io.atomic.TempDirectory` or None."""

    def __init__(self, path: str, temporary=None):
        self.path, self._temporary = path, temporary

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        temporary, self._temporary = self._temporary, None
        if temporary is not None:
            temporary.close()


def local_source(url: str, *, storage_options=None, destination=None, tokenizer: bool = True) -> LocalCopy:
    """A :class:`LocalCopy` whose ``path`` the converters read for ``url``."""
    from ..io.atomic import TempDirectory
    from ..remote import url_scheme

    if url_scheme(url) == "hf":
        return LocalCopy(_hf_local(url, storage_options, tokenizer))
    parent = os.path.dirname(os.path.abspath(os.fspath(destination))) if destination is not None else None
    temporary = TempDirectory(parent if parent and os.path.isdir(parent) else None, "aprfast-source")
    try:
        return LocalCopy(_fetch_set(url, storage_options, temporary.path, tokenizer), temporary)
    except BaseException:
        temporary.close()
        raise


# --- shards beside an index ----------------------------------------------------------------
def _name_of(url: str) -> str:
    return url.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[-1]


def _plain(name, index) -> str:
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0?#%:") or \
            any(ord(c) < 0x21 for c in name):
        raise CorruptError(f"shard name {name!r} is not a plain file name beside the index", path=_shown(index))
    return name


def _shown(url) -> str:
    """``url`` as errors show it: no userinfo, no query (:func:`aprfast.remote.redact_url`)."""
    from ..remote import redact_url

    return redact_url(url)


def _companions(local_index: str, url: str) -> list:
    """The shard file names an index at ``local_index`` names (none for a model file),
    read by the parsers a local index goes through (``safetensors.parse_index`` for a
    ``weight_map``, ``shards.parse_manifest`` for an ``.apr`` manifest), so a fetched
    index is refused, typed, exactly where the same file on disk would be; then each
    name must also be free of URL syntax (:func:`_plain`)."""
    name = _name_of(url)
    if not name.endswith(_INDEX_SUFFIXES):
        return []
    shown = _shown(url)
    size = os.path.getsize(local_index)
    if size > MAX_INDEX_BYTES:
        raise LimitError(f"index file is {size} bytes, more than {MAX_INDEX_BYTES}", path=shown)
    try:
        with open(local_index, "rb") as f:
            raw = f.read(MAX_INDEX_BYTES + 1)
    except OSError as exc:
        raise AprIOError(f"cannot read the fetched index: {exc}", path=shown) from exc
    if name.endswith(".apr.index.json"):
        from ..files.shards import parse_manifest
        from ..limits import Limits

        names = [shard["file"] for shard in parse_manifest(raw, Limits(), shown)["shards"]]
    else:
        from .safetensors import parse_index

        names = sorted(set(parse_index(raw, shown, "a checkpoint index").values()))
    if not names:
        raise FormatError("the index names no shards", path=shown)
    return [_plain(n, url) for n in names]


def _wants_tokenizer(url: str, tokenizer: bool) -> bool:
    name = _name_of(url)
    return tokenizer and (name.endswith(".safetensors") or name.endswith(".safetensors.index.json"))


# --- any URL: ranged reads into a temporary directory --------------------------------------
def _fetch_set(url: str, storage_options, directory: str, tokenizer: bool) -> str:
    name = _plain(_name_of(url), url)
    main = os.path.join(directory, name)
    _fetch(url, main, storage_options)
    base = url.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[0] + "/"
    for shard in _companions(main, url):
        _fetch(base + shard, os.path.join(directory, shard), storage_options)
    if _wants_tokenizer(url, tokenizer):
        try:
            _fetch(base + "tokenizer.json", os.path.join(directory, "tokenizer.json"), storage_options)
        except AprFileNotFoundError:
            pass  # no tokenizer beside the weights: converted without one, as a local file is
    return main


def _fetch(url: str, path: str, storage_options) -> None:
    """The object at ``url`` into a new file ``path``: parallel ranged requests straight
    into the file's mapped pages (the length is the one the first request learnt)."""
    from ..remote import open_url

    source = open_url(url, storage_options, mode="pread")
    try:
        size = source.size
        _check_room(size, path, url)
        with open(path, "x+b") as f:  # read too: a shared writable map needs both
            if not size:
                return
            f.truncate(size)
            m = mmap.mmap(f.fileno(), size)
            try:
                _read_into(source, m)
            finally:
                try:
                    m.close()
                except BufferError:  # a view still exported: the map goes with the last one
                    pass
    except OSError as exc:
        if isinstance(exc, AprIOError):
            raise
        raise AprIOError(f"cannot write the fetched copy: {exc.strerror or exc}", path=path) from exc
    finally:
        source.close()


def _check_room(size: int, path: str, url: str) -> None:
    """Refuse, before the copy is sized, an object larger than a download may be
    (:data:`aprfast.remote.cache.DEFAULT_MAX_SIZE`) or than the free space beside the
    destination: the length is the server's word, and a server that claims a terabyte
    of zeros would otherwise be fetched until the disk is full (LimitError, E008)."""
    import shutil

    from ..remote.cache import DEFAULT_MAX_SIZE

    if size > DEFAULT_MAX_SIZE:
        raise LimitError(f"the object is {size} bytes, more than {DEFAULT_MAX_SIZE} (a remote source is copied "
                         "before it is converted: download it with `apr download --max-size` first)", path=_shown(url))
    try:
        free = shutil.disk_usage(os.path.dirname(path) or ".").free
    except OSError:
        return
    if size > free:
        raise LimitError(f"the object is {size} bytes; only {free} bytes are free for its copy in "
                         f"{os.path.dirname(path)}", path=_shown(url))


def _read_into(source, mapping) -> None:
    """``source.readinto(0, ...)`` into the whole of ``mapping``.  When the read fails
    (a typed error: RemoteChangedError, AprIOError), the frames in its traceback still
    hold slices of the view (the ranged reader waits for every request before raising,
    so nothing writes into them any more): their locals are dropped, so the view and
    then the map can be released and the typed error goes through, not a BufferError
    ("cannot close exported pointers exist") raised while cleaning up."""
    view = memoryview(mapping)
    try:
        source.readinto(0, view)
    except BaseException as exc:
        _drop_frames(exc)
        raise
    finally:
        try:
            view.release()
        except BufferError:  # a slice held elsewhere: released when it goes
            pass


def _drop_frames(exc) -> None:
    """Clear the locals of the finished frames of ``exc``'s traceback and of the
    exceptions it was raised from or during (executing frames are left alone)."""
    import traceback

    seen, pending = set(), [exc]
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        pending += [exc.__cause__, exc.__context__]


# --- hf:// through huggingface_hub ----------------------------------------------------------
def _hf_local(url: str, storage_options, tokenizer: bool) -> str:
    from .._optional import require
    from ..remote.hf import parse_hf_url

    repo_type, repo_id, revision, filename = parse_hf_url(url)
    options = dict(storage_options or {})
    main = _hf_file(require("huggingface_hub"), url, repo_type, repo_id, revision, filename, options)
    folder = filename.rsplit("/", 1)[0] + "/" if "/" in filename else ""
    for shard in _companions(main, url):
        _hf_file(require("huggingface_hub"), url, repo_type, repo_id, revision, folder + shard, options)
    if _wants_tokenizer(url, tokenizer):
        try:
            _hf_file(require("huggingface_hub"), url, repo_type, repo_id, revision, folder + "tokenizer.json",
                     options)
        except AprFileNotFoundError:
            pass
    return main


def _hf_file(hub, url, repo_type, repo_id, revision, filename, options) -> str:
    """The local path of one repository file: huggingface_hub's cached copy, or (online)
    downloaded into that cache.  All files of a revision land in one snapshot directory,
    so shards and tokenizer sit beside the index as the converters expect."""
    from ..remote.hf import hub_offline

    cache_dir = options.get("cache_dir")
    cached = hub.try_to_load_from_cache(repo_id, filename, revision=revision, repo_type=repo_type,
                                        cache_dir=cache_dir)
    if isinstance(cached, str):
        return cached
    where = f"{filename!r} of {repo_type} {repo_id!r}{'@' + revision if revision else ''}"
    url = _shown(url)
    if hub_offline():
        raise AprFileNotFoundError(f"HF_HUB_OFFLINE is set and {where} is not in huggingface_hub's cache", path=url)
    try:
        return hub.hf_hub_download(repo_id, filename, revision=revision, repo_type=repo_type, cache_dir=cache_dir,
                                   token=options.get("token"))
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's errors, typed here
        kind = type(exc).__name__
        if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError", "RepositoryNotFoundError",
                    "RevisionNotFoundError", "LocalEntryNotFoundError") or isinstance(exc, FileNotFoundError):
            raise AprFileNotFoundError(f"{where} not found: {exc}", path=url) from None
        raise AprIOError(f"cannot download {where}: {kind}: {exc}", path=url) from None
