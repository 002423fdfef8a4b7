"""Files that appear whole or not at all: :class:`AtomicFile` writes a temporary file
beside the target (unnamed with ``O_TMPFILE`` where the kernel has it, so a killed
process leaves nothing), fsyncs it when asked, and renames or links it into place;
:func:`publish_set` publishes several such files as one set (shards, then the index
that names them, last); :class:`TempDirectory` is a scratch directory (a download).
Every writer of the package (v2 and v1 models, shards and their manifests, converted
formats, keys, licences, downloads) makes its temporaries through here.

**One naming rule, one sweep rule.**  Every temporary, file or directory, is named
``.{base}.aprfast-{pid}-{16 hex digits}.tmp`` (:data:`TEMP_NAME`) in the directory it
is published into, and its writer holds an exclusive ``flock`` on it from before it
has that name until it is renamed or removed.  Every new AtomicFile / TempDirectory
first sweeps its directory (:func:`sweep_abandoned_temps`): an entry with such a name
whose lock can be taken has lost its writer (``kill -9``, OOM killer, power loss) and
is removed (a directory with everything in it); one whose lock is held belongs to a
live writer and is left alone.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile

from .._memory import preallocate
from ..errors import AprError, AprIOError
from . import platform as _platform

__all__ = ["AtomicFile", "TempDirectory", "TEMP_NAME", "open_anonymous", "publish_set", "set_member_names",
           "is_set_member", "sweep_abandoned_temps"]


class AtomicFile:
    """A temporary file beside ``path`` that replaces it only on :meth:`commit`.

    A save killed at any moment (``kill -9``, OOM killer) leaves the target whole, old
    or new, and no temporary file that lives forever:

    - On Linux the data goes to an unnamed ``O_TMPFILE`` inode in the target's
      directory, which the kernel frees when its descriptor closes, however the
      process ends.  On commit it is linked in through ``/proc/self/fd``: straight to
      the target's name when there is none yet, else to a recognisable temporary name
      that is renamed over the target at once (the microseconds between the two are
      covered by the sweep below).
    - Elsewhere, or where the filesystem has no ``O_TMPFILE`` (NFS, old tmpfs), the
      file is created under a recognisable name, ``.{name}.aprfast-{pid}-{random}.tmp``.

    Either way a named temporary file is ``flock``-ed by its writer from before it has
    a name until it is renamed or removed, and every new AtomicFile first sweeps its
    directory: a recognisable temporary file whose lock can be taken has lost its
    writer and is removed; one whose lock is held belongs to a live save and is left.
    ``mode`` is the mode ``open()`` would give a new file (umask applied).
    """

    def __init__(self, path, *, durable: bool = True, mode: int = 0o666):
        self.path = os.fspath(path)
        self.durable = durable
        self.directory = os.path.dirname(os.path.abspath(self.path))
        self._base = os.path.basename(self.path)
        self.temp_path = None  # the temporary name while the file has one
        self._staged = False
        _sweep_if_changed(self.directory)
        try:
            self.fd = _open_unnamed(self.directory, mode)
            if self.fd < 0:
                self.fd, self.temp_path = _create_named_temp(self.directory, self._base, mode)
        except OSError as exc:
            raise AprIOError(f"cannot create a temporary file in {self.directory}: {exc.strerror or exc}",
                             path=self.path) from exc

    def commit(self) -> None:
        """Replace the target with the written file (fsynced first when ``durable``)."""
        self._commit(sync_directory=self.durable)

    def stage(self) -> None:
        """Give the written file its recognisable temporary name now, fsynced when
        ``durable``, and keep it locked: a file written for a set (:func:`publish_set`)
        waits there, swept if its writer dies, until :meth:`commit` renames it."""
        try:
            if self.durable:
                os.fsync(self.fd)
            if self.temp_path is None:
                self._link_temporary()
            self._staged = True
        except AprError:
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise AprIOError(f"cannot stage the written file: {exc.strerror or exc}", path=self.path) from exc

    def _commit(self, sync_directory: bool) -> None:
        try:
            if self.durable and not self._staged:
                os.fsync(self.fd)
            if self.temp_path is None:
                self._link_unnamed()
            else:
                if fcntl is None:  # Windows renames only closed files
                    os.close(self.fd)
                    self.fd = -1
                _platform.replace(self.temp_path, self.path)
            self.temp_path = None
            self._close()  # releases the lock only now: a swept name is never this file
            if sync_directory:
                _platform.fsync_directory(self.directory)
            _note_swept(self.directory)
        except AprError:
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise AprIOError(f"cannot commit the written file: {exc.strerror or exc}", path=self.path) from exc

    def abort(self) -> None:
        if self.temp_path is not None:
            try:
                os.unlink(self.temp_path)  # while still locked, so no sweep races it
            except OSError:
                pass
            self.temp_path = None
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def _link_unnamed(self) -> None:
        """Give the O_TMPFILE inode the target's name."""
        global _proc_links_work
        try:
            if _link_fd(self.fd, self.path):  # no target yet: one step, never a temp name
                return
            while True:
                temp = _temp_path(self.directory, self._base)
                if _link_fd(self.fd, temp):
                    break
            self.temp_path = temp
            _platform.replace(temp, self.path)
        except OSError as exc:
            if self.temp_path is not None or exc.errno not in _LINK_REFUSED:
                raise
            # Linking through /proc refused (no /proc, a sandbox): copy to a named file,
            # and name temporary files from the start from now on.
            _proc_links_work = False
            self._publish_by_copy()

    def _link_temporary(self) -> None:
        """Give the O_TMPFILE inode a recognisable temporary name (it stays locked:
        the lock is on the open file, whatever its names)."""
        global _proc_links_work
        try:
            while True:
                temp = _temp_path(self.directory, self._base)
                if _link_fd(self.fd, temp):
                    break
            self.temp_path = temp
        except OSError as exc:
            if exc.errno not in _LINK_REFUSED:
                raise
            _proc_links_work = False
            self._copy_to_named()

    def _publish_by_copy(self) -> None:
        self._copy_to_named()
        _platform.replace(self.temp_path, self.path)

    def _copy_to_named(self) -> None:
        """Copy the unnamed file to a new locked temporary file (fsynced when durable)."""
        fd, temp = _create_named_temp(self.directory, self._base, 0o600)
        unnamed, self.fd, self.temp_path = self.fd, fd, temp
        try:
            os.fchmod(fd, os.fstat(unnamed).st_mode & 0o7777)
            size = os.fstat(unnamed).st_size
            if not kernel_copy(unnamed, fd, 0, size):
                _copy_through_memory(unnamed, fd, 0, size)
        finally:
            os.close(unnamed)
        if self.durable:
            os.fsync(fd)


# --- temporary files that never outlive their writer -----------------------------

try:
    import fcntl
except ImportError:  # Windows: an open file cannot be deleted, which is lock enough
    fcntl = None

_O_TMPFILE = getattr(os, "O_TMPFILE", 0) if sys.platform.startswith("linux") else 0
_proc_links_work = bool(_O_TMPFILE) and os.path.isdir("/proc/self/fd")
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_LINK_REFUSED = {errno.ENOENT, errno.EXDEV, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP, errno.ENOSYS}
#: The one name of every temporary (file or directory) of every writer of the package:
#: ``.{base}.aprfast-{pid}-{16 hex digits}.tmp``; group 1 is the writer's pid.
TEMP_NAME = re.compile(r"\..*\.aprfast-(\d+)-[0-9a-f]{16}\.tmp", re.DOTALL)
_TEMP_NAME = TEMP_NAME


def _temp_path(directory: str, base: str) -> str:
    """``.{base}.aprfast-{pid}-{random}.tmp`` beside the target (the base shortened when
    the name would pass the usual 255-byte limit)."""
    if len(os.fsencode(base)) > 180:
        base = base[:40]
    return os.path.join(directory, f".{base}.aprfast-{os.getpid()}-{secrets.token_hex(8)}.tmp")


def _open_unnamed(directory: str, mode: int) -> int:
    """An O_TMPFILE descriptor in ``directory``, or -1 where there is none (or its
    fallback is forced: aprfast.io.platform)."""
    if not _proc_links_work or not _platform.uses("o_tmpfile"):
        return -1
    try:
        fd = os.open(directory, _O_TMPFILE | os.O_RDWR, mode)
    except OSError:  # EOPNOTSUPP, EISDIR (kernel without O_TMPFILE), EINVAL...: use a name
        return -1
    _lock(fd)  # nobody else can open it: held through the instant it has a temporary name
    return fd


def _link_fd(fd: int, path: str) -> bool:
    """Link the O_TMPFILE inode behind ``fd`` at ``path``; False if ``path`` exists.

    ``linkat(fd, "", AT_EMPTY_PATH)`` needs CAP_DAC_READ_SEARCH; following the
    /proc/self/fd link does not.  (A given ``src_dir_fd`` makes Python call linkat
    with AT_SYMLINK_FOLLOW rather than link(), which would not follow it.)"""
    proc = os.open("/proc/self/fd", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
        return True
    except FileExistsError:
        return False
    finally:
        os.close(proc)


def _create_named_temp(directory: str, base: str, mode: int, extra_flags: int = 0):
    """(fd, path) of a new recognisable temporary file, locked before anyone could
    sweep it away.  A sweep that slipped in between creation and lock holds the lock
    (it is about to unlink the file) or has unlinked it, which the link count shows;
    either way the name is given up and another tried.  Never blocks on a lock."""
    flags = (os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
             | extra_flags)
    for _ in range(100):
        path = _temp_path(directory, base)
        try:
            fd = os.open(path, flags, mode)
        except FileExistsError:
            continue
        if _lock(fd) is not False and os.fstat(fd).st_nlink:
            return fd, path
        try:
            os.unlink(path)  # ours, and whoever holds the lock only wants it gone
        except OSError:
            pass
        os.close(fd)
    raise OSError(errno.EEXIST, "no usable temporary file name after 100 tries")


def open_anonymous(directory, mode: int = 0o600) -> int:
    """A descriptor of a file with no name (a spool): O_TMPFILE, or a recognisable
    temporary file unlinked at once, so a kill in between leaves a name the sweep
    knows.  On Windows the name stays until the file is closed."""
    directory = directory or tempfile.gettempdir()
    fd = _open_unnamed(directory, mode)
    if fd >= 0:
        return fd
    # O_TEMPORARY: Windows deletes the file when its last handle closes, even on a kill.
    fd, path = _create_named_temp(directory, "spool", mode, getattr(os, "O_TEMPORARY", 0))
    if fcntl is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # a sweep took it first: just as good
    return fd


class TempDirectory:
    """A scratch directory in ``directory`` named by :data:`TEMP_NAME` and locked by
    this process until :meth:`close` removes it (a context manager).  A killed writer
    leaves it unlocked, and the next AtomicFile or TempDirectory made there removes it.
    Where directories cannot be locked (Windows, some network filesystems) it is still
    removed by :meth:`close`, but never swept.

    Example::

        with TempDirectory(parent, "aprfast-source") as scratch:
            fetch_into(os.path.join(scratch.path, "model.apr"))
    """

    def __init__(self, directory, base: str):
        directory = os.fspath(directory) if directory else tempfile.gettempdir()
        self.directory = os.path.abspath(directory)
        _sweep_if_changed(self.directory)
        self.path, self._fd = None, -1
        try:
            for _ in range(100):
                path = _temp_path(self.directory, base)
                try:
                    os.mkdir(path, 0o700)
                except FileExistsError:
                    continue
                fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
                # A sweep that slipped in between mkdir and this lock holds it (and is
                # removing the directory) or has removed it: give the name up.
                if _lock(fd) is not False and _is_entry(path, fd):
                    self.path, self._fd = path, fd
                    break
                os.close(fd)
            else:
                raise OSError(errno.EEXIST, "no usable temporary directory name after 100 tries")
        except OSError as exc:
            raise AprIOError(f"cannot create a temporary directory in {self.directory}: {exc.strerror or exc}",
                             path=self.directory) from exc

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Remove the directory and everything in it (while still locked), then unlock."""
        path, self.path = self.path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _is_entry(path: str, fd: int) -> bool:
    try:
        return _same_file(os.lstat(path), os.fstat(fd))
    except OSError:
        return False


# --- sets of files published together (shards and their index) ----------------------

#: ``.{8 hex}`` between a set member's canonical name and its extension: the names a
#: set takes when the live set already uses the canonical ones.
_TAG = r"\.[0-9a-f]{8}"


def set_member_names(stem: str, ext: str, count: int, live) -> list:
    """The names of a new set of ``count`` members: ``{stem}-0000N-of-0000M{ext}``
    (N 1-based, Hugging Face's and aprender's shard names) unless the live set (the
    names its index names, ``live``) uses one of them; then every name carries one
    fresh tag, ``{stem}-0000N-of-0000M.{8 hex}{ext}``, so no file a reader of the live
    set may open is touched before the index switches."""
    names = [f"{stem}-{i + 1:05d}-of-{count:05d}{ext}" for i in range(count)]
    if not set(names) & set(live):
        return names
    tag = secrets.token_hex(4)
    return [f"{name[:-len(ext)] if ext else name}.{tag}{ext}" for name in names]


def is_set_member(name: str, stem: str, ext: str, *, tagged_only: bool = False) -> bool:
    """True when ``name`` is a name :func:`set_member_names` gives for ``stem``/``ext``
    (with a tag only, when ``tagged_only``)."""
    tag = _TAG if tagged_only else f"(?:{_TAG})?"
    return re.fullmatch(re.escape(stem) + r"-\d{5}-of-\d{5}" + tag + re.escape(ext), name) is not None


def publish_set(members, index, *, obsolete=None, durable: bool = True) -> None:
    """Publish staged AtomicFiles (:meth:`AtomicFile.stage`) in one directory as a set:
    every member renamed to its name, then ``index`` (the file naming them) last, then
    the files ``obsolete(directory)`` lists (names; the superseded set) removed.

    The members' names must be names no reader of the live set opens (see
    :func:`set_member_names`): until the index's rename a reader sees the old set
    whole, after it the new one.  A process killed before the index's rename leaves
    staged members (swept like any temporary) or renamed ones no index names (which
    the next publication's ``obsolete`` removes); one killed after it leaves only old
    files the next publication removes.  Publications in one directory take turns
    (an exclusive flock on the directory), so one never removes another's members.
    On an error before the index's rename, every member is removed and the live set
    stays."""
    members = list(members)
    directory = index.directory
    placed = []
    lock = _DirectoryLock(directory)
    try:
        try:
            for member in members:
                member._commit(sync_directory=False)
                placed.append(member.path)
            index._commit(sync_directory=False)
        except BaseException:
            for member in members:
                member.abort()
            index.abort()
            for path in placed:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            raise
        if durable:
            _platform.fsync_directory(directory)
        if obsolete is not None:
            for name in obsolete(directory):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass
            if durable:
                _platform.fsync_directory(directory)
            _note_swept(directory)
    finally:
        lock.release()


class _DirectoryLock:
    """An exclusive flock on a directory, waited for (none where flock is missing)."""

    def __init__(self, directory: str):
        self._fd = -1
        if fcntl is None:
            return
        try:
            self._fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            self.release()

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _lock(fd: int):
    """Take an exclusive flock on ``fd`` without waiting: True if taken, False if held
    elsewhere, None if there are no locks here (Windows, some network or FUSE
    filesystems: then no temporary file there is ever swept)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


#: directory -> its st_mtime_ns right after this process last swept it or saved into it.
#: A killed save's temporary file changed the directory after that, so an unchanged
#: mtime means there is nothing new to sweep: a save then costs one stat instead of a
#: listing of the directory (which grows with it).  A temporary file created between
#: our sweep and our own save's commit is swept at a later save there.
_SWEPT: dict = {}


def _directory_mtime(directory: str):
    try:
        return os.stat(directory).st_mtime_ns
    except OSError:
        return None


def _sweep_if_changed(directory: str) -> None:
    seen = _SWEPT.get(directory)
    if seen is None or seen != _directory_mtime(directory):
        sweep_abandoned_temps(directory)
        _note_swept(directory)


def _note_swept(directory: str) -> None:
    mtime = _directory_mtime(directory)
    if mtime is not None:
        _SWEPT[directory] = mtime


def sweep_abandoned_temps(directory: str) -> int:
    """Remove the temporaries (:data:`TEMP_NAME`: files and directories) in ``directory``
    whose writer is gone (killed saves, conversions, downloads); return how many were
    removed.  One whose lock is held (a live writer) is left.  Never raises."""
    removed = 0
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries if entry.name.startswith(".") and ".aprfast-" in entry.name]
    except OSError:
        return 0
    own = str(os.getpid())
    for name in names:
        match = _TEMP_NAME.fullmatch(name)
        # Our own process's files are never swept: where flock is emulated by POSIX
        # locks (NFS) a process does not conflict with itself, and closing any
        # descriptor of a file drops all of its locks on it.
        if match and match.group(1) != own and _remove_if_abandoned(os.path.join(directory, name)):
            removed += 1
    return removed


def _remove_if_abandoned(path: str) -> bool:
    try:
        before = os.lstat(path)
        if stat.S_ISDIR(before.st_mode):
            return _remove_directory_if_abandoned(path, before)
        if not stat.S_ISREG(before.st_mode):
            return False  # a symlink or a device is never ours
        if fcntl is None:
            os.unlink(path)  # fails while its writer has it open
            return True
        flags = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(path, os.O_RDWR | flags)  # NFS locks need write access
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | flags)
    except OSError:
        return False
    try:
        if not _same_file(os.fstat(fd), before) or not _lock(fd):
            return False  # replaced meanwhile, or a live writer holds the lock
        # Locked: no writer of ours can rename or reuse the name now.  It is the file
        # we locked unless its writer finished and the name went away before we locked.
        if not _same_file(os.lstat(path), before):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove_directory_if_abandoned(path: str, before) -> bool:
    """A temporary directory whose lock (on the directory itself) can be taken: removed
    with what it holds, under that lock.  Without flock (Windows) none is removed."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if not _same_file(os.fstat(fd), before) or not _lock(fd):
            return False
        if not _same_file(os.lstat(path), before):
            return False
        shutil.rmtree(path, ignore_errors=True)  # fd-based where the OS allows: never follows a symlink out
        return not os.path.lexists(path)
    except OSError:
        return False
    finally:
        os.close(fd)


def _same_file(a, b) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def kernel_copy(src_fd, dst_fd, offset, n) -> bool:
    """True if the kernel copied the range; False if it can't (then nothing was copied)."""
    if not _platform.uses("copy_file_range"):
        return False
    copy = os.copy_file_range
    copied = 0
    try:
        while copied < n:
            done = copy(src_fd, dst_fd, n - copied, offset + copied)
            if done == 0:
                raise AprIOError("spool file ended early")
            copied += done
        return True
    except OSError:
        if copied:  # the destination moved on; falling back would duplicate bytes
            raise
        return False


def _copy_through_memory(src_fd: int, dst_fd: int, offset: int, n: int) -> None:
    """``n`` bytes of ``src_fd`` from ``offset`` appended to ``dst_fd``, 8 MiB at a time
    (where the kernel cannot copy between the files itself)."""
    while n:
        chunk = _platform.pread(src_fd, min(n, 8 << 20), offset)
        if not chunk:
            raise AprIOError("spool file ended early")
        view = memoryview(chunk)
        while len(view):
            view = view[os.write(dst_fd, view):]
        offset += len(chunk)
        n -= len(chunk)


def reserve_blocks(fd: int, size: int) -> None:
    """Reserve the file's blocks in one go.  Measured on ext4: writing into reserved
    blocks is 2-5x faster than page-by-page allocation, but when the data is fsynced
    right after, converting the reserved extents made the flush slower and erratic, so
    durable writes skip this.  A full disk is reported before anything is written;
    filesystems without fallocate just skip it."""
    if preallocate(fd, size) == errno.ENOSPC:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
