/* The io_uring engine of direct reads (pio.c apr_pread_direct_engine).
 *
 * One calling thread keeps depth aligned reads of at most chunk bytes in flight on a
 * ring of its own (raw io_uring_setup / io_uring_enter system calls and the rings'
 * maps, no liburing), each straight into the destination, and takes the running CRC
 * over the completed chunks in file order while the later ones are still being read.
 * Compiled only on Linux with <linux/io_uring.h> and the system call numbers in the C
 * library's headers; elsewhere every call answers APR_URING_UNAVAILABLE. */
#ifndef APRFAST_URING_H
#define APRFAST_URING_H

#include <stddef.h>
#include <stdint.h>

#include "buffers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* io_uring_setup failed (ENOSYS: no io_uring, or not compiled in; EPERM: a seccomp
 * filter, a container's profile or kernel.io_uring_disabled; ENOMEM, EMFILE), or the
 * "io_uring" fallback is forced (APR_FALLBACK_URING): the caller reads another way. */
#define APR_URING_UNAVAILABLE (-2)
/* Reads in flight, and the most bytes one read asks for (a power of two >= align).
 * On the development VM depths of 8-32 and reads of 4-16 MiB read a cold 504 MiB
 * alike (within 3%); 32 reads of 1 MiB took 6% longer. */
#define APR_URING_DEPTH 16u
#define APR_URING_CHUNK ((size_t)4 << 20)

/* Read exactly len bytes at offset of fd (opened with O_DIRECT) into dst, where
 * dst - offset is a multiple of align (the caller checks; else EINVAL) and the range
 * holds at least one whole aligned block.  The aligned blocks go straight into dst,
 * one read per chunk-aligned piece of the file, short reads resubmitted for the rest;
 * a partial block at either end is read whole into a small aligned bounce buffer and
 * copied.  crc (zlib.crc32 semantics) is updated over the bytes in file order, only on
 * success.  pages, when not NULL, is a claimed fresh block (buffers.h) populated just
 * ahead of each read; where every piece is staged (apr_uring_stages_every_piece) its
 * slow_ns is set to 0, the plain huge-page mark.  depth 0 / chunk 0: the defaults above.
 * Returns 0, an errno value of the first failed read (every read in flight is waited
 * for before returning: none writes into dst afterwards), -1 if the file ended first,
 * or APR_URING_UNAVAILABLE. */
int apr_uring_read(int fd, uint8_t *dst, uint64_t offset, size_t len, uint32_t *crc, size_t align,
                   unsigned depth, size_t chunk, apr_fresh_state *pages);

/* 1 when a ring can be set up here now (the fallback not forced), else 0. */
int apr_uring_available(void);

/* Staging of direct reads through huge-page buffers (uring.c says why): AUTO stages
 * every whole-block piece through a small ring of them on a disk whose host copies
 * each read into guest memory (virtio-blk), elsewhere the pieces whose destination is
 * known to have 4 KiB pages; ALWAYS every whole-block piece through the large set
 * (tests), RING every one through the small ring wherever the file is, NEVER none.
 * Returns the mode before; an unknown mode changes nothing. */
#define APR_STAGE_AUTO 0
#define APR_STAGE_ALWAYS 1
#define APR_STAGE_NEVER 2
#define APR_STAGE_RING 3
int apr_uring_set_staging(int mode);
/* 1 when apr_uring_read stages every whole-block piece of fd through the small ring
 * (the mode, and for AUTO the disk under fd): the destination's page size then does
 * not change how the disk is read. */
int apr_uring_stages_every_piece(int fd);
/* The pieces the calling thread's last apr_uring_read read through staging buffers. */
size_t apr_uring_staged_last(void);

/* Direct writes on a ring (DirectWriter, aprfast/io/direct.py).
 *
 * One calling thread copies the bytes handed to apr_uring_writer_write into depth
 * aligned buffers of chunk bytes, taking their CRC on the way, and keeps every full
 * buffer's write in flight on a ring of its own while it fills the next; it waits only
 * for the buffer it is about to refill.  Why: the thread-pool writer this replaced paid
 * a Python call, a future and two thread wake-ups per 2 MiB, and held the GIL between
 * them; fio, the limit the benchmark holds saves to, submits from one thread on a ring.
 * The buffers are the staging buffers of direct reads where they are free (kept for
 * the process; the writer populates only the part it fills, once), else a map of the
 * writer's own. */
typedef struct apr_uring_writer apr_uring_writer;

/* Two writes of 8 MiB in flight (all 16 MiB of staging buffers).  Why: a write that
 * makes the file longer goes one at a time on ext4 (the inode's lock, and the write is
 * waited for), so two 4 MiB writes kept the disk at one request; the disk's
 * max_sectors_kb (4 MiB) splits an 8 MiB write into two requests in flight together.
 * In the benchmark's loop on the development VM (docs/performance.md, stop 39), per
 * round against fio: 0.95-0.98 at 4 GiB against 0.86-0.87 for two of 4 MiB. */
#define APR_URING_WRITE_DEPTH 2u
#define APR_URING_WRITE_CHUNK ((size_t)8 << 20)

/* A writer of fd (opened with O_DIRECT) whose first byte goes to offset (a multiple of
 * the caller's alignment).  chunk (a power of two, a multiple of 4096) and depth 0:
 * the defaults above.  helper: 1 a second thread fills half of each buffer, 0 none, -1
 * one where a second processor is idle now.  NULL with *err set:
 * APR_URING_UNAVAILABLE, EINVAL or ENOMEM. */
apr_uring_writer *apr_uring_writer_open(int fd, uint64_t offset, size_t chunk, unsigned depth, int helper, int *err);

/* Append len bytes of src (CRC taken into *crc when crc is not NULL, zlib.crc32
 * semantics); every buffer filled is written.  Returns 0 or the errno value of the
 * first write that failed (this call's or an earlier one's; from then on every call
 * answers it). */
int apr_uring_writer_write(apr_uring_writer *w, const uint8_t *src, size_t len, uint32_t *crc);

/* Write the whole align-byte blocks of the buffer being filled and wait for every
 * write.  *tail and *tail_len: the bytes after them (fewer than align, for the caller
 * to write another way, at *tail_offset); valid until apr_uring_writer_close.
 * Returns 0 or an errno value, as apr_uring_writer_write.  Nothing may be written
 * after it. */
int apr_uring_writer_flush(apr_uring_writer *w, size_t align, const uint8_t **tail, size_t *tail_len,
                           uint64_t *tail_offset);

/* Wait for every write in flight (none touches the buffers afterwards) and free the
 * writer; NULL is allowed. */
void apr_uring_writer_close(apr_uring_writer *w);

/* Bytes the writer has handed to the kernel and seen written. */
uint64_t apr_uring_writer_written(const apr_uring_writer *w);

#ifdef __cplusplus
}
#endif
#endif
