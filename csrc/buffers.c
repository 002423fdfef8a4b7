#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "buffers.h"
#include "fallbacks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <malloc.h>
#else
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#endif

#define HUGE_PAGE ((size_t)1 << 21)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

#if defined(__linux__)
/* Heap blocks this large (freed ones go to the buffer cache, so loops rarely get here)
 * have their whole pages populated in one call.  Why: glibc maps such a block fresh in a
 * new process, and a fresh process's 4 MiB load then took 1000 page faults during its
 * read (about 3 ms of its 3.3 ms on the development VM); pages already present cost
 * only the walk over them. */
#define HEAP_POPULATE_MIN ((size_t)256 << 10)

static void populate_heap_pages(void *p, size_t size)
{
    if (size < HEAP_POPULATE_MIN || (apr_fallbacks() & APR_FALLBACK_MADVISE))
        return;
    size_t page = 4096;
    uintptr_t lo = round_up((uintptr_t)p, page), hi = ((uintptr_t)p + size) & ~(uintptr_t)(page - 1);
    if (hi > lo) /* only pages wholly inside the block: it writes nothing, it faults them in */
        madvise((void *)lo, hi - lo, APR_MADV_POPULATE_WRITE); /* advisory: old kernels refuse it */
}
#endif

static int heap_alloc(apr_block *block, size_t size, size_t alignment)
{
    void *p = NULL;
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    /* A zero-byte request still returns a distinct, aligned, freeable pointer. */
#ifdef _WIN32
    p = _aligned_malloc(size ? size : 1, alignment);
    if (!p)
        return ENOMEM;
#else
    int rc = posix_memalign(&p, alignment, size ? size : 1);
    if (rc)
        return rc;
#if defined(__linux__)
    populate_heap_pages(p, size);
#endif
#endif
    block->ptr = p;
    block->base = p;
    block->mapped = 0;
    block->capacity = size;
    return 0;
}

#if defined(_WIN32)
/* Reserve size + 2 MiB and commit the 2 MiB-aligned part.  A reservation is released
 * whole (VirtualFree of its base), so the slack stays reserved, never committed: it
 * costs address space only.  No large pages: they need SeLockMemoryPrivilege. */
static int mapped_alloc(apr_block *block, size_t size, int defer)
{
    (void)defer; /* nothing to populate ahead: Windows commits pages as they are touched */
    if (size > SIZE_MAX - 2 * HUGE_PAGE)
        return ENOMEM;
    size_t want = round_up(size, HUGE_PAGE);
    uint8_t *raw = VirtualAlloc(NULL, want + HUGE_PAGE, MEM_RESERVE, PAGE_NOACCESS);
    if (!raw)
        return ENOMEM;
    uint8_t *start = (uint8_t *)round_up((uintptr_t)raw, HUGE_PAGE);
    if (!VirtualAlloc(start, want, MEM_COMMIT, PAGE_READWRITE)) {
        VirtualFree(raw, 0, MEM_RELEASE);
        return ENOMEM;
    }
    block->ptr = start;
    block->base = raw;
    block->mapped = want;
    block->capacity = want;
    return 0;
}

/* Windows commits pages as they are touched: nothing is populated ahead, so nothing is
 * deferred or claimed. */
static void fresh_unregister(uint8_t *lo, uint8_t *hi) { (void)lo; (void)hi; }
int apr_fresh_claim(const void *ptr, size_t len, apr_fresh_state *st)
{
    (void)ptr;
    (void)len;
    (void)st;
    return 0;
}
int apr_small_pages_overlap(const void *ptr, size_t len)
{
    (void)ptr;
    (void)len;
    return 0; /* no page-size choice is made here */
}
#else
/* Whether fresh huge pages proved slow in this process: -1 not tried yet, 0 no, 1 yes.
 * Read and written atomically (allocations come from any thread, the GIL may be absent). */
static int huge_pages_slow = -1;
/* Populated and timed this much at a time; slow is over HUGE_SLOW_NS per huge page. */
#define HUGE_STEP ((size_t)32 << 20)
#define HUGE_SLOW_NS 1000000LL
/* Huge pages are given up only after this many bytes of them in a row populated
 * slowly.  Why: pio.c and uring.c populate 2 MiB at a time, racing the reads on few
 * cores, and a single step is often preempted.  Measured on the development VM (2
 * cores, cold 504 MiB direct loads): huge steps averaged 0.15-0.29 ms against 0.7 ms
 * for 2 MiB of 4 KiB pages, yet 2-4 single steps of ~140 took over 1 ms, and each moved
 * the next 256 MiB to 4 KiB pages.  That cost twice: the slower pages, and direct reads
 * into them split into requests under 1 MiB (a request holds at most max_segments
 * pages), against 4 MiB into huge pages, so the load took 290-320 ms instead of 160 ms
 * (docs/performance.md, "Huge pages and direct reads").  Memory the host really took
 * back is slow on every page (1.9-3.8 ms each), so two in a row still catch it. */
#define HUGE_SLOW_CONFIRM ((size_t)4 << 20)
static unsigned huge_page_allocations;

/* Live blocks populated (in part) with 4 KiB pages (apr_fresh_finish), until unmapped:
 * direct reads into them are staged (uring.c).  Few: one per load that met slow huge
 * pages; a full table forgets (those reads go straight into the pages, as before). */
#define SMALL_SLOTS 64
static struct {
    uint8_t *lo, *hi;
} small_blocks[SMALL_SLOTS];
static pthread_mutex_t small_lock = PTHREAD_MUTEX_INITIALIZER;
static int small_count; /* atomic: the common case (none) takes no lock */

static void small_register(uint8_t *lo, uint8_t *hi)
{
    pthread_mutex_lock(&small_lock);
    int free_slot = -1;
    for (int i = 0; i < SMALL_SLOTS; i++) {
        if (small_blocks[i].lo && small_blocks[i].lo < hi && small_blocks[i].hi > lo) {
            /* a span of the same block again (a later read of it): widen it */
            if (lo < small_blocks[i].lo)
                small_blocks[i].lo = lo;
            if (hi > small_blocks[i].hi)
                small_blocks[i].hi = hi;
            free_slot = -2;
            break;
        }
        if (!small_blocks[i].lo && free_slot == -1)
            free_slot = i;
    }
    if (free_slot >= 0) {
        small_blocks[free_slot].lo = lo;
        small_blocks[free_slot].hi = hi;
        __atomic_add_fetch(&small_count, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&small_lock);
}

/* Every span inside [lo, hi): the block is being unmapped. */
static void small_unregister(uint8_t *lo, uint8_t *hi)
{
    if (!__atomic_load_n(&small_count, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&small_lock);
    for (int i = 0; i < SMALL_SLOTS; i++)
        if (small_blocks[i].lo && small_blocks[i].lo < hi && small_blocks[i].hi > lo) {
            small_blocks[i].lo = small_blocks[i].hi = NULL;
            __atomic_sub_fetch(&small_count, 1, __ATOMIC_RELEASE);
        }
    pthread_mutex_unlock(&small_lock);
}

int apr_small_pages_overlap(const void *ptr, size_t len)
{
    if (!__atomic_load_n(&small_count, __ATOMIC_ACQUIRE) || len == 0)
        return 0;
    const uint8_t *lo = ptr, *hi = (const uint8_t *)ptr + len;
    int found = 0;
    pthread_mutex_lock(&small_lock);
    for (int i = 0; i < SMALL_SLOTS && !found; i++)
        found = small_blocks[i].lo && small_blocks[i].lo < hi && small_blocks[i].hi > lo;
    pthread_mutex_unlock(&small_lock);
    return found;
}

#if defined(__linux__)
static long long monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
#endif

/* Huge pages where they are cheap, then every page faulted in with one call.
 *
 * A 2 MiB page takes ~0.1 ms to fault in and clear on bare metal, against 512 faults
 * of 4 KiB pages.  But a hypervisor that takes back the guest's free memory (virtio
 * balloon free page reporting, as on the development VM) hands out huge pages that
 * are no longer backed on the host: each then costs 512 host faults, and a fresh
 * process's 504 MiB load took 2-2.7 s with huge pages against 0.3-0.6 s with 4 KiB
 * pages, which come from the low-order free lists the hypervisor leaves alone.  So a
 * block is populated 32 MiB at a time and timed: above 1 ms per huge page, the block
 * goes on in 4 KiB pages while they measure cheaper, trying one huge-page step again
 * after 8, 16, 32, ... steps (memory freed a moment ago is cheap again); the following
 * small blocks start with 4 KiB pages (huge pages are tried again every 64th block,
 * and blocks of 256 MiB and more always start with a huge-page step).  A false alarm
 * under load costs only the huge-page gain.
 *
 * Populating (MADV_POPULATE_WRITE, Linux 5.14+; older kernels refuse it and pages
 * fault in as they are written) is done here because every caller fills what it
 * maps: one call instead of a fault per page (0.29 s against 0.35-0.58 s above). */
#if defined(MADV_HUGEPAGE) && defined(__linux__)
/* What populating fresh destinations cost in this process, per page size: bytes and
 * the populating threads' time (apr_fresh_stats).  Why kept: a cold load into memory
 * the host took back pays this (about half of what it took over fio's read in one
 * 4 GiB round), and the benchmark reports the mix each load got (docs/performance.md,
 * stop 39). */
static unsigned long long fresh_stat[4]; /* huge bytes, huge ns, 4 KiB bytes, 4 KiB ns */

void apr_fresh_stats(unsigned long long out[4], int reset)
{
    for (int i = 0; i < 4; i++)
        out[i] = reset ? __atomic_exchange_n(&fresh_stat[i], 0ull, __ATOMIC_RELAXED)
                       : __atomic_load_n(&fresh_stat[i], __ATOMIC_RELAXED);
}

/* Blocks this large always start with a huge-page step whatever earlier blocks found:
 * a slow first step costs at most a few percent of the block, while 4 KiB pages where
 * huge ones were cheap (memory another buffer freed a moment ago) cost 2-4x (a 4 GiB
 * load in a loop: 3.5 s against 0.9 s). */
#define HUGE_ALWAYS_PROBE ((size_t)256 << 20)
/* In a block that went over to 4 KiB pages, one huge-page step is timed again after
 * this many bytes, then after twice as many each time it is still slow: the free
 * memory can change from cold to recently freed mid-block. */
#define HUGE_RETRY_BYTES ((size_t)256 << 20)
/* When 4 KiB pages prove dearer than slow huge pages (both cold: free memory the host
 * took back, where a 2 MiB step costs 4.5 ms in huge pages and 5.5 ms in 4 KiB ones
 * on the development VM), huge pages are kept for this many bytes however slow, then
 * twice as many each time 4 KiB pages prove dearer again.  Why: without it the choice
 * went huge, huge, 4 KiB, huge, huge, 4 KiB ... (two slow huge steps moved it to 4 KiB
 * pages, one dear 4 KiB step moved it back), a third of the steps in the dearer pages,
 * logged over a 4 GiB load that met the host's cold memory (docs/performance.md,
 * "Fresh memory on a VM that reports free pages"). */
#define SMALL_HOLD_BYTES ((size_t)64 << 20)
#define SMALL_HOLD_MAX ((size_t)1 << 30)

void apr_fresh_begin(apr_fresh_state *st, uint8_t *lo, uint8_t *hi)
{
    int slow = __atomic_load_n(&huge_pages_slow, __ATOMIC_RELAXED);
    unsigned n = __atomic_fetch_add(&huge_page_allocations, 1u, __ATOMIC_RELAXED);
    memset(st, 0, sizeof *st);
    st->lo = lo;
    st->hi = hi;
    st->huge = slow != 1 || n % 64 == 0 || (size_t)(hi - lo) >= HUGE_ALWAYS_PROBE;
    st->advised = -1;
    st->retry_after = HUGE_RETRY_BYTES;
}

static void fresh_tally(int huge, size_t bytes, long long ns)
{
    int k = huge ? 0 : 2;
    __atomic_fetch_add(&fresh_stat[k], (unsigned long long)bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&fresh_stat[k + 1], (unsigned long long)(ns > 0 ? ns : 0), __ATOMIC_RELAXED);
}

static void note_step(apr_fresh_state *st, int huge, uint8_t *a, uint8_t *b)
{
    st->last_huge = huge;
    if (huge)
        return;
    if (!st->small_lo || a < st->small_lo)
        st->small_lo = a;
    if (b > st->small_hi)
        st->small_hi = b;
}

/* Populate the pages of [start, start + len) (widened to whole pages, kept inside the
 * block) with the page size the state chooses, timing it and updating the choice.
 * Advice is given only when the choice changes, for the rest of the block. */
void apr_fresh_populate(apr_fresh_state *st, uint8_t *start, size_t len)
{
    uintptr_t page = 4096;
    uintptr_t a = (uintptr_t)start & ~(page - 1), b = ((uintptr_t)start + len + page - 1) & ~(page - 1);
    if (a < (uintptr_t)st->lo)
        a = (uintptr_t)st->lo;
    if (b > (uintptr_t)st->hi)
        b = (uintptr_t)st->hi;
    if (st->unsupported || b <= a)
        return;
    size_t step = (size_t)(b - a);
    if (st->leader) {
        /* another thread's state chooses; this step gets that choice and no timing */
        int follow = __atomic_load_n(&st->leader->huge, __ATOMIC_RELAXED);
        /* Advised already where the leader's advice since its last change covers this
         * step.  Why not advise anyway: advice takes the map's lock for writing, so it
         * waits for the other thread's populating and for the reads' page pinning, both
         * under that lock for reading; advising every step of its own made a cold 4 GiB
         * direct load 1.83-1.91 s against 1.57-1.62 s (docs/performance.md, "Fresh
         * memory on a VM that reports free pages"). */
        uint8_t *from = __atomic_load_n(&st->leader->advised_from, __ATOMIC_ACQUIRE);
        if (!from || (uint8_t *)a < from || __atomic_load_n(&st->leader->advised, __ATOMIC_RELAXED) != follow)
            madvise((void *)a, step, follow ? MADV_HUGEPAGE : MADV_NOHUGEPAGE); /* this step only */
        st->huge = follow;
        long long f0 = monotonic_ns();
        if (madvise((void *)a, step, APR_MADV_POPULATE_WRITE) != 0) {
            st->unsupported = 1;
            return;
        }
        fresh_tally(follow, step, monotonic_ns() - f0);
        note_step(st, follow, (uint8_t *)a, (uint8_t *)b);
        return;
    }
    int huge = st->huge;
    if (st->advised != huge) { /* NOHUGEPAGE because THP "always" would use them anyway */
        madvise((void *)a, (size_t)((uintptr_t)st->hi - a), huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        __atomic_store_n(&st->advised, huge, __ATOMIC_RELAXED);
        __atomic_store_n(&st->advised_from, (uint8_t *)a, __ATOMIC_RELEASE);
    }
    long long t0 = monotonic_ns();
    if (madvise((void *)a, step, APR_MADV_POPULATE_WRITE) != 0) {
        st->unsupported = 1; /* kernel without it: the pages fault in as they are written */
        return;
    }
    long long ns = monotonic_ns() - t0;
    fresh_tally(huge, step, ns);
    note_step(st, huge, (uint8_t *)a, (uint8_t *)b);
    apr_fresh_record(st, huge, step, ns);
}

/* The page-size choice after a step of ``step`` bytes populated with huge pages (or
 * not) took ``ns``; apart from the timing so that tests can drive it
 * (_memory.huge_page_choices). */
void apr_fresh_record(apr_fresh_state *st, int huge, size_t step, long long ns)
{
    /* ns per KiB of the last step of each kind (0: none yet) */
    st->cost[huge] = (ns << 10) / (long long)step + 1;
    if (huge) {
        st->dear_bytes = 0;
        /* Slow is over HUGE_SLOW_NS per huge page: a hypervisor that took the memory
         * back makes each huge page 512 host faults.  Stay on 4 KiB pages only while
         * they measure cheaper than the last huge step. */
        if (st->hold_bytes) {
            st->hold_bytes = st->hold_bytes > step ? st->hold_bytes - step : 0; /* slow or not */
            st->slow_bytes = 0;
        } else if (ns <= (long long)((step + HUGE_PAGE - 1) / HUGE_PAGE) * (st->slow_ns ? st->slow_ns : HUGE_SLOW_NS)) {
            st->slow_bytes = 0;
        } else if ((st->slow_bytes += step) >= HUGE_SLOW_CONFIRM) {
            if (st->small_bytes)
                st->retry_after *= 2; /* a retry that failed: the next one waits twice as long */
            __atomic_store_n(&st->huge, 0, __ATOMIC_RELAXED);
            st->small_bytes = 0;
            st->slow_bytes = 0;
        }
    } else {
        /* 4 KiB pages that cost more than the last huge step, on two steps in a row (one
         * may be preempted): back to huge pages, held (SMALL_HOLD_BYTES) */
        st->dear_bytes = st->cost[1] && st->cost[0] > st->cost[1] ? st->dear_bytes + step : 0;
        if (st->dear_bytes >= HUGE_SLOW_CONFIRM) {
            __atomic_store_n(&st->huge, 1, __ATOMIC_RELAXED);
            st->hold_bytes = st->hold_next ? st->hold_next : SMALL_HOLD_BYTES;
            st->hold_next = st->hold_bytes < SMALL_HOLD_MAX ? 2 * st->hold_bytes : SMALL_HOLD_MAX;
            st->dear_bytes = 0;
            st->small_bytes = 0;
        } else if ((st->small_bytes += step) >= st->retry_after) {
            __atomic_store_n(&st->huge, 1, __ATOMIC_RELAXED); /* try huge pages again: memory freed since may be cheap */
        }
    }
}

/* Replay apr_fresh_record over steps of ``step`` bytes that took ns[0..n) each, from a
 * fresh block's start (huge pages first), writing the page size each step used. */
int apr_fresh_replay(const long long *ns, size_t n, size_t step, long long slow_ns, unsigned char *huge_out)
{
    apr_fresh_state st;
    memset(&st, 0, sizeof st);
    st.huge = 1;
    st.advised = -1;
    st.retry_after = HUGE_RETRY_BYTES;
    st.slow_ns = slow_ns;
    for (size_t i = 0; i < n; i++) {
        int huge = st.huge;
        huge_out[i] = (unsigned char)huge;
        apr_fresh_record(&st, huge, step, ns[i]);
    }
    return 0;
}

void apr_fresh_finish(apr_fresh_state *st)
{
    if (st->small_lo && st->small_hi > st->small_lo)
        small_register(st->small_lo, st->small_hi);
    if (!st->unsupported)
        __atomic_store_n(&huge_pages_slow, !st->huge, __ATOMIC_RELAXED);
}
#endif

static void advise_fresh_block(uint8_t *start, size_t want)
{
#if defined(MADV_HUGEPAGE) && defined(__linux__)
    apr_fresh_state st;
    apr_fresh_begin(&st, start, start + want);
    for (size_t done = 0; done < want && !st.unsupported; done += HUGE_STEP)
        apr_fresh_populate(&st, start + done, want - done < HUGE_STEP ? want - done : HUGE_STEP);
    apr_fresh_finish(&st); /* where populating is unsupported, pages fault in as written, as advised */
#elif defined(MADV_HUGEPAGE)
    madvise(start, want, MADV_HUGEPAGE);
#else
    (void)start;
    (void)want;
#endif
}

/* Blocks from apr_block_alloc_deferred not yet claimed by the read that fills them.
 * Few at a time (one per eager load in flight): a full table populates at once. */
#define FRESH_SLOTS 16
static struct {
    uint8_t *lo, *hi;
} fresh_blocks[FRESH_SLOTS];
static pthread_mutex_t fresh_lock = PTHREAD_MUTEX_INITIALIZER;
/* Blocks registered now: read without the lock, so the reads of every other pread
 * (headers, single tensors) skip the table when it is empty, as it almost always is. */
static int fresh_count;

static int fresh_register(uint8_t *lo, uint8_t *hi)
{
    int done = 0;
    pthread_mutex_lock(&fresh_lock);
    for (int i = 0; i < FRESH_SLOTS && !done; i++)
        if (!fresh_blocks[i].lo) {
            fresh_blocks[i].lo = lo;
            fresh_blocks[i].hi = hi;
            __atomic_add_fetch(&fresh_count, 1, __ATOMIC_RELEASE);
            done = 1;
        }
    pthread_mutex_unlock(&fresh_lock);
    return done;
}

/* Every registration inside [lo, hi): the block's own, or what a partial read of it
 * left registered (apr_fresh_claim). */
static void fresh_unregister(uint8_t *lo, uint8_t *hi)
{
    if (!__atomic_load_n(&fresh_count, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&fresh_lock);
    for (int i = 0; i < FRESH_SLOTS; i++)
        if (fresh_blocks[i].lo && fresh_blocks[i].lo >= lo && fresh_blocks[i].lo < hi) {
            fresh_blocks[i].lo = fresh_blocks[i].hi = NULL;
            __atomic_sub_fetch(&fresh_count, 1, __ATOMIC_RELEASE);
        }
    pthread_mutex_unlock(&fresh_lock);
}

int apr_fresh_claim(const void *ptr, size_t len, apr_fresh_state *st)
{
    uintptr_t p = (uintptr_t)ptr;
    uint8_t *lo = NULL, *hi = NULL;
    if (!__atomic_load_n(&fresh_count, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&fresh_lock);
    for (int i = 0; i < FRESH_SLOTS; i++) {
        uintptr_t a = (uintptr_t)fresh_blocks[i].lo, b = (uintptr_t)fresh_blocks[i].hi;
        /* [p, p + len) inside [a, b): p < b first, so b - p cannot wrap */
        if (a && p >= a && p < b && len <= b - p) {
            lo = fresh_blocks[i].lo;
            hi = fresh_blocks[i].hi;
            if (b - (p + len) >= HUGE_PAGE) {
                /* a read of the first part (backend="direct"'s probe reads a window each
                 * way first): the rest stays registered for the read that fills it */
                fresh_blocks[i].lo = (uint8_t *)(p + len);
            } else {
                fresh_blocks[i].lo = fresh_blocks[i].hi = NULL;
                __atomic_sub_fetch(&fresh_count, 1, __ATOMIC_RELEASE);
            }
            break;
        }
    }
    pthread_mutex_unlock(&fresh_lock);
    if (!lo)
        return 0;
    apr_fresh_begin(st, lo, hi);
    return 1;
}

/* Map size + 2 MiB and unmap the slack on both sides, leaving a region that starts on
 * a huge-page boundary: transparent huge pages only back 2 MiB-aligned ranges. */
static int mapped_alloc(apr_block *block, size_t size, int defer)
{
    if (size > SIZE_MAX - 2 * HUGE_PAGE)
        return ENOMEM; /* rounding up would wrap around */
    size_t want = round_up(size, HUGE_PAGE);
    size_t total = want + HUGE_PAGE;
    uint8_t *raw = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return errno ? errno : ENOMEM;
    uint8_t *start = (uint8_t *)round_up((uintptr_t)raw, HUGE_PAGE);
    size_t head = (size_t)(start - raw);
    size_t tail = total - head - want;
    if (head)
        munmap(raw, head);
    if (tail)
        munmap(start + want, tail);
    if (!(apr_fallbacks() & APR_FALLBACK_MADVISE) && !(defer && fresh_register(start, start + want)))
        advise_fresh_block(start, want);
    block->ptr = start;
    block->base = start;
    block->mapped = want;
    block->capacity = want;
    return 0;
}
#endif

#if !defined(__linux__) || !defined(MADV_HUGEPAGE)
/* Elsewhere nothing is populated ahead: pages fault in as they are written. */
void apr_fresh_begin(apr_fresh_state *st, uint8_t *lo, uint8_t *hi)
{
    memset(st, 0, sizeof *st);
    st->lo = lo;
    st->hi = hi;
}
void apr_fresh_populate(apr_fresh_state *st, uint8_t *start, size_t len)
{
    (void)st;
    (void)start;
    (void)len;
}
void apr_fresh_finish(apr_fresh_state *st) { (void)st; }
void apr_fresh_stats(unsigned long long out[4], int reset)
{
    (void)reset;
    for (int i = 0; i < 4; i++)
        out[i] = 0; /* nothing is populated ahead here */
}
void apr_fresh_record(apr_fresh_state *st, int huge, size_t step, long long ns)
{
    (void)st;
    (void)huge;
    (void)step;
    (void)ns;
}
int apr_fresh_replay(const long long *ns, size_t n, size_t step, long long slow_ns, unsigned char *huge_out)
{
    (void)ns;
    (void)n;
    (void)step;
    (void)slow_ns;
    (void)huge_out;
    return -1; /* no page-size choice is made here */
}
#endif

void apr_fresh_narrow(apr_fresh_state *st, uint8_t *lo, uint8_t *hi)
{
    uintptr_t page = 4096;
    uint8_t *a = (uint8_t *)((uintptr_t)lo & ~(page - 1)), *b = (uint8_t *)(((uintptr_t)hi + page - 1) & ~(page - 1));
    if (a > st->lo)
        st->lo = a;
    if (b < st->hi)
        st->hi = b;
}

void apr_fresh_merge(apr_fresh_state *into, const apr_fresh_state *from)
{
    if (!from->small_lo)
        return;
    if (!into->small_lo || from->small_lo < into->small_lo)
        into->small_lo = from->small_lo;
    if (from->small_hi > into->small_hi)
        into->small_hi = from->small_hi;
}

int apr_huge_pages_state(void)
{
#if defined(_WIN32)
    return -1; /* no huge pages there: see mapped_alloc */
#else
    return __atomic_load_n(&huge_pages_slow, __ATOMIC_RELAXED);
#endif
}

void apr_advise_huge(void *ptr, size_t len)
{
#if !defined(_WIN32) && defined(MADV_HUGEPAGE)
    if (len < APR_MAP_THRESHOLD || (apr_fallbacks() & APR_FALLBACK_MADVISE))
        return;
    uintptr_t lo = round_up((uintptr_t)ptr, HUGE_PAGE);
    uintptr_t hi = ((uintptr_t)ptr + len) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (hi > lo) /* the same choice as for aprfast's own blocks: huge pages where they are cheap */
        advise_fresh_block((uint8_t *)lo, hi - lo);
#else
    (void)ptr;
    (void)len;
#endif
}

static void release(apr_block *block)
{
#if !defined(_WIN32)
    if (block->mapped) {
        small_unregister(block->ptr, block->ptr + block->mapped);
        munmap(block->base, block->mapped);
    } else {
        free(block->base);
    }
#else
    if (block->mapped)
        VirtualFree(block->base, 0, MEM_RELEASE);
    else
        _aligned_free(block->base);
#endif
}

/* --- the cache of freed blocks ------------------------------------------------------
 * A FIFO of slots under one lock (frees come from any thread, and the GIL may be
 * absent: every access to the cache's state below holds it).  Lookups scan at most
 * APR_CACHE_SLOTS entries: trivial beside the page faults they save. */
#if defined(_WIN32)
static SRWLOCK cache_lock = SRWLOCK_INIT;
#define cache_lock_take() AcquireSRWLockExclusive(&cache_lock)
#define cache_lock_give() ReleaseSRWLockExclusive(&cache_lock)
#else
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
#define cache_lock_take() pthread_mutex_lock(&cache_lock)
#define cache_lock_give() pthread_mutex_unlock(&cache_lock)
#endif
static apr_block cache_slot[APR_CACHE_SLOTS];
static size_t cache_count, cache_bytes, cache_resident; /* resident: bytes of blocks not advised */
static size_t cache_heap_bytes; /* bytes of heap blocks (not mapped) */
static long long cache_limit = -1; /* -1: not read from the environment yet */
static long long heap_cap = -1;    /* set by apr_cache_release; -1: heap_default */
static long long heap_default = -1; /* min(RAM / 8, 2 GiB), from cache_limit_init */
static uint64_t cache_hits, cache_misses, cache_seq;

/* Deferred advice (buffers.h): POSIX systems with MADV_FREE and threads. */
#if !defined(_WIN32) && defined(MADV_FREE)
#define APR_DECAY 1
#endif
static long long decay_ms = -1; /* -1: not read from the environment yet */
static int decay_running;       /* the helper thread exists (cache_lock) */
static size_t cache_deferred;   /* bytes of cached blocks with advice due (cache_lock) */

#if !defined(_WIN32)
static int cache_atfork_done;
/* A child forked while another thread held the lock would never see it released. */
static void cache_prepare(void) { pthread_mutex_lock(&cache_lock); }
static void cache_parent(void) { pthread_mutex_unlock(&cache_lock); }
/* The child has no helper thread: the next deferred block starts one there. */
static void cache_child(void)
{
    decay_running = 0;
    pthread_mutex_unlock(&cache_lock);
}
#endif

static long long physical_memory(void)
{
#if defined(_WIN32)
    MEMORYSTATUSEX status;
    status.dwLength = sizeof status;
    return GlobalMemoryStatusEx(&status) ? (long long)status.ullTotalPhys : 0;
#else
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return (pages > 0 && page > 0) ? (long long)pages * page : 0;
#endif
}

static long long default_limit(void)
{
    const char *env = getenv("APRFAST_BUFFER_CACHE");
    if (env && *env) {
        char *end = NULL;
        long long v = strtoll(env, &end, 10);
        if (end && *end == '\0' && v >= 0)
            return v;
    }
    /* A quarter of memory, so that a model loaded again and again (a server swapping
     * checkpoints, an evaluation sweep) gets its freed arena back: with the old cap,
     * min(RAM / 8, 2 GiB), every 4 GiB load populated fresh memory, 0.5-3.2 s on the
     * development VM against 0.27 s into the kept block (stop 41).  What is kept is
     * what the process itself held a moment before, advised away after the decay.
     * Heap blocks keep the old cap (heap_limit). */
    long long physical = physical_memory();
    return physical > 0 ? physical / 4 : (long long)2 << 30;
}

/* The cap on heap blocks (below APR_MAP_THRESHOLD): min(RAM / 8, 2 GiB), and never
 * above the whole cache's.  Why apart: the larger cap is for arenas, mapped blocks that
 * every platform can advise away; Windows cannot advise heap blocks (MEM_RESET applies
 * to VirtualAlloc'ed memory only), so a process that dropped many tensor copies would
 * keep them resident up to the cap. */
static long long default_heap_limit(void)
{
    long long physical = physical_memory();
    long long cap = (long long)2 << 30;
    return physical > 0 && physical / 8 < cap ? physical / 8 : cap;
}

/* Must hold cache_lock, after cache_limit_init. */
static long long heap_limit(void)
{
    long long cap = heap_cap >= 0 ? heap_cap : heap_default;
    return cache_limit < cap ? cache_limit : cap;
}

static long long default_decay(void)
{
    const char *env = getenv("APRFAST_BUFFER_DECAY_MS");
    if (env && *env) {
        char *end = NULL;
        long long v = strtoll(env, &end, 10);
        if (end && *end == '\0' && v >= 0 && v <= 86400000LL)
            return v;
    }
    return APR_CACHE_DECAY_MS;
}

/* Must hold cache_lock. */
static void cache_limit_init(void)
{
    if (cache_limit < 0)
        cache_limit = default_limit();
    if (heap_default < 0)
        heap_default = default_heap_limit();
    if (decay_ms < 0)
        decay_ms = default_decay();
#if !defined(_WIN32)
    if (!cache_atfork_done) {
        pthread_atfork(cache_prepare, cache_parent, cache_child);
        cache_atfork_done = 1;
    }
#endif
}

/* Must hold cache_lock: remove slot i, keeping FIFO order. */
static apr_block cache_take(size_t i)
{
    apr_block b = cache_slot[i];
    memmove(&cache_slot[i], &cache_slot[i + 1], (cache_count - i - 1) * sizeof(apr_block));
    cache_count--;
    cache_bytes -= b.capacity;
    if (!b.mapped)
        cache_heap_bytes -= b.capacity;
    if (!b.advised)
        cache_resident -= b.capacity;
    if (b.due)
        cache_deferred -= b.capacity;
    b.advised = 0;
    b.due = 0;
    return b;
}

/* Must hold cache_lock: publish b in its place by free order (a block taken out to be
 * advised goes back where it was, so "oldest out first" still means oldest freed);
 * 0 if there is no room for it now. */
static int cache_insert(const apr_block *b)
{
    if (cache_count == APR_CACHE_SLOTS || (long long)(cache_bytes + b->capacity) > cache_limit)
        return 0;
    if (!b->mapped && (long long)(cache_heap_bytes + b->capacity) > heap_limit())
        return 0;
    size_t i = cache_count;
    while (i > 0 && cache_slot[i - 1].seq > b->seq)
        i--;
    memmove(&cache_slot[i + 1], &cache_slot[i], (cache_count - i) * sizeof(apr_block));
    cache_slot[i] = *b;
    cache_count++;
    cache_bytes += b->capacity;
    if (!b->mapped)
        cache_heap_bytes += b->capacity;
    if (!b->advised)
        cache_resident += b->capacity;
    if (b->due)
        cache_deferred += b->capacity;
    return 1;
}

/* The cached block that fits size at alignment with the least waste (at most an
 * eighth of size, or 64 KiB, unused), the newest of equal fits, or 0. */
static int cache_get(apr_block *out, size_t size, size_t alignment)
{
    if (size < APR_CACHE_MIN)
        return 0;
    size_t slack = size / 8 > ((size_t)64 << 10) ? size / 8 : ((size_t)64 << 10);
    int found = 0;
    cache_lock_take();
    size_t best = cache_count;
    for (size_t i = 0; i < cache_count; i++) {
        apr_block *b = &cache_slot[i];
        if (b->capacity < size || b->capacity - size > slack || ((uintptr_t)b->ptr & (alignment - 1)))
            continue;
        /* The smallest fit, and among equal fits the most recently freed: it is the
         * block still resident and in the CPU's caches (as glibc hands back its last
         * freed chunk), where the oldest has had its pages advised away. */
        if (best == cache_count || b->capacity <= cache_slot[best].capacity)
            best = i;
    }
    apr_block stale;
    int evict = 0;
    if (best < cache_count) {
        *out = cache_take(best);
        cache_hits++;
        found = 1;
    } else {
        cache_misses++;
        /* Every miss gives back the oldest block: when sizes repeat (a loop of loads or
         * copies) the cache serves them all, and when they do not (a stream of varied
         * tensors) it holds about one block instead of growing to its cap. */
        if (cache_count) {
            stale = cache_take(0);
            evict = 1;
        }
    }
    cache_lock_give();
    if (evict)
        release(&stale);
    return found;
}

/* Lazily free a block's whole pages: kept mapped, reclaimable by the kernel.
 * POSIX: MADV_FREE.  Windows: MEM_RESET, which only applies to VirtualAlloc'ed
 * memory, so heap blocks stay resident there (bounded by the cache's cap). */
static void lazy_free(apr_block *b)
{
    if (apr_fallbacks() & APR_FALLBACK_MADVISE)
        return;
#if defined(_WIN32)
    if (b->mapped)
        VirtualAlloc(b->ptr, b->capacity, MEM_RESET, PAGE_READWRITE); /* advisory */
#elif defined(MADV_FREE)
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)b->ptr + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)b->ptr + b->capacity) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_FREE); /* advisory: failure keeps the pages */
#else
    (void)b;
#endif
}

#if defined(APR_DECAY)
static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Advise the cached blocks whose advice is due (every deferred one if all), a batch at
 * a time: each is taken out of the cache first, advised, and put back where it was,
 * because advice given to a block another thread has taken would discard what that
 * thread writes.  Returns when the next deferred block is due (ns), 0 if none waits. */
static long long decay_pass(int all)
{
    for (;;) {
        apr_block batch[16], rejected[16];
        size_t n = 0, n_rejected = 0;
        long long now = now_ns(), next = 0;
        cache_lock_take();
        for (size_t i = 0; i < cache_count;) {
            const apr_block *b = &cache_slot[i];
            if (b->due && (all || b->due <= now) && n < sizeof batch / sizeof batch[0]) {
                batch[n++] = cache_take(i);
                continue;
            }
            if (b->due && (!next || b->due < next))
                next = b->due;
            i++;
        }
        cache_lock_give();
        if (n == 0)
            return next;
        for (size_t k = 0; k < n; k++) {
            lazy_free(&batch[k]);
            batch[k].advised = 1;
        }
        cache_lock_take();
        for (size_t k = 0; k < n; k++)
            if (!cache_insert(&batch[k]))
                rejected[n_rejected++] = batch[k];
        cache_lock_give();
        for (size_t k = 0; k < n_rejected; k++)
            release(&rejected[k]);
    }
}

/* The helper thread: sleeps until the oldest deferred block is due, advises what is
 * due, and ends when no block waits (a later deferred block starts another). */
static void *decay_main(void *arg)
{
    (void)arg;
    for (;;) {
        long long next = decay_pass(0);
        if (!next) {
            cache_lock_take();
            if (!cache_deferred) {
                decay_running = 0;
                cache_lock_give();
                return NULL;
            }
            cache_lock_give();
            continue;
        }
        long long wait = next - now_ns();
        if (wait > 0) {
            struct timespec t = {(time_t)(wait / 1000000000LL), (long)(wait % 1000000000LL)};
            while (nanosleep(&t, &t) != 0 && errno == EINTR) {
            }
        }
    }
}

/* 1 if the helper thread started.  It takes no signals: Python handles them on its
 * main thread, and a signal delivered here would wait for the next check there. */
static int decay_start(void)
{
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, old;
    if (pthread_attr_init(&attr) != 0)
        return 0;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, (size_t)256 << 10);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&thread, &attr, decay_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return rc == 0;
}
#endif

/* Keep a freed block; 1 if taken, 0 if the caller must release it. */
static int cache_put(apr_block *block)
{
    if (block->capacity < APR_CACHE_MIN)
        return 0;
    apr_block evicted[8];
    size_t n_evicted = 0;
    int kept = 0, start = 0;
    /* Decide on the advice first and give it before the block is published below (see
     * buffers.h).  The resident total may change in between: it is a soft bound. */
    cache_lock_take();
    cache_limit_init();
    int advise = block->mapped != 0 || cache_resident + block->capacity > APR_CACHE_RESIDENT;
    long long limit = block->mapped ? cache_limit : heap_limit();
    int worth = (long long)block->capacity <= limit;
    long long delay = decay_ms;
    cache_lock_give();
    if (!worth)
        return 0;
    block->due = 0;
#if defined(APR_DECAY)
    if (advise && delay > 0 && !(apr_fallbacks() & APR_FALLBACK_MADVISE)) {
        advise = 0;
        block->due = now_ns() + delay * 1000000LL;
    }
#endif
    if (advise)
        lazy_free(block);
    block->advised = advise;
    cache_lock_take();
    limit = block->mapped ? cache_limit : heap_limit(); /* release_buffer_cache may have moved it */
    if ((long long)block->capacity <= limit) {
        /* Oldest first out until it fits (at most a few per call; the rest next time):
         * the oldest heap block where only the heap cap is short, else the oldest. */
        for (;;) {
            int full = cache_count == APR_CACHE_SLOTS || (long long)(cache_bytes + block->capacity) > cache_limit;
            int heap_full = !block->mapped && (long long)(cache_heap_bytes + block->capacity) > limit;
            if (!cache_count || (!full && !heap_full) || n_evicted == sizeof evicted / sizeof evicted[0])
                break;
            size_t victim = 0;
            if (!full)
                while (victim < cache_count && cache_slot[victim].mapped)
                    victim++;
            if (victim == cache_count)
                break; /* unreachable: heap bytes over the cap means a heap block is held */
            evicted[n_evicted++] = cache_take(victim);
        }
        block->seq = ++cache_seq;
        kept = cache_insert(block);
        if (kept && block->due && !decay_running)
            start = decay_running = 1;
    }
    cache_lock_give();
    for (size_t i = 0; i < n_evicted; i++)
        release(&evicted[i]);
#if !defined(APR_DECAY)
    (void)start;
    (void)delay;
#else
    if (start && !decay_start()) {
        /* No thread (a process at its limit): advise everything waiting now, as before. */
        cache_lock_take();
        decay_running = 0;
        cache_lock_give();
        decay_pass(1);
    }
#endif
    return kept;
}

void apr_cache_set_decay(long long ms)
{
    cache_lock_take();
    cache_limit_init();
    decay_ms = ms < 0 ? 0 : ms;
    cache_lock_give();
}

void apr_cache_stats_get(apr_cache_stats *out)
{
    cache_lock_take();
    cache_limit_init();
    out->blocks = cache_count;
    out->bytes = cache_bytes;
    out->resident = cache_resident;
    out->limit = (size_t)cache_limit;
    out->heap_bytes = cache_heap_bytes;
    out->heap_limit = (size_t)heap_limit();
    out->hits = cache_hits;
    out->misses = cache_misses;
    out->deferred = cache_deferred;
    out->decay_ms = decay_ms;
    cache_lock_give();
}

void apr_cache_release(long long limit, long long heap)
{
    for (;;) {
        apr_block b;
        int have = 0;
        cache_lock_take();
        cache_limit_init();
        if (limit >= 0)
            cache_limit = limit;
        if (heap >= 0)
            heap_cap = heap;
        limit = heap = -1;
        if (cache_count) {
            b = cache_take(cache_count - 1);
            have = 1;
        }
        cache_lock_give();
        if (!have)
            return;
        release(&b);
    }
}

static int block_alloc(apr_block *block, size_t size, size_t alignment, int defer)
{
    memset(block, 0, sizeof *block);
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > 4096)
        return EINVAL;
    if (cache_get(block, size, alignment))
        return 0;
    if (size >= APR_MAP_THRESHOLD)
        return mapped_alloc(block, size, defer);
    return heap_alloc(block, size, alignment);
}

int apr_block_alloc(apr_block *block, size_t size, size_t alignment)
{
    return block_alloc(block, size, alignment, 0);
}

int apr_block_alloc_deferred(apr_block *block, size_t size, size_t alignment)
{
    return block_alloc(block, size, alignment, 1);
}

void apr_block_free(apr_block *block)
{
    if (!block->base)
        return;
    if (block->mapped)
        fresh_unregister(block->ptr, block->ptr + block->mapped); /* freed before a read claimed it (all or part) */
    if (!cache_put(block))
        release(block);
    memset(block, 0, sizeof *block);
}
