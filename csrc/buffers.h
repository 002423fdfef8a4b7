/* Aligned allocation for tensor buffers.
 *
 * Large buffers come from anonymous mmap trimmed to a 2 MiB boundary and marked
 * MADV_HUGEPAGE, so a 512 MiB load takes ~256 page faults instead of ~131072.
 * Small buffers use posix_memalign.  No Python API here. */
#ifndef APRFAST_BUFFERS_H
#define APRFAST_BUFFERS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint8_t *ptr;     /* aligned start handed to the caller */
    void *base;       /* what must be released */
    size_t mapped;    /* bytes mapped at base, or 0 if base came from the heap */
} apr_block;

/* Threshold above which buffers are mapped (and may use huge pages).  Below it the
 * heap serves them: glibc raises its own mmap threshold up to 32 MiB as mapped chunks
 * are freed, so repeated copies of the same size reuse touched memory instead of
 * mapping, faulting in and zeroing fresh pages on every call (a 2.25 MiB copy cost
 * 5x safetensors' that way).  Above it every allocator maps fresh pages, and 2 MiB
 * huge pages make that first touch cheaper. */
#define APR_MAP_THRESHOLD ((size_t)32 << 20)

/* 0 on success, or an errno value.  alignment must be a power of two <= 4096. */
int apr_block_alloc(apr_block *block, size_t size, size_t alignment);
void apr_block_free(apr_block *block);

#ifdef __cplusplus
}
#endif
#endif
