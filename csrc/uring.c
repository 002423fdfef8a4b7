#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "uring.h"
#include "crc32.h"
#include "fallbacks.h"

#include <errno.h>
#include <string.h>

/* Only where the kernel's header and the C library's system call numbers are there:
 * no liburing, nothing to link, and no code at all on other platforms. */
#if defined(__linux__) && defined(__has_include)
#if __has_include(<linux/io_uring.h>) && __has_include(<sys/syscall.h>)
#include <sys/syscall.h>
#if defined(__NR_io_uring_setup) && defined(__NR_io_uring_enter)
#define APR_HAVE_URING 1
#endif
#endif
#endif

#ifdef APR_HAVE_URING
#include <linux/io_uring.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "parallel.h"

/* Populated this much at a time in a fresh destination, as pio.c does. */
#define FRESH_STEP ((size_t)2 << 20)
/* A fresh destination of at least this many steps is populated by the calling thread
 * and one helper thread together (below). */
#define SHARE_MIN_STEPS 16

/* Populating a fresh destination, shared by the calling thread and one helper thread.
 * Why: populating fresh memory is the costliest part of a cold direct read on a VM
 * whose host backs guest memory only as it is touched (2.2 s for 4 GiB on the
 * development VM, with huge pages or without, against 1.2-2 s for the device to read
 * it), and the calling thread alone both populated and kept the ring fed: a cold
 * 4 GiB load took 1.6x fio's read.  The helper populates the steps in order; the
 * calling thread takes the next step nobody has taken whenever it would otherwise
 * wait (for a completion, or for the step its next read needs), so both cores
 * populate while the reads are in flight.  Steps are claimed with one atomic counter
 * and marked done one by one; populating a page a read has already faulted in (or the
 * reverse) is harmless, so a read never waits on anything but its own steps.  The
 * helper alone times its steps and chooses the page size (buffers.c); the calling
 * thread's steps take its choice (apr_fresh_state.leader).  Why: the calling thread
 * populates between reaping completions and is the one preempted, and its own choice
 * advised the rest of the block: one slow step of its own moved the helper's steps to
 * 4 KiB pages too. */
typedef struct {
    apr_fresh_state st; /* the helper's own copy of the page-size choice */
    uint8_t *base;      /* step k is [base + k * FRESH_STEP, + FRESH_STEP), kept inside the block */
    size_t steps;
    size_t claim;       /* atomic: the next step nobody has taken */
    uint8_t *done;      /* atomic per step: populated */
    size_t frontier;    /* the calling thread's: every step below it is done */
    unsigned stage_units; /* units of the staging buffers the read may use (stage_take_next) */
    int stage_first;    /* populate those units before any step (every piece is staged) */
    pthread_t thread;
    int running;
    int stop;           /* atomic: the read is over, populate nothing more */
    /* ns per KiB of the last huge step of the calling thread, and (atomic) of the
     * helper: 0 for none yet */
    long long caller_cost, helper_cost;
} sharer;

/* done[k]: 0 not yet, STEP_HUGE or STEP_SMALL: populated, with that page size. */
#define STEP_HUGE 1
#define STEP_SMALL 2

static long long share_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void share_step(apr_fresh_state *st, sharer *sh, size_t k)
{
    st->last_huge = 1; /* a step populating nothing (unsupported) counts as huge: no staging */
    /* the helper's own state times its steps (apr_fresh_record's cost[1]); the calling
     * thread's follows it untimed, so its steps are timed here */
    long long t0 = st == &sh->st ? 0 : share_clock();
    apr_fresh_populate(st, sh->base + k * FRESH_STEP, FRESH_STEP);
    if (st->last_huge) {
        if (t0)
            sh->caller_cost = ((share_clock() - t0) << 10) / (long long)FRESH_STEP + 1;
        else
            __atomic_store_n(&sh->helper_cost, st->cost[1], __ATOMIC_RELAXED);
    }
    __atomic_store_n(&sh->done[k], st->last_huge ? STEP_HUGE : STEP_SMALL, __ATOMIC_RELEASE);
}

/* Whether the calling thread, with reads in flight, may take a step while the helper's
 * choice is huge pages: not while its own last huge step cost more than twice the
 * helper's.  Why: in memory the host took back the calling thread's huge steps took
 * ~4.5 ms where the helper's took 0.2-0.3 ms (why one thread and not the other is not
 * known), and with the ring unattended meanwhile the first completions of a fresh
 * 504 MiB load were reaped 10-15 ms late; but where both are slow, the helper alone
 * populated a fresh 504 MiB load in 0.46 s. */
static int share_caller_huge(const sharer *sh)
{
    long long helper = __atomic_load_n(&sh->helper_cost, __ATOMIC_RELAXED);
    return sh->caller_cost == 0 || helper == 0 || sh->caller_cost <= 2 * helper;
}

/* Whether a step of [p, p + len) (all populated: share_ready said so) has 4 KiB pages. */
static int share_small(const sharer *sh, const uint8_t *p, size_t len)
{
    size_t k = (size_t)(p - sh->base) / FRESH_STEP, last = (size_t)(p + len - 1 - sh->base) / FRESH_STEP;
    for (; k <= last && k < sh->steps; k++)
        if (__atomic_load_n(&sh->done[k], __ATOMIC_ACQUIRE) == STEP_SMALL)
            return 1;
    return 0;
}

/* Take and populate the next step nobody has taken: 1, or 0 when none is left. */
static int share_take(sharer *sh, apr_fresh_state *st)
{
    if (__atomic_load_n(&sh->claim, __ATOMIC_RELAXED) >= sh->steps)
        return 0;
    size_t k = __atomic_fetch_add(&sh->claim, 1, __ATOMIC_ACQ_REL);
    if (k >= sh->steps)
        return 0;
    share_step(st, sh, k);
    return 1;
}

static int stage_take_next(unsigned units);

static void *share_main(void *arg)
{
    sharer *sh = arg;
    /* the small ring's few units first: every piece waits for one (apr_uring_read) */
    while (sh->stage_first && !__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) && stage_take_next(sh->stage_units))
        ;
    for (;;) {
        if (!share_take(sh, &sh->st))
            break;
        /* a staging buffer's unit after each step, once the steps get 4 KiB pages (their
         * reads are staged).  Why not all of them first: in memory the host took back
         * each unit costs 3-5 ms, and while the helper populated 64 MiB of them the
         * calling thread went on populating the first steps in huge pages, as slow,
         * nobody timing them: the first 100 ms read half as much */
        if (!__atomic_load_n(&sh->st.huge, __ATOMIC_RELAXED))
            stage_take_next(sh->stage_units);
    }
    /* the rest of them, if the steps got 4 KiB pages: the calling thread populates none
     * while reads are in flight (apr_uring_read) */
    while (sh->st.small_lo && !__atomic_load_n(&sh->stop, __ATOMIC_RELAXED) && stage_take_next(sh->stage_units))
        ;
    return NULL;
}

/* Whether every step up to the one holding byte end - 1 is populated, populating
 * what nobody has taken yet below it on the calling thread (st).  may_leave: return 0
 * rather than wait for a step the helper is still populating.  Why only below it:
 * taking the next steps past it while the helper finished one the read needs held the
 * read back (on the development VM the helper's first step took ~7 ms, and the
 * calling thread populated nine more steps meanwhile, the disk idle); steps past it
 * are populated while reads are in flight instead (apr_uring_read's loop).
 * take_huge: whether it may take a step while the helper's choice is huge pages
 * (share_caller_huge). */
static int share_ready(sharer *sh, apr_fresh_state *st, uint8_t *end, int may_leave, int take_huge)
{
    size_t upto = (size_t)(end - sh->base + FRESH_STEP - 1) / FRESH_STEP;
    if (upto > sh->steps)
        upto = sh->steps;
    while (sh->frontier < upto) {
        if (__atomic_load_n(&sh->done[sh->frontier], __ATOMIC_ACQUIRE)) {
            sh->frontier++;
            continue;
        }
        if (__atomic_load_n(&sh->claim, __ATOMIC_RELAXED) < upto
            && (take_huge || !__atomic_load_n(&sh->st.huge, __ATOMIC_RELAXED)) && share_take(sh, st))
            continue;
        if (may_leave)
            return 0;
        sched_yield(); /* the helper is in the middle of this step: about a millisecond */
    }
    return 1;
}

/* Whether a helper is worth starting over [dst, dst + len): not for a small one, nor
 * on one processor. */
static int share_worth(const uint8_t *dst, size_t len)
{
    const uint8_t *base = (const uint8_t *)((uintptr_t)dst & ~(uintptr_t)(FRESH_STEP - 1));
    return (size_t)(dst + len - base + FRESH_STEP - 1) / FRESH_STEP >= SHARE_MIN_STEPS
           && apr_parallel_cpu_count(2) >= 2;
}

/* Start the helper over [dst, dst + len) of a claimed fresh block; stage_units: the
 * units of the staging buffers (held by the caller) it may populate, 0 for none, and
 * stage_first: populate them before any step.  0 where it is not worth it or cannot
 * start (the caller populates alone). */
static int share_start(sharer *sh, apr_fresh_state *pages, uint8_t *dst, size_t len, unsigned stage_units,
                       int stage_first)
{
    memset(sh, 0, sizeof *sh);
    sh->base = (uint8_t *)((uintptr_t)dst & ~(uintptr_t)(FRESH_STEP - 1));
    sh->steps = (size_t)(dst + len - sh->base + FRESH_STEP - 1) / FRESH_STEP;
    sh->stage_units = stage_units;
    sh->stage_first = stage_first;
    if (!share_worth(dst, len))
        return 0;
    sh->done = calloc(sh->steps, 1);
    if (sh->done == NULL)
        return 0;
    sh->st = *pages;
    if (pthread_create(&sh->thread, NULL, share_main, sh) != 0) {
        free(sh->done);
        sh->done = NULL;
        return 0;
    }
    sh->running = 1;
    return 1;
}

static void share_stop(sharer *sh)
{
    if (!sh->running)
        return;
    __atomic_store_n(&sh->claim, sh->steps, __ATOMIC_RELEASE); /* takes nothing more */
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
    pthread_join(sh->thread, NULL);
    free(sh->done);
    sh->running = 0;
}

/* Staging: reads whose destination has 4 KiB pages go through huge-page buffers.
 *
 * Why: the block layer builds a direct read's requests from the destination's own
 * pages, at most max_segments of them per request.  Into 4 KiB pages that is under
 * 1 MiB on the development VM's virtio disk (254 segments), against max_sectors_kb
 * (4 MiB) into huge pages, and its host serves requests one at a time: a cold 504 MiB
 * read took 340 ms into 4 KiB pages, 143 ms into huge pages, 165 ms staged into 4 KiB
 * pages, 168 ms buffered (benchmarks/bench_direct_pages.py).  buffers.c falls back to 4 KiB pages where huge
 * ones populate slowly (memory the host took back), and a block keeps its pages in the
 * buffer cache.  So a piece whose destination has 4 KiB pages (a fresh step populated
 * with them, or a live block recorded by apr_fresh_finish) is read into one of a few
 * huge-page buffers kept for the process (STAGE_BYTES, populated once) and copied into
 * place on completion: a memcpy per byte, on the thread that otherwise waits.  Memory
 * of unknown pages (a caller's own buffer) is read straight into, as before.
 *
 * At most half the buffers are read into at a time, and a completed one is copied only
 * after the spare half has been handed to the next reads.  Why: the development VM's
 * disk completes the requests it holds together, in bursts, and with every buffer read
 * into, each was copied before any was read into again: the disk idled for the copies
 * of a whole burst (0.2 ms per 4 MiB; bursts of four completions 5 ms apart, from
 * timestamps in this loop).  A cold 4 GiB read with every piece staged (memory just
 * freed) took 1.44-1.51 s before, 1.35-1.40 s after, 1.20-1.28 s straight into place;
 * with the copies skipped, for the experiment, 1.15-1.2 s.  Two reads in flight kept
 * that disk as busy as sixteen then (fio: 1.08-1.20 s at depths 1 to 4), but not in a
 * fresh load's own loop (below).
 *
 * 64 MiB of buffers, up to a sixteenth of the read (so 16 buffers, 8 reads in flight,
 * at 4 GiB; 7 and 3 at 504 MiB), populated 2 MiB at a time as they are first wanted,
 * or by the populating helper, one after each step once the steps get 4 KiB pages (a
 * load that gets only huge pages populates none of them); with the helper running,
 * the calling thread populates none while reads are in flight (apr_uring_read).
 * Why: with 16 MiB (2 staged reads in flight) the disk read 2.3 GB/s into staged
 * pieces of a fresh 4 GiB load once its destination was populated, against 2.7 GB/s
 * with 8 in flight and fio's 2.6-2.8 GB/s (sectors read per 50 ms, /sys/block/vda/stat); and
 * populated whole on first use, memory the host took back made that a 60-200 ms stall
 * of every read (a 32 MiB trial in stop 34 lost at 504 MiB for it). */
#define STAGE_BYTES ((size_t)64 << 20)
#define STAGE_MAX 32
#define STAGE_UNIT ((size_t)2 << 20) /* populated this much at a time: a huge page */
/* A writer takes the buffers only for this much (its default, 2 x 8 MiB): larger ones
 * map their own, as before the buffers grew. */
#define STAGE_WRITE_BYTES ((size_t)16 << 20)

/* The small ring: on a disk whose host copies each read into guest memory, every
 * whole-block piece is read into one of a few staging buffers, RING_BYTES in all, and
 * copied into place, whatever the destination's pages.
 *
 * Why: such a host (virtio-blk; Firecracker on the development VM) writes each read
 * with its own CPU, and it wrote into memory the guest reused at once faster than into
 * memory seen for the first time.  Reading the 504 MiB file in 4 MiB reads, one in
 * flight, cycling through K buffers populated before: 217-252 ms for K = 1 or 2,
 * 271-317 ms for K = 4 to 16 and for the whole destination (its own place for each
 * read), which is what straight reads and the 64 MiB set do; fio, which reuses its
 * buffers, 190-230 ms.  The host's cache seems to hold 8 MiB of it, not 16.  So a
 * piece is read into one of four 2 MiB buffers, two in flight, and copied from there
 * (a copy from the cache, on the thread that otherwise waits): 504 MiB into a
 * destination of huge pages populated before, the file evicted each time, six rounds
 * in one process: 211-258 ms against 258-305 ms read straight into place; 4 GiB, three
 * rounds: 1.62-2.32 s against 2.03-2.27 s.  The CRC read from the buffers while
 * copying, or the copy with streaming stores, changed nothing there (216-224 ms each).
 * Elsewhere (a disk whose device writes the memory itself) the copy is a cost with no
 * such gain, so the ring is the virtio-blk disks' alone unless asked for
 * (APR_STAGE_RING). */
#define RING_BYTES ((size_t)8 << 20)
#define RING_CHUNK ((size_t)2 << 20)

/* Whether fd's file lies on a virtio-blk disk (its block device's driver in sysfs, the
 * disk's own for a partition).  0 for anything else or unknown: files on tmpfs, on a
 * device-mapper or md device above the disk, or in an overlay. */
static int host_copies(int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0 || major(sb.st_dev) == 0)
        return 0;
    char path[96], link[256];
    for (int up = 0; up < 2; up++) {
        if (up)
            snprintf(path, sizeof path, "/sys/dev/block/%u:%u/../device/driver", major(sb.st_dev), minor(sb.st_dev));
        else
            snprintf(path, sizeof path, "/sys/dev/block/%u:%u/device/driver", major(sb.st_dev), minor(sb.st_dev));
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = 0;
        const char *name = strrchr(link, '/');
        return strcmp(name ? name + 1 : link, "virtio_blk") == 0;
    }
    return 0;
}
static uint8_t *stage_mem;  /* STAGE_BYTES on a huge-page boundary, kept for the process */
static int stage_busy;      /* atomic: one read holds the buffers at a time */
static int stage_mode = APR_STAGE_AUTO;
static __thread size_t staged_last; /* pieces the calling thread's last read staged */
/* Atomic, bit u for the unit at stage_mem + u * STAGE_UNIT (32 units): taken by a
 * thread to populate, and populated.  Kept with the buffers: populated once. */
static uint32_t stage_claimed, stage_ready;

/* Take and populate unit u unless another thread has taken it: 1 if this call did. */
static int stage_take(unsigned u)
{
    uint32_t bit = 1u << u;
    if ((__atomic_load_n(&stage_claimed, __ATOMIC_RELAXED) & bit)
        || (__atomic_fetch_or(&stage_claimed, bit, __ATOMIC_ACQ_REL) & bit))
        return 0;
    uint8_t *p = stage_mem + (size_t)u * STAGE_UNIT;
    if (madvise(p, STAGE_UNIT, APR_MADV_POPULATE_WRITE) != 0)
        memset(p, 0, STAGE_UNIT); /* kernels before 5.14: fault it in by writing */
    __atomic_fetch_or(&stage_ready, bit, __ATOMIC_RELEASE);
    return 1;
}

/* Populate the first unit below ``units`` nobody has taken: 1, or 0 when none is left. */
static int stage_take_next(unsigned units)
{
    for (unsigned u = 0; u < units; u++)
        if (stage_take(u))
            return 1;
    return 0;
}

/* Whether [off, off + len) of the buffers is populated, populating the units nobody has
 * taken.  may_leave: return 0 rather than wait for a unit another thread is populating
 * (the caller has reads to reap meanwhile). */
static int stage_fill(size_t off, size_t len, int may_leave)
{
    unsigned last = (unsigned)((off + len + STAGE_UNIT - 1) / STAGE_UNIT);
    for (unsigned u = (unsigned)(off / STAGE_UNIT); u < last; u++)
        while (!(__atomic_load_n(&stage_ready, __ATOMIC_ACQUIRE) & (1u << u))) {
            if (stage_take(u))
                break;
            if (may_leave)
                return 0;
            sched_yield(); /* the helper is populating it: a few milliseconds at most */
        }
    return 1;
}

/* The buffers of ``chunk`` bytes among the first nstage whose units are all populated:
 * bit b for the buffer at stage_mem + b * chunk. */
static unsigned stage_populated(size_t chunk, unsigned nstage)
{
    uint32_t ready = __atomic_load_n(&stage_ready, __ATOMIC_ACQUIRE);
    unsigned mask = 0;
    for (unsigned b = 0; b < nstage; b++) {
        unsigned u0 = (unsigned)(b * chunk / STAGE_UNIT), u1 = (unsigned)(((b + 1) * chunk + STAGE_UNIT - 1) / STAGE_UNIT);
        uint32_t need = (u1 - u0 >= 32 ? 0xffffffffu : ((1u << (u1 - u0)) - 1)) << u0;
        if ((ready & need) == need)
            mask |= 1u << b;
    }
    return mask;
}

/* The buffers, held until stage_release (NULL: another thread holds them, or no
 * memory).  Their pages are populated by stage_fill as a read first wants them; a
 * writer instead populates only what it fills, as it fills it (8 of the 16 MiB it
 * uses), so a single save in a fresh process does not pay for the rest. */
static uint8_t *stage_acquire(void)
{
    if (__atomic_exchange_n(&stage_busy, 1, __ATOMIC_ACQUIRE))
        return NULL; /* another thread's read has them: read straight into the pages */
    if (!stage_mem) {
        size_t huge = (size_t)2 << 20;
        uint8_t *raw = mmap(NULL, STAGE_BYTES + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) {
            __atomic_store_n(&stage_busy, 0, __ATOMIC_RELEASE);
            return NULL;
        }
        uint8_t *start = (uint8_t *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
        if (start > raw)
            munmap(raw, (size_t)(start - raw));
        if (start + STAGE_BYTES < raw + STAGE_BYTES + huge)
            munmap(start + STAGE_BYTES, (size_t)(raw + STAGE_BYTES + huge - (start + STAGE_BYTES)));
#ifdef MADV_HUGEPAGE
        madvise(start, STAGE_BYTES, MADV_HUGEPAGE);
#endif
        stage_mem = start;
    }
    return stage_mem;
}

static void stage_release(void)
{
    __atomic_store_n(&stage_busy, 0, __ATOMIC_RELEASE);
}

int apr_uring_set_staging(int mode)
{
    int old = __atomic_load_n(&stage_mode, __ATOMIC_RELAXED);
    if (mode == APR_STAGE_AUTO || mode == APR_STAGE_ALWAYS || mode == APR_STAGE_NEVER || mode == APR_STAGE_RING)
        __atomic_store_n(&stage_mode, mode, __ATOMIC_RELAXED);
    return old;
}

int apr_uring_stages_every_piece(int fd)
{
    int mode = __atomic_load_n(&stage_mode, __ATOMIC_RELAXED);
    return mode == APR_STAGE_RING || (mode == APR_STAGE_AUTO && host_copies(fd));
}

size_t apr_uring_staged_last(void)
{
    return staged_last;
}

typedef struct {
    int fd;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map, *sqe_map;
    size_t sq_size, cq_size, sqe_size;
    unsigned pending; /* queued in the SQ ring, not yet taken by the kernel */
    int timed;        /* a wait can time out (IORING_FEAT_EXT_ARG, 5.11+) */
} ring;

static int sys_setup(unsigned entries, struct io_uring_params *p)
{
    return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int sys_enter(int fd, unsigned submit, unsigned wait, unsigned flags)
{
    return (int)syscall(__NR_io_uring_enter, fd, submit, wait, flags, NULL, 0);
}

static void ring_close(ring *r)
{
    if (r->sqe_map && r->sqe_map != MAP_FAILED)
        munmap(r->sqe_map, r->sqe_size);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_size);
    if (r->sq_map && r->sq_map != MAP_FAILED)
        munmap(r->sq_map, r->sq_size);
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

/* 0, or APR_URING_UNAVAILABLE (anything that stops a ring being set up). */
static int ring_open(ring *r, unsigned entries)
{
    struct io_uring_params p;
    memset(r, 0, sizeof *r);
    memset(&p, 0, sizeof p);
    r->fd = -1;
    if (apr_fallbacks() & APR_FALLBACK_URING)
        return APR_URING_UNAVAILABLE;
    int fd = sys_setup(entries, &p);
    if (fd < 0)
        return APR_URING_UNAVAILABLE;
    r->fd = fd;
#if defined(IORING_FEAT_EXT_ARG) && defined(IORING_ENTER_EXT_ARG)
    r->timed = (p.features & IORING_FEAT_EXT_ARG) != 0;
#endif
    r->sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    int single = 0;
#ifdef IORING_FEAT_SINGLE_MMAP
    single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0; /* 5.4+: one map holds both rings */
#endif
    if (single && r->cq_size > r->sq_size)
        r->sq_size = r->cq_size;
    r->sq_map = mmap(NULL, r->sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED)
        goto fail;
    if (single) {
        r->cq_map = r->sq_map;
        r->cq_size = r->sq_size;
    } else {
        r->cq_map = mmap(NULL, r->cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
        if (r->cq_map == MAP_FAILED)
            goto fail;
    }
    r->sqe_size = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqe_map = mmap(NULL, r->sqe_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (r->sqe_map == MAP_FAILED)
        goto fail;
    uint8_t *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    r->sqes = r->sqe_map;
    /* slot i of the submission array always names entry i: entries are used in ring order */
    for (unsigned i = 0; i < p.sq_entries; i++)
        r->sq_array[i] = i;
    return 0;
fail:
    ring_close(r);
    return APR_URING_UNAVAILABLE;
}

/* Hand the queued entries to the kernel and, with wait, block until a completion is
 * there.  0 or an errno value. */
static int ring_enter(ring *r, int wait)
{
    for (;;) {
        unsigned flags = wait ? IORING_ENTER_GETEVENTS : 0;
        if (!r->pending && !wait)
            return 0;
        int got = sys_enter(r->fd, r->pending, wait ? 1 : 0, flags);
        if (got >= 0) {
            r->pending -= (unsigned)got < r->pending ? (unsigned)got : r->pending;
            if (!r->pending || wait)
                return 0;
            continue;
        }
        if (errno == EINTR)
            continue;
        /* EAGAIN/EBUSY: the kernel is short of resources or completions are piling up;
         * wait for one (the completions are reaped by the caller) and try again */
        if ((errno == EAGAIN || errno == EBUSY) && !wait) {
            wait = 1;
            continue;
        }
        return errno;
    }
}

/* Wait for a completion, at most ``ns`` (ring_enter where the kernel cannot time out):
 * 0, or an errno.  Why: the calling thread waits for a step the helper is populating
 * as much as for a completion, and the development VM's disk completes the reads it
 * holds together (16 reads of 4 MiB in 25 ms): waiting for a completion left the
 * steps the helper populated meanwhile unread. */
static int ring_wait_for(ring *r, long ns)
{
#if defined(IORING_FEAT_EXT_ARG) && defined(IORING_ENTER_EXT_ARG)
    if (r->timed) {
        struct __kernel_timespec ts = {0, ns};
        struct io_uring_getevents_arg arg;
        memset(&arg, 0, sizeof arg);
        arg.ts = (uint64_t)(uintptr_t)&ts;
        int got = (int)syscall(__NR_io_uring_enter, r->fd, r->pending, 1, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                               &arg, sizeof arg);
        if (got >= 0) {
            r->pending -= (unsigned)got < r->pending ? (unsigned)got : r->pending;
            return 0;
        }
        return errno == ETIME || errno == EINTR ? 0 : errno;
    }
#endif
    (void)ns;
    return ring_enter(r, 1);
}

/* Hand the queued reads to the kernel; on a refusal none of them starts: the first
 * error is kept in *status and they leave *inflight.  Returns nonzero on a refusal. */
static int submit_queued(ring *r, int *status, unsigned *inflight)
{
    if (!r->pending)
        return 0;
    int rc = ring_enter(r, 0);
    if (!rc)
        return 0;
    if (!*status)
        *status = rc;
    *inflight -= r->pending;
    r->pending = 0;
    return 1;
}

typedef struct {
    uint64_t pos;    /* file offset of the next byte */
    uint8_t *buf;    /* where it goes */
    size_t left;     /* bytes asked for still to come */
    size_t need;     /* of those, bytes that must come (the rest may lie past the end) */
    size_t unit;     /* the piece of the range this read fills */
    struct iovec iov;
    int busy;
    int stage;       /* the staging buffer it reads into, -1: none (straight into dst) */
} slot;

typedef struct {
    uint64_t offset, end;  /* the range asked for */
    uint64_t a0, a1;       /* its whole aligned blocks */
    uint64_t first;        /* a0 / chunk */
    size_t chunk, body;    /* chunk bytes; pieces of [a0, a1) */
    int head, tail;        /* a partial block at the start / the end */
} plan;

static size_t units(const plan *pl)
{
    return (size_t)pl->head + pl->body + (size_t)pl->tail;
}

/* The file bytes [*lo, *hi) of unit u, in order: the head's partial block, the aligned
 * pieces ending on multiples of chunk, the tail's partial block. */
static void unit_range(const plan *pl, size_t u, uint64_t *lo, uint64_t *hi)
{
    if (pl->head && u == 0) {
        *lo = pl->offset;
        *hi = pl->a0;
        return;
    }
    u -= (size_t)pl->head;
    if (u >= pl->body) {
        *lo = pl->a1;
        *hi = pl->end;
        return;
    }
    uint64_t lo_ = (pl->first + u) * pl->chunk, hi_ = lo_ + pl->chunk;
    *lo = lo_ > pl->a0 ? lo_ : pl->a0;
    *hi = hi_ < pl->a1 ? hi_ : pl->a1;
}

/* Queue one vectored read or write (opcode) of iov at off; user_data names its slot. */
static void queue_vec(ring *r, int opcode, int fd, uint64_t off, struct iovec *iov, uint64_t user_data)
{
    unsigned tail = *r->sq_tail; /* only this thread writes the tail */
    struct io_uring_sqe *sqe = &r->sqes[tail & *r->sq_mask];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = (uint8_t)opcode;
    sqe->fd = fd;
    sqe->off = off;
    sqe->addr = (uint64_t)(uintptr_t)iov;
    sqe->len = 1;
    sqe->user_data = user_data;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    r->pending++;
}

static void queue_read(ring *r, int fd, slot *s, size_t index)
{
    s->iov.iov_base = s->buf;
    s->iov.iov_len = s->left;
    /* READV is there since 5.1, READ only since 5.6; one vector costs nothing more */
    queue_vec(r, IORING_OP_READV, fd, s->pos, &s->iov, (uint64_t)index);
}

/* The calling thread copies staged pieces and checksums them this much at a time,
 * reaping completions and submitting reads in between.  Why: this VM's disk completes
 * the reads it holds together, and completions seen only after a whole piece's copy
 * (0.4 ms for 4 MiB) or CRC left it idle up to that long each time: a warm 504 MiB load with
 * every piece staged took 215-226 ms, 198-208 ms with the copies and the CRC skipped
 * (for the experiment), fio 200 ms. */
#define SLICE_BYTES ((size_t)256 << 10)

int apr_uring_read(int fd, uint8_t *dst, uint64_t offset, size_t len, uint32_t *crc, size_t align,
                   unsigned depth, size_t chunk, apr_fresh_state *pages)
{
    staged_last = 0;
    if (depth == 0)
        depth = APR_URING_DEPTH;
    if (depth > 256)
        depth = 256;
    int mode = __atomic_load_n(&stage_mode, __ATOMIC_RELAXED);
    /* every whole-block piece through the small ring (RING_BYTES says why), where the
     * ring holds at least two of them */
    int ring_all = apr_uring_stages_every_piece(fd) && (chunk == 0 || chunk <= RING_BYTES / 2);
    /* the destination's pages then no longer split the reads, so huge pages are worth
     * only what they save in populating (buffers.c's own mark) */
    if (ring_all && pages)
        pages->slow_ns = 0;
    if (chunk == 0)
        chunk = ring_all ? RING_CHUNK : APR_URING_CHUNK;
    if (align == 0 || (align & (align - 1)) || chunk < align || (chunk & (chunk - 1)) || chunk > ((size_t)1 << 30))
        return EINVAL;
    if ((((uintptr_t)dst - (uintptr_t)offset) & (align - 1)) != 0)
        return EINVAL;
    plan pl;
    memset(&pl, 0, sizeof pl);
    pl.offset = offset;
    pl.end = offset + len;
    pl.a0 = (offset + align - 1) & ~(uint64_t)(align - 1);
    pl.a1 = pl.end & ~(uint64_t)(align - 1);
    if (len == 0 || pl.end < offset || pl.a1 <= pl.a0)
        return EINVAL; /* no whole block: the caller reads it another way */
    pl.chunk = chunk;
    pl.first = pl.a0 / chunk;
    pl.body = (size_t)((pl.a1 + chunk - 1) / chunk - pl.first);
    pl.head = pl.a0 > offset;
    pl.tail = pl.end > pl.a1;
    size_t n = units(&pl);

    ring r;
    sharer share;
    int shared = 0;
    uint8_t *stage = NULL; /* the staging buffers, once a piece wanted them */
    if (ring_open(&r, depth))
        return APR_URING_UNAVAILABLE;
    slot *slots = calloc(depth, sizeof *slots);
    uint8_t *done = calloc(n, 1);
    void *bounce = NULL;
    int status = 0;
    if (slots == NULL || done == NULL || posix_memalign(&bounce, align, 2 * align)) {
        bounce = NULL;
        status = ENOMEM;
        goto out;
    }
    uint8_t *head_block = bounce, *tail_block = (uint8_t *)bounce + align;
    uint8_t *populated = dst;
    int stage_tried = mode == APR_STAGE_NEVER || chunk > STAGE_BYTES;
    unsigned nstage = (unsigned)((ring_all ? RING_BYTES : STAGE_BYTES) / chunk), stage_free = 0;
    if (nstage > STAGE_MAX)
        nstage = STAGE_MAX;
    if (nstage > 2 * depth)
        nstage = 2 * depth;
    size_t sixteenth = pl.body / 16 > 4 ? pl.body / 16 : 4; /* of the read's pieces, at least 4 */
    if (nstage > sixteenth && !ring_all)
        nstage = (unsigned)sixteenth;
    unsigned stage_units = (unsigned)((nstage * chunk + STAGE_UNIT - 1) / STAGE_UNIT);
    unsigned stage_all = nstage >= 32 ? 0xffffffffu : (1u << nstage) - 1; /* every buffer free */
    /* staged reads in flight at most; the other buffers wait for their copies */
    unsigned stage_cap = nstage / 2 ? nstage / 2 : 1, staged_inflight = 0;
    /* completed staged reads whose bytes are still to be copied into place, in order of
     * completion (at most nstage of them) */
    size_t copy_unit[STAGE_MAX];
    int copy_buf[STAGE_MAX];
    unsigned ncopy = 0;
    for (unsigned i = 0; i < depth; i++)
        slots[i].stage = -1;
    /* A fresh destination large enough for the helper takes the buffers now, so that the
     * helper populates them before they are wanted (stage_fill waits otherwise). */
    if (pages && !stage_tried && share_worth(dst, len)) {
        stage_tried = 1;
        stage = stage_acquire();
        stage_free = stage ? stage_all : 0;
    }
    shared = pages ? share_start(&share, pages, dst, len, stage ? stage_units : 0, ring_all) : 0;
    if (shared)
        pages->leader = &share.st; /* the helper's timings choose the page size for both */
    uint32_t value = crc ? *crc : 0;
    size_t next = 0, crc_next = 0;
    size_t copy_off = 0, crc_off = 0; /* bytes of copy_unit[0] copied, of crc_next checksummed */
    unsigned inflight = 0;
    for (;;) {
        int on_helper = 0; /* the next read waits for the helper's populating, not the disk */
        /* fill the free slots with the next pieces, in file order */
        for (unsigned i = 0; i < depth && status == 0 && next < n && inflight < depth; i++) {
            slot *s = &slots[i];
            if (s->busy)
                continue;
            uint64_t lo, hi;
            unit_range(&pl, next, &lo, &hi);
            if (shared) {
                /* with reads in flight, reap and checksum rather than wait for the helper */
                if (!share_ready(&share, pages, dst + (hi - offset), inflight > 0,
                                 inflight == 0 || !r.timed || share_caller_huge(&share))) {
                    on_helper = 1;
                    break;
                }
            } else if (pages) {
                uint8_t *need = dst + (hi - offset);
                while (populated < need) {
                    uint8_t *step = (uint8_t *)(((uintptr_t)populated + FRESH_STEP) & ~(uintptr_t)(FRESH_STEP - 1));
                    apr_fresh_populate(pages, populated, (size_t)(step - populated));
                    populated = step;
                }
            }
            int body = !(pl.head && next == 0) && !(pl.tail && next == n - 1);
            int want_stage = 0;
            if (body && (!stage_tried || stage)) {
                uint8_t *at = dst + (lo - offset);
                size_t bytes = (size_t)(hi - lo);
                want_stage = mode == APR_STAGE_ALWAYS || ring_all
                             || (shared ? share_small(&share, at, bytes)
                                        : pages ? (pages->small_lo && pages->small_lo < at + bytes && pages->small_hi > at)
                                                : apr_small_pages_overlap(at, bytes));
            }
            if (want_stage && !stage_tried) {
                stage_tried = 1;
                stage = stage_acquire();
                stage_free = stage ? stage_all : 0;
            }
            unsigned usable = stage_free;
            if (want_stage && stage && shared && inflight > 0 && r.timed) {
                /* The helper populates the buffers: with reads in flight a piece takes
                 * one already populated, or waits for one.  Why: in memory the host took
                 * back a buffer's 2 MiB unit took ~4.5 ms, and with the calling thread
                 * populating them between completions the first completions of a fresh
                 * 504 MiB load were reaped up to 15 ms late.  Reading such a piece
                 * straight into its 4 KiB pages meanwhile did not win (six pairs:
                 * 0.211-0.260 s against 0.206-0.216 s, and one load of 0.46 s whose
                 * steps all got slow huge pages and staged nothing). */
                usable &= stage_populated(chunk, nstage);
                if (!usable && stage_free)
                    on_helper = 1;
            }
            if (want_stage && stage && (!usable || staged_inflight >= stage_cap))
                break; /* the buffers are being read into or copied from: reap and copy first */
            s->stage = -1;
            if (want_stage && stage && !stage_fill((size_t)__builtin_ctz(usable) * chunk, chunk, inflight > 0)) {
                on_helper = 1;
                break; /* its buffer is being populated by the helper: reap meanwhile */
            }
            if (want_stage && stage) {
                int b = __builtin_ctz(usable);
                stage_free &= ~(1u << b);
                s->stage = b;
                staged_inflight++;
                staged_last++;
            }
            s->unit = next;
            s->busy = 1;
            if (pl.head && next == 0) {
                s->pos = pl.a0 - align;
                s->buf = head_block;
                s->left = s->need = align;
            } else if (pl.tail && next == n - 1) {
                s->pos = pl.a1;
                s->buf = tail_block;
                s->left = align;
                s->need = (size_t)(pl.end - pl.a1); /* the block may end with the file */
            } else {
                s->pos = lo;
                s->buf = s->stage >= 0 ? stage + (size_t)s->stage * chunk : dst + (lo - offset);
                s->left = s->need = (size_t)(hi - lo);
            }
            queue_read(&r, fd, s, i);
            inflight++;
            next++;
            /* into a fresh destination each read goes out as soon as its own steps are
             * populated.  Why: queued until the loop ended, the first sixteen waited
             * for all sixteen pieces (64 MiB) to be populated, the disk idle meanwhile
             * (~5 ms for memory just freed, up to ~70 ms for memory the host took back) */
            if (pages && submit_queued(&r, &status, &inflight))
                break;
        }
        submit_queued(&r, &status, &inflight);
        /* reap what has completed; then refill the ring before anything else */
        unsigned head = *r.cq_head, tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
        if (head != tail) {
            for (; head != tail; head++) {
                struct io_uring_cqe *cqe = &r.cqes[head & *r.cq_mask];
                size_t index = (size_t)cqe->user_data;
                int res = cqe->res;
                slot *s = &slots[index];
                if (res == -EINTR || res == -EAGAIN) {
                    if (status == 0) {
                        queue_read(&r, fd, s, index);
                        continue;
                    }
                    res = -EAGAIN;
                }
                if (res > 0 && (size_t)res > s->left)
                    res = -EIO; /* more than asked for: never trust it */
                if (res > 0) {
                    s->pos += (uint64_t)res;
                    s->buf += res;
                    s->left -= (size_t)res;
                    s->need = s->need > (size_t)res ? s->need - (size_t)res : 0;
                    /* a short read: ask for the rest, from an aligned position only; one
                     * that stopped mid-block is where the file ended then (see pio.c's
                     * direct_read), and s->need below says whether that was enough */
                    if (s->need && status == 0 && (s->pos & (uint64_t)(align - 1)) == 0) {
                        queue_read(&r, fd, s, index);
                        continue;
                    }
                }
                s->busy = 0;
                inflight--;
                int staged = s->stage;
                s->stage = -1;
                if (staged >= 0)
                    staged_inflight--;
                if (staged >= 0 && (res < 0 || s->need))
                    stage_free |= 1u << staged; /* nothing to copy from it */
                if (res < 0) {
                    if (!status)
                        status = -res;
                    continue;
                }
                if (s->need) {
                    if (!status)
                        status = -1; /* the file ended first */
                    continue;
                }
                uint64_t lo, hi;
                unit_range(&pl, s->unit, &lo, &hi);
                if (pl.head && s->unit == 0)
                    memcpy(dst, head_block + (offset - (pl.a0 - align)), (size_t)(hi - lo));
                else if (pl.tail && s->unit == n - 1)
                    memcpy(dst + (lo - offset), tail_block, (size_t)(hi - lo));
                else if (staged >= 0) {
                    copy_unit[ncopy] = s->unit; /* copied below, once the next reads are out */
                    copy_buf[ncopy++] = staged;
                    continue;
                }
                done[s->unit] = 1;
            }
            __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
            continue;
        }
        /* nothing new: copy a staged piece into place (its buffer then takes the next
         * read), oldest first, a slice at a time (SLICE_BYTES) */
        if (ncopy) {
            uint64_t lo, hi;
            unit_range(&pl, copy_unit[0], &lo, &hi);
            size_t left = (size_t)(hi - lo) - copy_off, part = left < SLICE_BYTES ? left : SLICE_BYTES;
            if (status == 0) {
                memcpy(dst + (lo - offset) + copy_off, stage + (size_t)copy_buf[0] * chunk + copy_off, part);
                copy_off += part;
                if (part < left)
                    continue;
            }
            copy_off = 0;
            done[copy_unit[0]] = 1;
            stage_free |= 1u << copy_buf[0];
            ncopy--;
            memmove(copy_unit, copy_unit + 1, ncopy * sizeof copy_unit[0]);
            memmove(copy_buf, copy_buf + 1, ncopy * sizeof copy_buf[0]);
            continue;
        }
        /* then the CRC of the next piece in file order, while the rest is read, a
         * slice at a time too */
        if (crc && status == 0 && crc_next < n && done[crc_next]) {
            uint64_t lo, hi;
            unit_range(&pl, crc_next, &lo, &hi);
            size_t left = (size_t)(hi - lo) - crc_off, part = left < SLICE_BYTES ? left : SLICE_BYTES;
            value = apr_crc32(value, dst + (lo - offset) + crc_off, part);
            crc_off += part;
            if (part == left) {
                crc_off = 0;
                crc_next++;
            }
            continue;
        }
        if (inflight == 0 && next >= n)
            break;
        /* the reads in flight are not done: populate a staging buffer or a step ahead
         * instead of waiting */
        if (stage && status == 0 && !shared && staged_last && stage_take_next(stage_units))
            continue;
        if (shared && status == 0
            && (inflight == 0 || !r.timed || share_caller_huge(&share) || !__atomic_load_n(&share.st.huge, __ATOMIC_RELAXED))
            && share_take(&share, pages))
            continue;
        if (inflight == 0)
            break;
        /* a step or buffer the helper populates can let the next read go before any
         * completion: look again every half millisecond */
        int rc = on_helper ? ring_wait_for(&r, 500000) : ring_enter(&r, 1);
        if (rc) {
            /* Reads in flight still write into dst: never return before they end.
             * Their completions are posted whatever happens to the wait, so look
             * again after a pause (the pause's system call runs the kernel's
             * pending completion work too). */
            if (!status && rc != EAGAIN && rc != EBUSY)
                status = rc;
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
    }
    if (status == 0 && crc) {
        while (crc_next < n) {
            uint64_t lo, hi;
            unit_range(&pl, crc_next, &lo, &hi);
            value = apr_crc32(value, dst + (lo - offset) + crc_off, (size_t)(hi - lo) - crc_off);
            crc_off = 0;
            crc_next++;
        }
        *crc = value;
    }
out:
    if (shared) {
        share_stop(&share);
        pages->huge = share.st.huge; /* what apr_fresh_finish records for later blocks */
        apr_fresh_merge(pages, &share.st);
        pages->leader = NULL;
    }
    if (stage)
        stage_release(); /* every read into the buffers has completed: inflight is 0 here */
    free(bounce);
    free(done);
    free(slots);
    ring_close(&r);
    return status;
}

int apr_uring_available(void)
{
    ring r;
    if (ring_open(&r, 1))
        return 0;
    ring_close(&r);
    return 1;
}

/* ---- direct writes (uring.h apr_uring_writer) ---------------------------------- */

/* The CRC and the copy go this much at a time, so the bytes the CRC just read are
 * still in the core's cache when they are copied, and completions are reaped between
 * pieces (a finished buffer's slot is refilled sooner). */
#define WRITE_PIECE ((size_t)256 << 10)

typedef struct {
    uint64_t pos;        /* file offset of the next byte to write */
    const uint8_t *buf;  /* the next byte */
    size_t left;         /* bytes still to write */
    struct iovec iov;
    int busy;
} wslot;

/* A second thread that fills half of each buffer (its CRC and its copy) while the
 * calling thread fills the other half.  Why: on the development VM, while the disk
 * wrote, the calling thread's CRC and copy ran at 3.4-3.7 GB/s at times (user time
 * 1.2 s for 4 GiB, against 0.29 s for the same loop with no write in flight), barely
 * faster than the disk takes bytes, so each refill held the next write back. */
typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;          /* FILL_IDLE, FILL_POSTED, FILL_DONE or FILL_QUIT */
    const uint8_t *src;
    uint8_t *dst;
    size_t len;
    int want_crc;
    uint32_t crc;       /* the CRC of its part alone (from 0) */
} fill_helper;

enum { FILL_IDLE, FILL_POSTED, FILL_DONE, FILL_QUIT };

/* A buffer's share this large or more is split with the helper.  Not tuned: below it the
 * hand-off (two wake-ups, tens of microseconds on a VM) is a large share of the work. */
#define FILL_SPLIT_MIN ((size_t)1 << 20)

struct apr_uring_writer {
    ring r;
    int fd;
    uint64_t offset;    /* file offset of the first byte of the buffer being filled */
    uint64_t written;   /* bytes the kernel has reported written */
    size_t chunk;
    unsigned depth;
    unsigned current;   /* the buffer being filled */
    size_t fill;        /* bytes in it */
    unsigned inflight;
    int status;         /* the first error: every later call answers it */
    int staged;         /* mem is the process's staging buffers (stage_release on close) */
    uint8_t *mem;       /* depth * chunk bytes, buffer i at mem + i * chunk */
    void *map;          /* the writer's own map (when not staged) */
    size_t map_len;
    wslot *slots;
    fill_helper *helper; /* NULL: the calling thread fills alone */
};

/* The CRC (into *crc when not NULL) and the copy of len bytes, a piece at a time so
 * that the bytes the CRC just read are still in the core's cache for the copy. */
static void fill_pieces(uint8_t *dst, const uint8_t *src, size_t len, uint32_t *crc)
{
    while (len) {
        size_t n = len < WRITE_PIECE ? len : WRITE_PIECE;
        if (crc)
            *crc = apr_crc32(*crc, src, n);
        memcpy(dst, src, n);
        dst += n;
        src += n;
        len -= n;
    }
}

static void *fill_main(void *arg)
{
    fill_helper *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->state != FILL_POSTED && h->state != FILL_QUIT)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->state == FILL_QUIT)
            break;
        pthread_mutex_unlock(&h->mu);
        uint32_t crc = 0;
        fill_pieces(h->dst, h->src, h->len, h->want_crc ? &crc : NULL);
        pthread_mutex_lock(&h->mu);
        h->crc = crc;
        h->state = FILL_DONE;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* A started helper, or NULL (no second processor idle, or no thread to be had). */
static fill_helper *fill_start(int want)
{
    if (want == 0 || (want < 0 && apr_parallel_idle_cpus(2) < 2))
        return NULL;
    fill_helper *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        return NULL;
    }
    if (pthread_cond_init(&h->cv, NULL) != 0) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    if (pthread_create(&h->thread, NULL, fill_main, h) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    return h;
}

static void fill_stop(fill_helper *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->state = FILL_QUIT;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Fill len bytes, the second half by the helper while this thread does the first;
 * *crc (when not NULL) continued over all of them. */
static void fill_split(fill_helper *h, uint8_t *dst, const uint8_t *src, size_t len, uint32_t *crc)
{
    size_t half = (len / 2) & ~(size_t)4095;
    pthread_mutex_lock(&h->mu);
    h->src = src + half;
    h->dst = dst + half;
    h->len = len - half;
    h->want_crc = crc != NULL;
    h->state = FILL_POSTED;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    fill_pieces(dst, src, half, crc);
    pthread_mutex_lock(&h->mu);
    while (h->state != FILL_DONE)
        pthread_cond_wait(&h->cv, &h->mu);
    h->state = FILL_IDLE;
    uint32_t rest = h->crc;
    pthread_mutex_unlock(&h->mu);
    if (crc)
        *crc = apr_crc32_combine(*crc, rest, len - half);
}

static void queue_write(apr_uring_writer *w, unsigned index)
{
    wslot *s = &w->slots[index];
    s->iov.iov_base = (void *)s->buf;
    s->iov.iov_len = s->left;
    queue_vec(&w->r, IORING_OP_WRITEV, w->fd, s->pos, &s->iov, (uint64_t)index); /* 5.1+, as READV */
}

static void writer_fail(apr_uring_writer *w, int err)
{
    if (!w->status)
        w->status = err;
}

/* Hand queued writes to the kernel. */
static void writer_submit(apr_uring_writer *w)
{
    if (!w->r.pending)
        return;
    int rc = ring_enter(&w->r, 0);
    if (rc) {
        /* the kernel took none of what is queued: those writes never start */
        writer_fail(w, rc);
        /* their slots stay busy; the writer has failed, so no call fills them again,
         * and close() waits only for the writes the kernel took */
        w->inflight -= w->r.pending;
        w->r.pending = 0;
    }
}

/* Take every completion posted; with wait, block for one first when none is there.
 * A short write is resubmitted for the rest (an error once the writer has failed). */
static void writer_reap(apr_uring_writer *w, int wait)
{
    ring *r = &w->r;
    for (;;) {
        unsigned head = *r->cq_head, tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        if (head == tail) {
            if (!wait || w->inflight == 0)
                return;
            int rc = ring_enter(r, 1);
            if (rc) {
                /* writes in flight still read the buffers: look again after a pause */
                if (rc != EAGAIN && rc != EBUSY && rc != EINTR)
                    writer_fail(w, rc);
                struct timespec pause = {0, 1000000};
                nanosleep(&pause, NULL);
            }
            continue;
        }
        for (; head != tail; head++) {
            struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
            unsigned index = (unsigned)cqe->user_data;
            int res = cqe->res;
            if (index >= w->depth)
                continue; /* never ours */
            wslot *s = &w->slots[index];
            if ((res == -EINTR || res == -EAGAIN) && !w->status) {
                queue_write(w, index);
                continue;
            }
            if (res > 0 && (size_t)res > s->left)
                res = -EIO; /* more than asked for: never trust it */
            if (res == 0)
                res = -EIO; /* no progress: a device that stopped taking bytes */
            if (res > 0) {
                s->pos += (uint64_t)res;
                s->buf += res;
                s->left -= (size_t)res;
                w->written += (uint64_t)res;
                if (s->left && !w->status) {
                    queue_write(w, index); /* a short write: the rest */
                    continue;
                }
            } else {
                writer_fail(w, -res);
            }
            s->busy = 0;
            w->inflight--;
        }
        __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
        writer_submit(w); /* resubmissions */
        wait = 0; /* something came: the caller looks again if it must wait more */
    }
}

/* Write the first n bytes of the buffer being filled at w->offset; the next buffer
 * becomes the one filled. */
static void writer_send(apr_uring_writer *w, size_t n)
{
    wslot *s = &w->slots[w->current];
    s->pos = w->offset;
    s->buf = w->mem + (size_t)w->current * w->chunk;
    s->left = n;
    s->busy = 1;
    w->inflight++;
    queue_write(w, w->current);
    writer_submit(w);
    w->offset += n;
    w->current = (w->current + 1) % w->depth;
    w->fill = 0;
}

apr_uring_writer *apr_uring_writer_open(int fd, uint64_t offset, size_t chunk, unsigned depth, int helper, int *err)
{
    int e = 0;
    if (depth == 0)
        depth = APR_URING_WRITE_DEPTH;
    if (chunk == 0)
        chunk = APR_URING_WRITE_CHUNK;
    if (depth > 64 || (chunk & (chunk - 1)) || chunk < 4096 || chunk > ((size_t)1 << 30)) {
        *err = EINVAL;
        return NULL;
    }
    apr_uring_writer *w = calloc(1, sizeof *w);
    if (w == NULL) {
        *err = ENOMEM;
        return NULL;
    }
    w->r.fd = -1; /* no ring yet: close() must not close descriptor 0 */
    w->fd = fd;
    w->offset = offset;
    w->chunk = chunk;
    w->depth = depth;
    w->slots = calloc(depth, sizeof *w->slots);
    if (w->slots == NULL) {
        e = ENOMEM;
        goto fail;
    }
    if (ring_open(&w->r, depth)) {
        e = APR_URING_UNAVAILABLE;
        goto fail;
    }
    size_t bytes = chunk * depth;
    if (bytes <= STAGE_WRITE_BYTES && (w->mem = stage_acquire()) != NULL) {
        w->staged = 1;
    } else {
        size_t huge = (size_t)2 << 20;
        w->map_len = bytes + huge;
        w->map = mmap(NULL, w->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (w->map == MAP_FAILED) {
            w->map = NULL;
            e = ENOMEM;
            goto fail;
        }
        w->mem = (uint8_t *)(((uintptr_t)w->map + huge - 1) & ~(uintptr_t)(huge - 1));
#ifdef MADV_HUGEPAGE
        madvise(w->mem, bytes, MADV_HUGEPAGE); /* advice: 4 KiB pages still work */
#endif
    }
    w->helper = fill_start(helper);
    return w;
fail:
    apr_uring_writer_close(w);
    *err = e;
    return NULL;
}

int apr_uring_writer_write(apr_uring_writer *w, const uint8_t *src, size_t len, uint32_t *crc)
{
    uint32_t value = crc ? *crc : 0;
    while (len && !w->status) {
        wslot *s = &w->slots[w->current];
        if (s->busy) {
            writer_reap(w, 1); /* the buffer to fill is still being written */
            continue;
        }
        size_t n = w->chunk - w->fill;
        if (n > len)
            n = len;
        uint8_t *dst = w->mem + (size_t)w->current * w->chunk + w->fill;
        if (w->helper && n >= FILL_SPLIT_MIN) {
            fill_split(w->helper, dst, src, n, crc ? &value : NULL);
        } else {
            if (n > WRITE_PIECE)
                n = WRITE_PIECE; /* completions are reaped between pieces */
            fill_pieces(dst, src, n, crc ? &value : NULL);
        }
        w->fill += n;
        src += n;
        len -= n;
        if (w->fill == w->chunk)
            writer_send(w, w->chunk);
        writer_reap(w, 0);
    }
    if (crc)
        *crc = value;
    return w->status;
}

int apr_uring_writer_flush(apr_uring_writer *w, size_t align, const uint8_t **tail, size_t *tail_len,
                           uint64_t *tail_offset)
{
    if (align == 0)
        align = 1;
    size_t whole = w->fill - w->fill % align, rest = w->fill - whole;
    const uint8_t *at = w->mem + (size_t)w->current * w->chunk + whole;
    if (whole && !w->status)
        writer_send(w, whole); /* the bytes after them are not part of this write */
    w->fill = 0;
    while (w->inflight)
        writer_reap(w, 1);
    *tail = at;
    *tail_len = rest;
    *tail_offset = w->offset;
    return w->status;
}

uint64_t apr_uring_writer_written(const apr_uring_writer *w)
{
    return w->written;
}

void apr_uring_writer_close(apr_uring_writer *w)
{
    if (w == NULL)
        return;
    if (w->r.fd >= 0 && w->slots) {
        if (!w->status)
            w->status = ECANCELED; /* no resubmissions from here */
        while (w->inflight)
            writer_reap(w, 1);
    }
    if (w->r.sq_map || w->r.fd >= 0)
        ring_close(&w->r);
    fill_stop(w->helper);
    if (w->staged)
        stage_release();
    else if (w->map)
        munmap(w->map, w->map_len);
    free(w->slots);
    free(w);
}

#else /* no io_uring here */
int apr_uring_read(int fd, uint8_t *dst, uint64_t offset, size_t len, uint32_t *crc, size_t align,
                   unsigned depth, size_t chunk, apr_fresh_state *pages)
{
    (void)fd; (void)dst; (void)offset; (void)len; (void)crc; (void)align; (void)depth; (void)chunk; (void)pages;
    return APR_URING_UNAVAILABLE;
}

int apr_uring_available(void)
{
    return 0;
}

int apr_uring_set_staging(int mode)
{
    (void)mode;
    return APR_STAGE_AUTO;
}

int apr_uring_stages_every_piece(int fd)
{
    (void)fd;
    return 0;
}

size_t apr_uring_staged_last(void)
{
    return 0;
}
apr_uring_writer *apr_uring_writer_open(int fd, uint64_t offset, size_t chunk, unsigned depth, int helper, int *err)
{
    (void)fd; (void)offset; (void)chunk; (void)depth; (void)helper;
    *err = APR_URING_UNAVAILABLE;
    return NULL;
}

int apr_uring_writer_write(apr_uring_writer *w, const uint8_t *src, size_t len, uint32_t *crc)
{
    (void)w; (void)src; (void)len; (void)crc;
    return EINVAL;
}

int apr_uring_writer_flush(apr_uring_writer *w, size_t align, const uint8_t **tail, size_t *tail_len,
                           uint64_t *tail_offset)
{
    (void)w; (void)align; (void)tail; (void)tail_len; (void)tail_offset;
    return EINVAL;
}

void apr_uring_writer_close(apr_uring_writer *w)
{
    (void)w;
}

uint64_t apr_uring_writer_written(const apr_uring_writer *w)
{
    (void)w;
    return 0;
}
#endif
