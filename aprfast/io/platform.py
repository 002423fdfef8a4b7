"""Which operating-system call each POSIX-only path uses here, and its fallback, chosen
at run time (the table of every call site is docs/PORTABILITY.md).

The fallbacks are the paths a platform without the call takes (Windows above all).
``APRFAST_FALLBACKS`` forces them on any platform, so the tests on Linux run them and
compare their bytes with the normal paths': ``all`` or a comma list of

- ``pread``: positional reads without ``pread``/``preadv`` (C: ``lseek`` + ``read`` under
  one lock, the position put back; Python: ``aprfast._memory.pread_some``);
- ``fallocate``: no preallocation of a file's blocks;
- ``madvise``: no memory advice (huge pages, lazily freed cache pages, read-ahead);
- ``o_tmpfile``: no unnamed ``O_TMPFILE`` inode: the save writes a named temporary file;
- ``copy_file_range``: copies between files go through memory;
- ``dir_fsync``: no ``fsync`` of a directory after a rename (Windows cannot open one);
- ``o_direct``: no direct I/O: ``backend="direct"`` reads buffered and drops the pages
  it read from the cache with ``posix_fadvise`` (aprfast.io.direct), as on a
  filesystem that refuses ``O_DIRECT``;
- ``io_uring``: no io_uring ring (C: as where ``io_uring_setup`` fails: ENOSYS, EPERM
  under seccomp or ``kernel.io_uring_disabled``): direct reads take the threads
  engine (csrc/pio.c).

:func:`force` does the same from code (tests).  ``WINDOWS`` is true on Windows, where
the fallbacks are taken because the calls do not exist, whatever is forced.
"""

from __future__ import annotations

import errno
import os

from ..errors import AprFileInUseError

__all__ = ["WINDOWS", "NAMES", "ENV", "forced", "force", "uses", "pread", "preadv", "pwrite", "fsync_directory",
           "replace"]

WINDOWS = os.name == "nt"
ENV = "APRFAST_FALLBACKS"
#: Every fallback that can be forced; those of ``_C_NAMES`` are C paths (aprfast._memory).
NAMES = ("pread", "fallocate", "madvise", "o_tmpfile", "copy_file_range", "dir_fsync", "o_direct", "io_uring")
_C_NAMES = ("pread", "fallocate", "madvise", "io_uring")
# Win32 errors of a rename over a file another handle has open or mapped.
_IN_USE_WINERRORS = {5, 32, 1224}  # ERROR_ACCESS_DENIED, ERROR_SHARING_VIOLATION, ERROR_USER_MAPPED_FILE

_forced: frozenset = frozenset()


def _parse(value: str) -> frozenset:
    names = {part.strip().lower() for part in value.split(",") if part.strip()}
    if "all" in names:
        return frozenset(NAMES)
    unknown = sorted(names - set(NAMES))
    if unknown:
        raise ValueError(f"{ENV}: unknown fallback {', '.join(unknown)}; known: all, {', '.join(NAMES)}")
    return frozenset(names)


def forced() -> frozenset:
    """The fallbacks forced now (by ``APRFAST_FALLBACKS`` or :func:`force`)."""
    return _forced


def force(names) -> frozenset:
    """Force exactly ``names`` (an iterable of :data:`NAMES`, or "all"); return the set
    forced before, so a caller can put it back."""
    global _forced
    from .. import _memory

    chosen = _parse(names) if isinstance(names, str) else _parse(",".join(names))
    previous, _forced = _forced, chosen
    _memory.set_fallbacks(sorted(chosen & set(_C_NAMES)))
    return previous


def uses(name: str) -> bool:
    """True when the normal path of ``name`` runs: the OS has the call and its fallback
    is not forced."""
    if name not in NAMES:
        raise ValueError(f"no fallback named {name!r}")
    if name in _forced:
        return False
    if name == "pread":
        return hasattr(os, "pread")
    if name == "copy_file_range":
        return hasattr(os, "copy_file_range")
    if name == "dir_fsync":
        return not WINDOWS
    if name == "o_tmpfile":
        return hasattr(os, "O_TMPFILE")
    if name == "o_direct":
        return not WINDOWS
    if name == "io_uring":
        from .. import _memory

        return _memory.uring_available()
    return True  # fallocate, madvise: decided where they are called


# --- positional reads ---------------------------------------------------------------
def pread(fd: int, n: int, offset: int) -> bytes:
    """``os.pread``: up to ``n`` bytes at ``offset`` (fewer only at the end of the file)."""
    if uses("pread"):
        return os.pread(fd, n, offset)
    out = bytearray(n)
    got = _read_into(fd, memoryview(out), offset)
    del out[got:]
    return bytes(out)


def preadv(fd: int, view, offset: int) -> int:
    """``os.preadv(fd, [view], offset)``: bytes read into the start of ``view``, 0 at the end."""
    if uses("pread") and hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    return _read_into(fd, memoryview(view).cast("B"), offset)


def pwrite(fd: int, view, offset: int) -> int:
    """``os.pwrite``: bytes of ``view`` written at ``offset``.  Where it does not exist
    (Windows), a seek and a write: one writer per descriptor at a time."""
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, view, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.write(fd, view)


def _read_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` by positional reads until it is full or the file ends."""
    from .. import _memory

    done = 0
    while done < len(view):
        got = _memory.pread_some(fd, offset + done, view[done:])
        if got == 0:
            break
        done += got
    return done


# --- renames and their durability ---------------------------------------------------
def fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable.  Windows has no directory descriptor to
    sync (NTFS journals the rename itself); elsewhere a filesystem that refuses is
    skipped, the rename being atomic all the same."""
    if not uses("dir_fsync"):
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace(source: str, destination: str) -> None:
    """``os.replace``, with the refusal Windows gives when another handle has the
    destination open or memory-mapped raised as :class:`AprFileInUseError` (E007)."""
    try:
        os.replace(source, destination)
    except PermissionError as exc:
        if _in_use(exc, destination):
            raise AprFileInUseError(
                "cannot replace the file: it is in use (another process, or this one, has it open or "
                "memory-mapped, and Windows does not replace such a file); close every handle and "
                "array of it (aprfast.open(...).close(), del the arrays) and save again",
                path=destination) from exc
        raise


def _in_use(exc: PermissionError, destination: str) -> bool:
    winerror = getattr(exc, "winerror", None)
    if winerror is None and not WINDOWS:
        return False  # POSIX renames over open and mapped files; EACCES is permissions
    return (winerror in _IN_USE_WINERRORS or exc.errno in (errno.EACCES, errno.EBUSY)) and \
        os.path.exists(destination)


def _from_environment() -> None:
    value = os.environ.get(ENV, "")
    if value.strip():
        force(value)


_from_environment()
