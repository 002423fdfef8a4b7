"""``.apr`` files (any variant ``aprfast.open`` reads) as a tensor stream, and the
``.apr`` side of a conversion through ``aprfast.Writer``."""

from __future__ import annotations

import os

from .. import dtypes as _dtypes
from ..api import open as _open
from ..errors import LayoutError
from ..files.reader import AprFile
from ..files.writer import Writer
from ..layouts.aprender import COUNT_KEYS, tensor_counts
from ..tensors import RawTensor
from ._common import MAP_MIN, Spec, value_of

__all__ = ["AprSource", "apr_writer"]


class AprSource:
    """Tensors in file order (offset), each a view of the map or one decoded tensor.

    With ``verify`` (the default) the file's integrity is checked as it is read (issue
    28 item 1): a v2 file's footer CRC32 runs over the bytes the converter reads, in
    file order, with no second pass (:class:`aprfast.files.reader.RunningCrc`); other
    variants (v1, sharded, encrypted or signed) are checked whole by ``verify()``.
    :meth:`check` compares, and the converter calls it before it publishes the output,
    so a damaged source is a ChecksumError (E004) and nothing is written."""

    def __init__(self, path, *, verify: bool = True):
        self.path = os.fspath(path)
        # Tensors of dtype ids aprfast does not know are carried as their bytes (issue 27
        # item 4): converting asks for no values.
        self._file = _open(self.path, unknown_dtypes="raw")
        self._crc = None
        self._verify_whole = False
        try:
            if verify:
                self._crc = self._file.running_crc() if isinstance(self._file, AprFile) else None
                self._verify_whole = self._crc is None
            infos = sorted((self._file.info(n) for n in self._file.keys()), key=lambda i: i.offset)
            metadata = dict(self._file.metadata or {})
            names = metadata.pop(_dtypes.OPAQUE_NAMES_KEY, None)
            names = names if isinstance(names, dict) else {}
            self.specs = [self._spec(i, names) for i in infos]
            #: "aprender", "apr2" (v2 files), else None
            self.layout = getattr(self._file, "layout", None) if isinstance(self._file, AprFile) else None
            # counts a converter filled describe that file's tensors, not the model: the
            # writer of the next file fills its own (a safetensors export gets none)
            if all(metadata.get(k) == v for k, v in counts_of(self.specs).items()):
                for key in COUNT_KEYS:
                    metadata.pop(key, None)
            self.metadata = metadata
        except BaseException:
            self._file.close()
            raise

    @staticmethod
    def _spec(info, names) -> Spec:
        """The tensor's Spec; an unknown id becomes an opaque dtype (the name the file
        recorded for OPAQUE_APR2_ID, else ``unknown(<id>)``) with the stored size."""
        if info.dtype is not None:
            return Spec(info.name, info.dtype, tuple(info.shape))
        name = names.get(info.name)
        if info.dtype_id == _dtypes.OPAQUE_APR2_ID and isinstance(name, str):
            dtype = _dtypes.opaque_dtype(name)
        else:
            dtype = _dtypes.unknown_id_dtype(info.dtype_id)
        return Spec(info.name, dtype, tuple(info.shape), info.nbytes)

    def read(self, spec: Spec, scratch=None):
        """A view of the file's map (nothing to copy).  With ``scratch`` (the streaming
        converter), a big plainly stored tensor is mapped on its own instead, page tables
        filled at once (``_common.map_range``) and released at the scratch's next use, so
        the resident set holds the tensor being converted, not every page read so far."""
        if scratch is not None and spec.nbytes >= MAP_MIN:
            where = self._plain_range(spec)
            if where is not None:
                raw = scratch.map(where[0], where[1], spec.nbytes)
                if raw is not None:
                    self._checked(spec, raw)  # the CRC runs over the bytes just mapped
                    return value_of(spec.dtype, spec.shape, raw)
        # the value is (or is decoded from) the map's view of the stored bytes: the CRC
        # runs over that view, the pages the converter reads next (a file not mapped: read here)
        self._checked(spec, self._file.stored_bytes(spec.name) if self._crc is not None else None)
        value = self._file.get_tensor(spec.name)
        if spec.dtype.opaque:
            return RawTensor(spec.dtype, spec.shape, value.data)
        return value

    def raw_range(self, spec: Spec):
        """(fd, offset) of a tensor stored plainly in a v2 file, else None (compressed,
        v1 containers, in-memory sources): those go through ``read``.  The caller
        copies the range without looking at it, so its CRC is taken here."""
        where = self._plain_range(spec)
        if where is not None:
            self._checked(spec)
        return where

    def _checked(self, spec: Spec, data=None) -> None:
        if self._crc is not None:
            info = self._file.info(spec.name)
            self._crc.feed(info.offset, info.nbytes, data)

    def check(self) -> None:
        """The integrity check of everything read (and what was not): the footer CRC
        (and, for encrypted or signed files, every chunk and the signature).  Called
        by the converter before it publishes; a no-op with ``verify=False``.

        Raises:
            ChecksumError: The file's bytes do not give its stored CRC32 (E004).
            SignatureError: A signed file's signature or a chunk digest fails.
        """
        if self._crc is not None:
            self._crc.finish()
        elif self._verify_whole:
            self._file.verify()

    def _plain_range(self, spec: Spec):
        file = self._file
        fileno = getattr(getattr(file, "_source", None), "fileno", None)
        if not isinstance(file, AprFile) or fileno is None or file._file.codec(spec.name):
            return None
        return fileno(), file.info(spec.name).offset

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)

    def close(self) -> None:
        self._file.close()


def counts_of(specs) -> dict:
    """aprender's ``param_count`` and ``total_size`` of the tensors ``specs`` declare."""
    return tensor_counts((_dtypes.element_count(s.shape), s.nbytes) for s in specs)


def apr_writer(path, specs, metadata, *, compression=None, durable=True):
    """A planned Writer (header and index first, nothing spooled) or, with
    ``compression``, a spooled one: stored sizes of compressed tensors are known only
    after compressing, so the index cannot come first.  The spooled writer keeps the
    uncompressed tensors in a nameless spool file and the compressed ones in memory
    until close, so that path is not bounded by the largest tensor."""
    if compression is None and not any(s.dtype.opaque for s in specs):
        # the aprender layout's count fields say what was written (issue 28 item 4: they read 0)
        metadata = dict(metadata or {}, **counts_of(specs))
        return Writer(path, metadata, plan=[(s.name, s.dtype, s.shape) for s in specs], durable=durable)
    if compression is None:  # an opaque dtype has no size rule a plan could declare: spooled
        return Writer(path, metadata, durable=durable)
    if compression not in ("lz4", "zstd"):
        raise LayoutError(f"compression={compression!r}: .apr files compress with 'lz4' or 'zstd'")
    return Writer(path, metadata, compression=compression, durable=durable)
