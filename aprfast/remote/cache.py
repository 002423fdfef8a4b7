"""aprfast's own download cache (seed 001 §13.9): ``apr download`` copies a remote file
into ``APR_CACHE`` (:func:`aprfast.config.cache_dir`, ``~/.cache/apr`` by default), and
``apr cache info|clear`` report and empty it.

Layout: ``{cache}/{scheme}/{where}/{path}`` (``hf/org/repo/model.apr``,
``https/example.org/models/m.apr``, ``s3/bucket/key.apr``) and ``{cache}/checksum.json``
recording each file's URL (redacted: no userinfo, no query, see
:func:`aprfast.remote.redact_url`), size and SHA-256.  Files are written through
:class:`aprfast.io.atomic.AtomicFile`, so an interrupted or refused download leaves no
partial file and no record; a download is bounded
(``max_size``: by default :data:`DEFAULT_MAX_SIZE`, or :data:`DEFAULT_MAX_UNDECLARED`
for a body whose length the server does not declare; a body must match its
Content-Length);
``clear`` removes only what ``checksum.json`` records (and then-empty directories),
never anything else a user keeps in that directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path

from ..errors import AprIOError, LimitError
from . import is_url, open_stream
from ._url import redact_url, scrub

__all__ = ["cache_path_for", "download", "cache_info", "cache_clear", "CHECKSUMS", "DEFAULT_MAX_SIZE",
           "DEFAULT_MAX_UNDECLARED"]

CHECKSUMS = "checksum.json"
re_hf_repo = re.compile(r"hf://(datasets/|spaces/)?([^/@]+)/([^/@]+)(?:@([^/]+))?/?")
_CHUNK = 8 << 20
#: The most bytes ``download`` writes unless told otherwise: 64 GiB, above the Hugging
#: Face Hub's limit of 50 GB per file, so a body without an end (or a lying server)
#: cannot fill the disk.
DEFAULT_MAX_SIZE = 64 << 30
#: ...and at most this many (1 GiB) of a body whose length the server does not declare
#: (no Content-Length: it ends when the server closes, or never): static files and
#: object stores always declare theirs; pass ``max_size`` to take more.
DEFAULT_MAX_UNDECLARED = 1 << 30


def _cache_root(cache_dir) -> Path:
    if cache_dir is not None:
        path = Path(cache_dir).expanduser()
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path
    from ..config import cache_dir as configured

    return configured()


def cache_path_for(url: str) -> Path:
    """The path of ``url``'s copy relative to the cache (ValueError for a URL that does
    not name a file, or whose parts would leave the cache)."""
    if not is_url(url):
        raise ValueError(f"not a URL: {redact_url(url)!r}")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "hf":
        from .hf import parse_hf_url

        repo_type, repo_id, revision, filename = parse_hf_url(url)
        kind = "" if repo_type == "model" else f"{repo_type}s/"
        pieces = ["hf", *f"{kind}{repo_id}{'@' + revision if revision else ''}".split("/"), *filename.split("/")]
    else:
        where = (parts.netloc.rpartition("@")[2] or "local").replace(":", "_")  # never the userinfo
        pieces = [scheme, where, *urllib.parse.unquote(parts.path).split("/")]
        pieces = [pieces[0], pieces[1], *[p for p in pieces[2:] if p != ""]]
    if len(pieces) < 3 or any(p in ("", ".", "..") or "/" in p or "\\" in p or "\0" in p for p in pieces):
        raise ValueError(f"{redact_url(url)!r} does not name a file that can be cached")
    return Path(*pieces)


def _load_checksums(root: Path) -> dict:
    path = root / CHECKSUMS
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise AprIOError(f"cannot read the cache's records: {exc}", path=str(path)) from exc
    return records if isinstance(records, dict) else {}


def _save_checksums(root: Path, records: dict) -> None:
    from ..io.atomic import AtomicFile

    data = json.dumps(records, indent=1, sort_keys=True).encode()
    atomic = AtomicFile(root / CHECKSUMS)
    try:
        os.write(atomic.fd, data)
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()


def download(url: str, *, cache_dir=None, storage_options=None, force: bool = False,
             max_size: int | None = None) -> Path:
    """Copy the file at ``url`` into the cache and return its local path (already there
    with its recorded size: returned without a request unless ``force``).

    ``storage_options`` as for :func:`aprfast.remote.open_stream` (for ``http(s)://``:
    ``headers``, ``timeout``, ``min_rate``, ``deadline``).  ``max_size``: the most bytes
    written; None (the default): :data:`DEFAULT_MAX_SIZE` (64 GiB) for a file whose size
    is declared (HTTP Content-Length, fsspec's size), :data:`DEFAULT_MAX_UNDECLARED`
    (1 GiB) for a body without one; 0: no bound.

    Errors: LimitError (E008) for a file larger than ``max_size`` (refused before reading
    when its declared size says so); AprIOError (E007) for a body that ends short of its
    Content-Length or breaks off, RemoteTimeoutError for a server slower than the
    time bounds.  After any error nothing is recorded and no partial file is left.  The
    record (``checksum.json``) and every message show the URL redacted.  Example::

        path = download("https://example.org/models/m.apr", max_size=8 << 30)
    """
    from ..io.atomic import AtomicFile

    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0):
        raise ValueError(f"max_size must be a number of bytes (0: no bound) or None, not {max_size!r}")
    shown = redact_url(url)
    root = _cache_root(cache_dir)
    repo = hf_repo(url)
    if repo is not None:
        return _download_hf_repo(url, root, *repo, force=force)
    relative = cache_path_for(url)
    target = root / relative
    records = _load_checksums(root)
    known = records.get(relative.as_posix())
    if not force and known and target.is_file() and target.stat().st_size == known.get("size"):
        return target
    stream = None
    atomic = None
    digest, size = hashlib.sha256(), 0
    try:
        stream = open_stream(url, storage_options)
        expected = getattr(stream, "size", None)  # fsspec files know theirs; HTTP bodies: the Content-Length
        declared = isinstance(expected, int)
        limit = max_size if max_size is not None else DEFAULT_MAX_SIZE if declared else DEFAULT_MAX_UNDECLARED
        limit = limit or None  # 0: no bound
        if declared and limit is not None and expected > limit:
            raise LimitError(f"the file is {expected} bytes, more than max_size={limit}", path=shown)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic = AtomicFile(target)
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while True:
            # at most one byte past max_size is ever read, and none is written
            want = _CHUNK if limit is None else min(_CHUNK, limit - size + 1)
            n = stream.readinto(view[:want])
            if not n:
                break
            if limit is not None and size + n > limit:
                raise LimitError(f"the body is longer than max_size={limit} bytes"
                                 + ("" if declared else " (the server declared no length)"), path=shown)
            digest.update(view[:n])
            written = 0
            while written < n:
                written += os.write(atomic.fd, view[written:n])
            size += n
        if isinstance(expected, int) and expected != size:
            raise AprIOError(f"download ended after {size} of {expected} bytes", path=shown)
    except BaseException as exc:
        if atomic is not None:
            atomic.abort()
        if isinstance(exc, OSError) and not isinstance(exc, AprIOError):
            error = AprIOError(f"download failed after {size} bytes: {scrub(exc, url)}", path=shown)
        else:
            raise
    else:
        error = None
    finally:
        if stream is not None:
            stream.close()
    if error is not None:  # out here: chained to nothing that may quote the URL
        raise error
    atomic.commit()
    records = _load_checksums(root)  # again: another download may have recorded meanwhile
    records[relative.as_posix()] = {"url": shown, "size": size, "sha256": digest.hexdigest()}
    _save_checksums(root, records)
    return target


def hf_repo(url: str):
    """(repo_type, repo_id, revision) for an ``hf://`` URL naming a whole repository."""
    m = re_hf_repo.fullmatch(url)
    if not m:
        return None
    kind, org, repo, revision = m.group(1), m.group(2), m.group(3), m.group(4)
    return {"datasets/": "dataset", "spaces/": "space", None: "model"}[kind], f"{org}/{repo}", revision


def _download_hf_repo(url, root: Path, repo_type, repo_id, revision, *, force: bool) -> Path:
    """A whole Hub repository into ``{cache}/hf/org/repo`` with huggingface_hub's
    ``snapshot_download`` (HF_HUB_OFFLINE honoured: offline, nothing is fetched)."""
    from .._optional import require
    from ..errors import AprFileNotFoundError
    from .hf import hub_offline

    hub = require("huggingface_hub")
    relative = Path("hf", *repo_id.split("/"))
    if revision:
        relative = relative.with_name(f"{relative.name}@{revision}")
    target = root / relative
    if hub_offline():
        raise AprFileNotFoundError("HF_HUB_OFFLINE is set: a repository cannot be downloaded", path=url)
    try:
        hub.snapshot_download(repo_id, repo_type=repo_type, revision=revision, local_dir=str(target),
                              force_download=force)
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's errors, typed here
        raise AprIOError(f"cannot download the repository: {type(exc).__name__}: {scrub(exc, url)}",
                         path=redact_url(url)) from None
    records = _load_checksums(root)
    for path in sorted(target.rglob("*")):
        if path.is_file() and ".cache" not in path.relative_to(target).parts:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    digest.update(block)
            records[path.relative_to(root).as_posix()] = {"url": redact_url(url), "size": path.stat().st_size,
                                                          "sha256": digest.hexdigest()}
    _save_checksums(root, records)
    return target


def cache_info(*, cache_dir=None) -> dict:
    """The cache's directory, its recorded files (URL, size, SHA-256, present), and totals."""
    root = _cache_root(cache_dir)
    records = _load_checksums(root)
    files = []
    for relative, record in sorted(records.items()):
        path = root / relative
        present = path.is_file()
        url = record.get("url")  # redacted again: records written before URLs were
        files.append({"path": relative, "url": redact_url(url) if isinstance(url, str) else url,
                      "size": record.get("size"),
                      "sha256": record.get("sha256"),
                      "present": present and path.stat().st_size == record.get("size")})
    return {"cache_dir": str(root), "files": files, "count": len(files),
            "bytes": sum(f["size"] or 0 for f in files if f["present"])}


def cache_clear(*, cache_dir=None) -> dict:
    """Remove every recorded file, the directories that became empty, and the records."""
    root = _cache_root(cache_dir)
    records = _load_checksums(root)
    removed, freed = 0, 0
    for relative in records:
        path = root / relative
        if root not in path.resolve().parents:  # a hand-edited record pointing elsewhere
            continue
        try:
            freed += path.stat().st_size
            path.unlink()
            removed += 1
        except FileNotFoundError:
            continue
        parent = path.parent
        while parent != root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
    try:
        (root / CHECKSUMS).unlink()
    except FileNotFoundError:
        pass
    return {"cache_dir": str(root), "removed": removed, "bytes": freed}
