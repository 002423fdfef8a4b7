/* Aligned allocation for tensor buffers.
 *
 * Large buffers come from anonymous mmap trimmed to a 2 MiB boundary and marked
 * MADV_HUGEPAGE, so a 512 MiB load takes ~256 page faults instead of ~131072.
 * Small buffers use posix_memalign.  Windows: VirtualAlloc (2 MiB aligned, no large
 * pages) and _aligned_malloc; cached pages get MEM_RESET instead of MADV_FREE (mapped
 * blocks only).  No Python API here. */
#ifndef APRFAST_BUFFERS_H
#define APRFAST_BUFFERS_H

#include <stddef.h>
#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
/* Populating pages ahead (Linux 5.14+; buffers.c and uring.c fall back where the
 * kernel refuses it). */
#ifdef MADV_POPULATE_WRITE
#define APR_MADV_POPULATE_WRITE MADV_POPULATE_WRITE
#else
#define APR_MADV_POPULATE_WRITE 23 /* <linux/mman.h>: older libc headers lack it */
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint8_t *ptr;     /* aligned start handed to the caller */
    void *base;       /* what must be released */
    size_t mapped;    /* bytes mapped at base, or 0 if base came from the heap */
    size_t capacity;  /* usable bytes from ptr (>= the size asked for) */
    int advised;      /* in the cache: its pages were given MADV_FREE (buffers.c) */
    long long due;    /* in the cache: when its deferred advice is due (monotonic ns), or 0 */
    uint64_t seq;     /* in the cache: the order it was freed in */
} apr_block;

/* Threshold above which buffers are mapped (and may use huge pages).  Below it the
 * heap serves them: glibc raises its own mmap threshold up to 32 MiB as mapped chunks
 * are freed, so repeated copies of the same size reuse touched memory instead of
 * mapping, faulting in and zeroing fresh pages on every call (a 2.25 MiB copy cost
 * 5x safetensors' that way).  Above it every allocator maps fresh pages, and 2 MiB
 * huge pages make that first touch cheaper. */
#define APR_MAP_THRESHOLD ((size_t)32 << 20)

/* Whether fresh huge pages proved slow in this process (buffers.c): -1 not tried yet
 * (or no huge pages on this platform), 0 no, 1 yes (4 KiB pages are used instead). */
int apr_huge_pages_state(void);

/* 0 on success, or an errno value.  alignment must be a power of two <= 4096.
 * The contents are not initialised (a reused block holds old bytes). */
int apr_block_alloc(apr_block *block, size_t size, size_t alignment);

/* The same, for a block that apr_pread_exact will fill whole: a freshly mapped one is
 * left unpopulated and registered, and the read that fills it populates each step just
 * before reading into it (apr_fresh_claim), so each freshly cleared huge page is still
 * in cache when the read writes it (the kernel's own order when a read faults pages
 * in) instead of the whole block being cleared first and written again after. */
int apr_block_alloc_deferred(apr_block *block, size_t size, size_t alignment);

/* The choice of page size while populating fresh memory step by step (buffers.c):
 * huge pages where they prove cheap, else 4 KiB pages, retried as memory changes. */
typedef struct apr_fresh_state {
    uint8_t *lo, *hi;    /* the block: populating never leaves it */
    int huge;            /* the page size of the next step */
    int advised;         /* the advice in force from the last step on (-1: none) */
    uint8_t *advised_from; /* ... from this address to the block's end (NULL: none yet) */
    int unsupported;     /* the kernel cannot populate: pages fault in as written */
    long long cost[2];   /* ns per KiB of the last step with 4 KiB / huge pages */
    size_t small_bytes;  /* populated with 4 KiB pages since the last huge step */
    size_t retry_after;  /* try a huge step again after this many such bytes */
    size_t slow_bytes;   /* huge-page bytes in a row that populated slowly */
    size_t dear_bytes;   /* 4 KiB-page bytes in a row that cost more than the last huge step */
    size_t hold_bytes;   /* huge-page bytes still kept however slow (4 KiB pages proved dearer) */
    size_t hold_next;    /* the hold after the next time 4 KiB pages prove dearer (0: the first) */
    /* Another thread's state populating the same block, whose page size this one
     * takes, with no timing or choice of its own (uring.c's calling thread follows
     * its helper): NULL for none. */
    const struct apr_fresh_state *leader;
    /* A huge page that takes longer than this to populate is slow (0: buffers.c's
     * HUGE_SLOW_NS); destinations of direct reads use APR_HUGE_SLOW_DIRECT_NS. */
    long long slow_ns;
    int last_huge;       /* whether the last step populated used huge pages */
    /* The span of the steps populated with 4 KiB pages (NULL: none): apr_fresh_finish
     * records it (apr_small_pages_overlap), since direct reads into those pages are
     * split into small requests (APR_HUGE_SLOW_DIRECT_NS) and are better staged. */
    uint8_t *small_lo, *small_hi;
} apr_fresh_state;

/* The slow mark for huge pages of a direct read's destination (apr_fresh_state.slow_ns).
 * Why higher than for other memory: a direct read into 4 KiB pages is split into
 * requests of at most the device's max_segments pages (254 pages, under 1 MiB, on the
 * development VM's virtio disk) where one into huge pages goes up to max_sectors_kb
 * (4 MiB there), and a cold 504 MiB direct read took 356 ms into 4 KiB pages against
 * 143 ms into huge pages: 0.8 ms of reading per 2 MiB, so huge pages are worth up to
 * that much more populating time (measured: 0.15-0.3 ms each, 4 KiB pages 0.7 ms per
 * 2 MiB, memory the host took back 1.9-3.8 ms). */
#define APR_HUGE_SLOW_DIRECT_NS 2500000LL

void apr_fresh_begin(apr_fresh_state *st, uint8_t *lo, uint8_t *hi);
void apr_fresh_populate(apr_fresh_state *st, uint8_t *start, size_t len);
void apr_fresh_finish(apr_fresh_state *st);
/* Update st's choice after a step of ``step`` bytes, with huge pages or not, took ``ns``
 * to populate (apr_fresh_populate times its steps and calls it; tests drive it). */
void apr_fresh_record(apr_fresh_state *st, int huge, size_t step, long long ns);
/* Keep st's populating and advice inside [lo, hi) (widened to whole 4 KiB pages, kept
 * inside its block): a thread populating its own share of a block with a state of its
 * own, so that its choice of page size never advises another thread's share. */
void apr_fresh_narrow(apr_fresh_state *st, uint8_t *lo, uint8_t *hi);
/* Fold ``from``'s span of 4 KiB-page steps into ``into`` (several threads populated
 * one block, each with a state of its own; the one finished records the union). */
void apr_fresh_merge(apr_fresh_state *into, const apr_fresh_state *from);
/* Whether [ptr, ptr + len) overlaps memory of a live block populated (in part) with
 * 4 KiB pages: what apr_fresh_finish recorded, until the block is unmapped. */
int apr_small_pages_overlap(const void *ptr, size_t len);
/* Bytes and nanoseconds of populating fresh destinations in this process so far:
 * out[0], out[1] with huge pages, out[2], out[3] with 4 KiB pages (summed over the
 * populating threads); reset: start counting again from zero.  All zero where no
 * page-size choice is made. */
void apr_fresh_stats(unsigned long long out[4], int reset);
/* Replay the choice over n steps of ``step`` bytes that took ns[i] each, from a fresh
 * block's start; huge_out[i]: whether step i used huge pages.  -1 where no choice is
 * made (no MADV_HUGEPAGE). */
int apr_fresh_replay(const long long *ns, size_t n, size_t step, long long slow_ns, unsigned char *huge_out);

/* If [ptr, ptr + len) lies in a block registered by apr_block_alloc_deferred, take the
 * registration (only one caller gets it), begin *st over the block and return 1. */
int apr_fresh_claim(const void *ptr, size_t len, apr_fresh_state *st);
void apr_block_free(apr_block *block);

/* Advise transparent huge pages for the whole 2 MiB-aligned pages inside [ptr,
 * ptr + len), memory the caller allocated elsewhere and has not touched yet (e.g. a
 * fresh bytes object about to be filled by a read): its first touch then takes one
 * fault per 2 MiB instead of one per 4 KiB.  Only for len >= APR_MAP_THRESHOLD, where
 * the allocators map a block of its own (glibc's dynamic mmap threshold stops at
 * 32 MiB), so the advice never lands on heap pages shared with other objects; a no-op
 * below it, off Linux-like systems, and with APR_FALLBACK_MADVISE set.  The pages are
 * populated at once, with huge pages only where fresh ones proved cheap, exactly as
 * for aprfast's own mapped blocks (buffers.c advise_fresh_block). */
void apr_advise_huge(void *ptr, size_t len);

/* Freed blocks of at least APR_CACHE_MIN bytes are kept for reuse, up to a total that
 * defaults to a quarter of physical memory and is set by the environment variable
 * APRFAST_BUFFER_CACHE (bytes; 0 disables) when the first block is freed; heap blocks
 * (below APR_MAP_THRESHOLD) are kept up to min(that, physical memory / 8, 2 GiB).  Why: a
 * loop that loads or copies tensors of the same sizes would otherwise map, fault in
 * and zero fresh pages on every call (about 0.8 ms per MiB on the development VM),
 * while glibc hands the peers' freed blocks straight back to them.  Mapped blocks
 * (huge pages) and heap blocks beyond APR_CACHE_RESIDENT bytes are given MADV_FREE, so
 * the kernel may reclaim them under memory pressure (a later reuse then faults in zero
 * pages) and otherwise reuses them without a fault.  Heap blocks up to that total stay
 * resident as glibc keeps its own freed chunks: MADV_FREE walks and flushes every 4 KiB
 * page table entry, which cost a 2.5 MiB copy 70 us on top of its 60 us memcpy.  The
 * advice is given before a block is published in the cache, never after: another
 * thread may take it at once, and advice given after its writes would discard them.
 * Each cacheable allocation the cache cannot serve releases its oldest block, so a
 * workload whose sizes do not repeat (a stream) holds about one block, not the cap. */
#define APR_CACHE_MIN ((size_t)256 << 10)
#define APR_CACHE_SLOTS 1024
#define APR_CACHE_RESIDENT ((size_t)256 << 20)

/* The advice those blocks get is deferred, not given as they are freed: a block freed
 * and not taken again within APRFAST_BUFFER_DECAY_MS milliseconds (default below; 0
 * gives the advice at once, as before) is advised then by a helper thread that exists
 * only while such blocks wait.  Why: giving MADV_FREE to a 600 MiB block of 4 KiB
 * pages (the pages a hypervisor that reclaims huge pages leaves, buffers.c) costs
 * 13 ms as it is freed and 40 ms more as it is written again (the dirty bits are set
 * back one page at a time), which tripled a loop of dequantize calls (23 -> 75 ms) and
 * cost warm loads a third.  10 s is jemalloc's default dirty-page decay
 * (opt.dirty_decay_ms), the policy of a well-kept allocator that trades the same way:
 * memory freed and wanted again soon stays in place, memory not wanted goes back to
 * the kernel soon after.  Bounded by the cache's cap (a quarter of physical memory by
 * default); release_buffer_cache() gives it back at once.  Windows gives
 * MEM_RESET at once, as before. */
#define APR_CACHE_DECAY_MS 10000

typedef struct {
    size_t blocks;    /* blocks held */
    size_t bytes;     /* their capacity */
    size_t resident;  /* of which in blocks not given MADV_FREE */
    size_t limit;     /* the cap on bytes */
    size_t heap_bytes; /* of which in heap blocks (below APR_MAP_THRESHOLD) */
    size_t heap_limit; /* the cap on those: min(limit, physical memory / 8, 2 GiB) by default */
    uint64_t hits;    /* allocations served from the cache */
    uint64_t misses;  /* cacheable allocations that were not */
    size_t deferred;  /* bytes of resident blocks whose advice is deferred */
    long long decay_ms; /* how long advice is deferred (0: given at once) */
} apr_cache_stats;

void apr_cache_stats_get(apr_cache_stats *out);
/* Release every cached block; set the cap (bytes) if limit >= 0, and the cap on heap
 * blocks if heap >= 0 (never above the cap: the smaller of the two holds). */
void apr_cache_release(long long limit, long long heap);
/* Set how long advice is deferred (ms; 0 advises at once); blocks already waiting
 * keep their due time. */
void apr_cache_set_decay(long long ms);

#ifdef __cplusplus
}
#endif
#endif
