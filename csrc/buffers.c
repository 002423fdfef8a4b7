#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "buffers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <malloc.h>
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

#define HUGE_PAGE ((size_t)1 << 21)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

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
#endif
    block->ptr = p;
    block->base = p;
    block->mapped = 0;
    return 0;
}

#if !defined(_WIN32)
/* Map size + 2 MiB and unmap the slack on both sides, leaving a region that starts on
 * a huge-page boundary: transparent huge pages only back 2 MiB-aligned ranges. */
static int mapped_alloc(apr_block *block, size_t size)
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
#ifdef MADV_HUGEPAGE
    madvise(start, want, MADV_HUGEPAGE); /* advisory: failure just means 4 KiB pages */
#endif
    block->ptr = start;
    block->base = start;
    block->mapped = want;
    return 0;
}
#endif

int apr_block_alloc(apr_block *block, size_t size, size_t alignment)
{
    memset(block, 0, sizeof *block);
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > 4096)
        return EINVAL;
#if !defined(_WIN32)
    if (size >= APR_MAP_THRESHOLD)
        return mapped_alloc(block, size);
#endif
    return heap_alloc(block, size, alignment);
}

void apr_block_free(apr_block *block)
{
    if (!block->base)
        return;
#if !defined(_WIN32)
    if (block->mapped)
        munmap(block->base, block->mapped);
    else
        free(block->base);
#else
    _aligned_free(block->base);
#endif
    memset(block, 0, sizeof *block);
}
