"""Pickling open handles: a handle travels as the arguments that opened it, never as bytes.

``pickle.dumps(aprfast.open(path, **options))`` records ``(path, options)``; unpickling
calls ``aprfast.open(path, **options)`` again on the other side (another process of the
same machine, a Dask or Ray worker, a multiprocessing pool).  So a pickle is a few hundred
bytes whatever the model's size, and the receiving side parses the header and index
itself and maps the file there.  This is ordinary object pickling for IPC: it never runs
pickle on a model file.

The rules, each chosen so that nothing is silently different on the other side:

* Only handles opened from a path (made absolute when pickled, so a worker with another
  working directory finds the same file) or a URL pickle.  One opened from bytes, a file
  object or a descriptor has nothing to reopen by: pickling it raises
  :class:`PicklingRefusedError` rather than ship the bytes.
* A closed handle raises :class:`~aprfast.errors.AprIOError` (the file is closed), as
  every other use of a closed handle does.
* The file is identified when pickled, a local one by its size and modification time, a
  remote one by the version its source learnt (ETag or Last-Modified); a reopen that
  finds another raises :class:`~aprfast.errors.AprIOError` instead of reading another
  version of the model.
* Public keys and switches (``trusted_keys``, ``require_signature``,
  ``allow_unencrypted``, ``verify``, ``limits``, ``mode``, ...) travel as given, so the
  other side checks exactly what this side checked.  Secrets (``password``,
  ``private_key``) are never dropped silently: pickling a handle opened with one raises
  :class:`PicklingRefusedError` unless :func:`allow_pickled_keys` was called on it, and
  then the secret is inside the pickle, in clear.  (fsspec's ``storage_options`` travel
  as given, as fsspec's own file systems pickle them.)
"""

from __future__ import annotations

import functools
import os
import pickle
import re

from ..errors import AprError, AprIOError

__all__ = ["PicklingRefusedError", "allow_pickled_keys", "reopenable"]

#: Arguments of aprfast.open that are secrets.
SECRET_KEYS = ("password", "private_key")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class PicklingRefusedError(AprError, pickle.PicklingError):
    """E007: a handle that cannot travel by its opening arguments (opened from bytes or a
    file object), or one holding a secret that the caller did not allow into pickles."""

    code = "E007"


#: The decorated ``aprfast.open``, which unpickling calls (set by :func:`reopenable`, so
#: this module, below the API, never imports it).
_opener = None


def reopenable(open_function):
    """Decorate ``aprfast.open``: each handle it returns remembers how it was opened, and
    unpickled handles are opened again through it."""
    global _opener

    @functools.wraps(open_function)
    def opened(target, **options):
        handle = open_function(target, **options)
        try:
            handle._reopen = _how_to_reopen(target, options)
        except AttributeError:  # a handle type that takes no attributes: it just does not pickle
            pass
        return handle

    _opener = opened
    return opened


def _how_to_reopen(target, options):
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if isinstance(target, bytes) or not isinstance(target, str):
        return None  # bytes, buffers, file objects: nothing to reopen by
    if not _URL.match(target):
        target = os.path.abspath(target)
    return target, dict(options), False


def allow_pickled_keys(handle, allow: bool = True):
    """Let ``handle`` (opened with ``password=`` or ``private_key=``) pickle with that
    secret inside the pickle, in clear; returns ``handle``.  Only for pickles that stay
    between processes you trust (a local pool, a cluster on a private network).
    See docs/guide/distributed.md.

    Args:
        handle: A handle :func:`aprfast.open` returned for a path or URL.
        allow: True to allow the secret into pickles, False to refuse again.

    Returns:
        ``handle``.

    Examples:
        >>> import pickle, numpy as np, aprfast
        >>> from aprfast.distributed import allow_pickled_keys
        >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "sealed.apr", password="pw")
        >>> f = aprfast.open("sealed.apr", password="pw")
        >>> pickle.dumps(f)
        Traceback (most recent call last):
        ...
        aprfast.io.pickling.PicklingRefusedError: [E007] ...this AprFile was opened with password...
        >>> g = pickle.loads(pickle.dumps(allow_pickled_keys(f)))
        >>> g.get_tensor("w")
        array([0., 0.], dtype=float32)
        >>> g.close(); f.close()
    """
    how = getattr(handle, "_reopen", None)
    if how is not None:
        handle._reopen = (how[0], how[1], bool(allow))
    return handle


def reduce_handle(handle):
    """``__reduce__`` of AprFile, V1File and ShardedFile (see the module's rules)."""
    how = getattr(handle, "_reopen", None)
    kind = type(handle).__name__
    if how is None:
        raise PicklingRefusedError(f"cannot pickle this {kind}: it was not opened by aprfast.open from a path or "
                                   "URL (but from bytes, a file object or a descriptor, or by its constructor), so "
                                   "there is nothing to reopen it by on the other side, and its bytes are not "
                                   "shipped; open it with aprfast.open(path) to pickle it", path=handle.path)
    target, options, keys_allowed = how
    if handle.closed:
        raise AprIOError(f"the file is closed: a closed {kind} cannot be pickled", path=target)
    secrets = [k for k in SECRET_KEYS if options.get(k) is not None]
    if secrets and not keys_allowed:
        raise PicklingRefusedError(f"this {kind} was opened with {' and '.join(secrets)}; its pickle would carry "
                                   "that secret in clear, so it is refused.  Call "
                                   "aprfast.distributed.allow_pickled_keys(handle) to allow it, or open the "
                                   "file on the other side with the key", path=target)
    return _reopen, (target, options, keys_allowed, _identity(handle))


def _identity(handle):
    """What tells this version of the file from another: (size, mtime_ns, inode) of the
    local file the handle reads (the inode because a replacing save renames a new file
    into place, possibly within one tick of the clock that stamps mtime) (a sharded model's
    manifest), or a remote object's version
    (ETag or Last-Modified, as its source learnt it); None when there is neither."""
    try:
        if getattr(handle, "layout", None) == "sharded":
            version = getattr(handle, "manifest_version", None)
            if version is not None:  # a manifest at a URL
                return "version", repr(version)
            st = os.stat(handle.path)
        else:
            source = getattr(handle, "_raw_source", None) or getattr(handle, "_source", None)
            version = getattr(source, "version", None)
            if version is not None:  # aprfast.remote sources
                return "version", repr(version)
            fileno = getattr(source, "fileno", None)
            if fileno is None:
                return None
            st = os.fstat(fileno())
    except (OSError, ValueError):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _reopen(target, options, keys_allowed, identity):
    handle = _opener(target, **options)
    try:
        if identity is not None:
            now = _identity(handle)
            if now is not None and now != tuple(identity):
                raise AprIOError(f"the file changed since this handle was pickled ({_shown(identity)} then, "
                                 f"{_shown(now)} now); open it again to read the new version", path=target)
    except BaseException:
        handle.close()
        raise
    if keys_allowed:
        allow_pickled_keys(handle)
    return handle


def _shown(identity) -> str:
    if identity[0] == "version":
        return f"version {identity[1]}"
    return f"size {identity[0]}, mtime_ns {identity[1]}, inode {identity[2]}"
