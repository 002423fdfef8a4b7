"""Reading and writing key files, shared by every kind of key (Ed25519/X25519 in
:mod:`~aprfast.crypto.core`, ECDSA in :mod:`~aprfast.crypto.ecdsa`): bounded reads, and
atomic writes that make a private key unreadable by others before its first byte lands.
It imports no cryptographic library, so ECDSA keys never load libsodium."""

from __future__ import annotations

import os

from ..errors import AprIOError, FormatError, os_error

#: a key file is tiny (a PEM key is a few hundred bytes); anything bigger is the wrong file
MAX_KEY_FILE_SIZE = 64 * 1024


def read_key_file(path) -> bytes:
    """The bytes of a key file, refused past :data:`MAX_KEY_FILE_SIZE`.

    Args:
        path: the key file.

    Returns:
        Its bytes.

    Raises:
        AprIOError: the file cannot be read (AprFileNotFoundError when it is missing).
        FormatError: the file is larger than a key file can be.

    Examples:
        >>> from aprfast.crypto.keyfiles import read_key_file, write_key_file
        >>> write_key_file("k.pub", b"key bytes", private=False)
        >>> read_key_file("k.pub")
        b'key bytes'
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KEY_FILE_SIZE + 1)
    except OSError as error:
        raise os_error(error, f"cannot read the key file: {error.strerror or error}", path=path) from error
    if len(data) > MAX_KEY_FILE_SIZE:
        raise FormatError(f"a key file is at most {MAX_KEY_FILE_SIZE} bytes; this is larger", path=path)
    return data


def write_key_file(path, data: bytes, *, private: bool) -> None:
    """Write a key file atomically (temporary name, fsync, rename); a private one is
    mode 0600 before its first secret byte is written.

    Args:
        path: the key file.
        data: its bytes.
        private: True for a private key.

    Raises:
        AprIOError: the file cannot be written.

    Examples:
        >>> import os, stat
        >>> write_key_file("secret.key", b"0" * 32, private=True)
        >>> oct(stat.S_IMODE(os.stat("secret.key").st_mode))
        '0o600'
    """
    from ..io.atomic import AtomicFile  # the same temp-file, fsync, rename as model files

    target = AtomicFile(path, mode=0o600 if private else 0o666)  # a private key is never readable by others
    try:
        if private and hasattr(os, "fchmod"):
            os.fchmod(target.fd, 0o600)  # before the first secret byte is written
        view = memoryview(data)
        while view:
            view = view[os.write(target.fd, view):]
    except OSError as error:
        target.abort()
        raise AprIOError(f"cannot write the key file: {error.strerror or error}", path=path) from error
    except BaseException:
        target.abort()
        raise
    target.commit()
