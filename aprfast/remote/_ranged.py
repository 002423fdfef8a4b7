"""What every remote source shares: a file read by byte ranges, with the first bytes
cached, reads split over a few connections, nearby ranges merged, and every range
checked against the object's length before anything is allocated.

A subclass provides :meth:`RangedSource._fetch_into` (one ranged request filling a
buffer, retried by :meth:`_fetch_retrying`) and opens the object in its constructor,
learning its length and version (ETag / Last-Modified) from the first response.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .._crc import crc32, crc32_combine
from ..errors import AprError, AprIOError
from ..io.sources import Source

__all__ = ["RangedSource", "RemoteChangedError", "RemoteTimeoutError", "TransientError", "HEAD_BYTES", "TAIL_BYTES",
           "MERGE_GAP", "PART_BYTES"]

#: The first request fetches this many bytes from the start of the object: header,
#: metadata and index of a model of a few hundred tensors (about 100 bytes of index per
#: tensor), so opening and ``inspect`` cost one request.  Larger prefixes cost one more.
HEAD_BYTES = 64 << 10
#: ...and this many from its end (the footers: 4 bytes for aprender's layout, 16 for APR2).
TAIL_BYTES = 64
#: Ranges closer than this are fetched as one (the gap is read and dropped): a request
#: costs about as much as this many bytes on a fast link.
MERGE_GAP = 256 << 10
#: A read is split into parts of at least this size, fetched on parallel connections.
PART_BYTES = 8 << 20
#: A read() (header, metadata, index) starting at most this far past the cached first
#: bytes extends that cache, so the prefix of a model costs at most one more request.
EXTEND_GAP = 1 << 20


class RemoteChangedError(AprIOError):
    """E007: the remote object changed between two requests (its ETag or Last-Modified
    differs); its bytes are never mixed from two versions.  Open it again."""


class RemoteTimeoutError(AprIOError, TimeoutError):
    """E007: a server took longer than a request or a call may take (the ``timeout``,
    ``min_rate`` and ``deadline`` of ``storage_options``: see
    :class:`aprfast.remote.http.Budget`).  Not retried: a server that slow is slow again.
    Also a ``TimeoutError``."""


class TransientError(Exception):
    """A failure worth retrying (connection dropped, 5xx, short body); internal."""


class RangedSource(Source):
    """A remote object read by ranged requests.  ``connections`` bounds parallel requests."""

    retries = 4
    backoff = 0.05  # seconds, doubled after every failed attempt

    def __init__(self, size: int, head: bytes | memoryview, *, path, connections: int = 8):
        self.path = path
        self.connections = max(1, int(connections))
        self._head = memoryview(head).toreadonly()
        self._tail = memoryview(b"")
        self._tail_start = size
        self._cache_lock = threading.Lock()
        self.worker_pool = None
        self._pool_lock = threading.Lock()
        super().__init__(size)

    # --- served from the cached first and last bytes, or fetched -----------------------
    def _cached(self, offset: int, n: int):
        head, tail = self._head, self._tail
        if offset + n <= len(head):
            return head[offset:offset + n]
        if offset >= self._tail_start:
            return tail[offset - self._tail_start:offset - self._tail_start + n]
        return None

    def cheap(self, offset: int, n: int) -> bool:
        """True when ``n`` bytes at ``offset`` are already here (no request): the
        layouts read the footer at open only then, else when its CRC is first needed
        (layouts._common.footer), so opening never waits for a request for it."""
        return self._cached(offset, n) is not None

    def _set_tail(self, tail_start: int, tail) -> None:
        self._tail, self._tail_start = memoryview(tail).toreadonly(), tail_start

    def _read(self, offset, n):
        hit = self._cached(offset, n)
        if hit is not None:
            return hit
        if offset + n == self.size and n <= TAIL_BYTES and self.size - TAIL_BYTES >= len(self._head):
            # the footer (read when a CRC is checked): fetch the last TAIL_BYTES, kept
            with self._cache_lock:
                if self._cached(offset, n) is None:
                    start = self.size - TAIL_BYTES
                    tail = bytearray(TAIL_BYTES)
                    self._fetch_retrying(start, memoryview(tail))
                    self._set_tail(start, tail)
            return self._cached(offset, n)
        head_end = len(self._head)
        if head_end <= offset + n and offset - head_end <= EXTEND_GAP and offset + n - head_end <= PART_BYTES * 8:
            # The prefix (metadata, index) is read in order: grow the first bytes to cover
            # this read, so what follows it in the prefix is already here too.
            with self._cache_lock:
                head_end = len(self._head)
                if offset + n > head_end:
                    more = bytearray(offset + n - head_end)
                    self._fetch_parallel(head_end, memoryview(more))
                    self._head = memoryview(bytes(self._head) + more).toreadonly()
            return self._head[offset:offset + n]
        out = bytearray(n)
        self._fill(offset, memoryview(out))
        return out

    def _readinto(self, offset, out, threads, crc):
        hit = self._cached(offset, out.nbytes)
        if hit is not None:
            out[:] = hit
            return None if crc is None else crc32(out, crc)
        return self._fill(offset, out, crc)

    def _fill(self, offset: int, out: memoryview, crc=None):
        """:meth:`_fetch_parallel`, with the part of the range already cached (the first
        bytes, the last ones) copied instead of fetched again: a data section starting
        inside the first 64 KiB, or a whole-object read, asks only for the rest."""
        n = out.nbytes
        head, tail, tail_start = self._head, self._tail, self._tail_start
        k = min(len(head) - offset, n) if offset < len(head) else 0
        if k > 0:
            out[:k] = head[offset:offset + k]
            if crc is not None:
                crc = crc32(out[:k], crc)
        end = n
        if len(tail) and offset + k < tail_start < offset + n <= tail_start + len(tail):
            end = tail_start - offset  # the suffix from the cached last bytes, after the fetch
        if end > k:
            crc = self._fetch_parallel(offset + k, out[k:end], crc)
        if end < n:
            out[end:] = tail[:n - end]
            if crc is not None:
                crc = crc32(out[end:], crc)
        return crc

    def readinto_many(self, pieces) -> None:
        """Fill each ``(offset, writable buffer)`` of ``pieces``, merging ranges closer
        than :data:`MERGE_GAP` into one request and running requests in parallel."""
        items = []
        for offset, out in pieces:
            out = memoryview(out)
            if out.format != "B" or out.ndim != 1:
                out = out.cast("B")
            self.check_range(offset, out.nbytes)
            if out.nbytes:
                items.append((offset, out))
        if not items:
            return
        items.sort(key=lambda item: item[0])
        groups, current = [], [items[0]]
        end = items[0][0] + items[0][1].nbytes
        for offset, out in items[1:]:
            # merged while the gap is small and the request stays at most one part long
            # (its buffer is temporary; separate groups also run in parallel)
            if offset - end <= MERGE_GAP and max(end, offset + out.nbytes) - current[0][0] <= PART_BYTES:
                current.append((offset, out))
                end = max(end, offset + out.nbytes)
            else:
                groups.append((current, end))
                current, end = [(offset, out)], offset + out.nbytes
        groups.append((current, end))
        self._enter()
        try:
            self._map(lambda group: self._fill_group(*group), groups)
        finally:
            self._leave()

    def _fill_group(self, members, end) -> None:
        start = members[0][0]
        if len(members) == 1 and members[0][1].nbytes == end - start:
            self._fetch_retrying(start, members[0][1])
            return
        span = bytearray(end - start)
        self._fetch_retrying(start, memoryview(span))
        for offset, out in members:
            out[:] = span[offset - start:offset - start + out.nbytes]

    # --- parallel parts -----------------------------------------------------------------
    def _fetch_parallel(self, offset: int, out: memoryview, crc=None):
        """Fill ``out`` from ``offset`` with up to ``connections`` parallel requests; the
        CRC of the bytes is computed part by part as each arrives and combined in order."""
        n = out.nbytes
        parts = max(1, min(self.connections, n // PART_BYTES))
        if parts == 1:
            self._fetch_retrying(offset, out)
            return None if crc is None else crc32(out, crc)
        step = -(-n // parts)
        bounds = [(a, min(n, a + step)) for a in range(0, n, step)]

        def one(bound):
            a, b = bound
            self._fetch_retrying(offset + a, out[a:b])
            return crc32(out[a:b]) if crc is not None else None

        crcs = self._map(one, bounds)
        if crc is None:
            return None
        for (a, b), part in zip(bounds, crcs):
            crc = crc32_combine(crc, part, b - a)
        return crc

    def _map(self, fn, items) -> list:
        if len(items) == 1:
            return [fn(items[0])]
        with self._pool_lock:
            if self.worker_pool is None:
                self.worker_pool = ThreadPoolExecutor(self.connections, thread_name_prefix="aprfast-remote")
            pool = self.worker_pool
        futures = [pool.submit(fn, item) for item in items]
        results, error = [], None
        for future in futures:  # wait for every request before raising: none writes into freed memory
            try:
                results.append(future.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error
        return results

    # --- one request, retried -----------------------------------------------------------
    def _fetch_retrying(self, offset: int, out: memoryview) -> None:
        """Fill ``out`` from ``offset``, retrying transient failures with backoff; a
        body cut short resumes where it stopped."""
        if not out.nbytes:
            return  # nothing to ask for (an empty tensor): a request for no bytes is malformed
        done, attempt = 0, 0
        while True:
            try:
                done += self._fetch_into(offset + done, out[done:])
                if done == out.nbytes:
                    return
                raise TransientError(f"the body ended after {done} of {out.nbytes} bytes")
            except TransientError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise AprIOError(f"reading {out.nbytes} bytes at offset {offset} failed after "
                                     f"{attempt} attempts: {exc}", path=self.path) from None
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            except AprError:
                raise

    def _fetch_into(self, offset: int, out: memoryview) -> int:  # pragma: no cover - abstract
        """One request for ``out.nbytes`` bytes at ``offset``; returns how many arrived
        (raising TransientError for a retryable failure after counting them)."""
        raise NotImplementedError

    def _free(self) -> None:
        pool, self.worker_pool = self.worker_pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        self._head = self._tail = memoryview(b"")
