"""Integrity checked while a whole file is read (issue 28 item 1): :class:`CheckedReader`.

An operation that reads every tensor of a file (quantize, sign, encrypt, diff, merge,
``apr tensors --stats``) checks the file's footer CRC32 over the bytes it reads anyway,
instead of a separate pass at open: each tensor's stored bytes go into a
:class:`aprfast.files.reader.RunningCrc` as the tensor is handed out (for a mapped file
the map's own view of them, which the caller is about to read; for a file read with
``pread`` the bytes just read), and :meth:`CheckedReader.finish` reads only what no
tensor covered (header, index, padding, tensors not asked for) and compares.  The caller
calls it after its last read and before it publishes anything (commits a writer, returns
a report), so a damaged file is a ChecksumError (E004) and no output appears.

Files a running CRC cannot follow keep the whole check at open, :meth:`verify`: v1
containers (their own CRC and chunk checks), sharded models (each shard against the
manifest, then its own CRC), and encrypted or signed APR2 files (every chunk's digest
and tag, which reading a tensor checks too, plus the footer CRC over the stored
ciphertext, which the decrypted values do not show).
"""

from __future__ import annotations

import logging

import numpy as np

from ..codecs.blocks import CODEC_MASK
from .reader import AprFile

__all__ = ["CheckedReader"]

log = logging.getLogger(__name__)


class CheckedReader:
    """Tensors of an open file, with the file's integrity checked as they are read.

    ``get_tensor`` reads as the file's own does and feeds the tensor's stored bytes to
    the file's running CRC; :meth:`finish` completes the check.  With ``verify=False``
    it is the file's ``get_tensor`` and ``finish`` does nothing.  For a file whose
    :meth:`aprfast.AprFile.running_crc` is None (v1, sharded, encrypted or signed;
    see the module docstring) the file's ``verify()`` runs here, at construction, as
    ``aprfast.open(..., verify=True)`` would.

    Args:
        file: What :func:`aprfast.open` returned (not closed by this object).
        verify: Check the file's integrity (False: read without checking).

    Raises:
        ChecksumError: (``verify``, a file checked whole) its CRC32 does not match.
        SignatureError: (same) a signed file's chunk does not match its digest.
        DecryptError: (same) a sealed chunk fails its tag.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.files.integrity import CheckedReader
        >>> aprfast.save_file({"a": np.ones(3, np.float32), "b": np.zeros(2, np.float32)}, "m.apr")
        >>> with aprfast.open("m.apr") as f:
        ...     reader = CheckedReader(f)
        ...     values = dict(reader.items())
        ...     reader.finish()  # ChecksumError here when a byte of m.apr is not as written
        >>> values["a"].tolist(), reader.checked
        ([1.0, 1.0, 1.0], 'while reading')
    """

    def __init__(self, file, *, verify: bool = True):
        self.file = file
        self._crc = None
        self._done = False
        #: how the file is checked: "while reading", "at open" (a whole pass) or None
        self.checked = None
        if not verify:
            return
        self._crc = file.running_crc() if isinstance(file, AprFile) else None
        if self._crc is not None:
            self.checked = "while reading"
        else:
            file.verify()
            self.checked = "at open"
            log.debug("%s: CRC32 checked at open, whole (%s)", _path(file), type(file).__name__)

    @property
    def bytes_read(self) -> int:
        """Bytes the running CRC read itself (what no tensor handed out covered); 0
        without one.  Tests and benchmarks watch it to see that no second pass happens."""
        return self._crc.bytes_read if self._crc is not None else 0

    def order(self, names=None) -> list:
        """``names`` (default: every tensor) in file order, so that a reader taking
        them in turn reads the file front to back.

        Args:
            names: Tensor names, or None for all of the file's.

        Returns:
            A list of names sorted by their stored offset (as given for a file that is
            not a v2 file).
        """
        names = list(self.file.keys() if names is None else names)
        if isinstance(self.file, AprFile):
            names.sort(key=lambda n: self.file.info(n).offset)
        return names

    def get_tensor(self, name: str, copy: bool = False, dequantize: bool = False):
        """The file's ``get_tensor(name, copy, dequantize)``, its stored bytes fed to
        the running CRC on the way.

        A mapped file's CRC runs over the map's view of the stored range (the pages
        the value is made of, or that its decoding reads); a file read otherwise gives
        the owned bytes just read.  Only a compressed or dequantized tensor of a file
        that is not mapped has its stored bytes read a second time, here.

        Args:
            name: The tensor's name.
            copy: Return an owned array.
            dequantize: Return packed tensors as float32 values.

        Returns:
            What the file's ``get_tensor`` returns.

        Raises:
            TensorNotFoundError: The file has no tensor ``name``.
            AprIOError: The file is closed, or a read failed.
        """
        value = self.file.get_tensor(name, copy=copy, dequantize=dequantize)
        crc = self._crc
        if crc is not None:
            info = self.file.info(name)
            data = self.file.stored_bytes(name)
            if data is None and not dequantize and not info.flags & CODEC_MASK:  # owned: the bytes read
                data = _stored_bytes_of(value, info.nbytes)
            crc.feed(info.offset, info.nbytes, data)
        return value

    def items(self, names=None):
        """``(name, tensor)`` for ``names`` (default: all) in file order, each read
        with :meth:`get_tensor`.  Call :meth:`finish` after the last.

        Args:
            names: Tensor names, or None for all.

        Yields:
            ``(name, tensor)`` pairs.
        """
        for name in self.order(names):
            yield name, self.get_tensor(name)

    def finish(self) -> None:
        """Complete the check: read what no tensor covered and compare the footer CRC32.
        Call it after the last read and before publishing anything; again, it does
        nothing.

        Raises:
            ChecksumError: The file's bytes do not give its stored CRC32 (E004).
        """
        if self._crc is not None and not self._done:
            self._done = True
            self._crc.finish()
            log.debug("%s: CRC32 checked while reading (%d bytes read for it besides the tensors)",
                      _path(self.file), self._crc.bytes_read)


def _path(file) -> str:
    return str(getattr(file, "path", None) or "<buffer>")


def _stored_bytes_of(value, nbytes: int):
    """The bytes of an owned value read from a file (an array, or the buffer of a
    quantized or raw tensor) when they are exactly its stored ``nbytes``, else None."""
    data = getattr(value, "data", value) if not isinstance(value, np.ndarray) else value
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous or data.nbytes != nbytes:
        return None
    return data.reshape(-1).view(np.uint8)
