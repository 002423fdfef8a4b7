/* A Windows smoke test of csrc/pio.c and csrc/buffers.c: positional reads (one and
 * several threads, with CRC), end of file, preallocation, aligned and mapped buffers
 * through the freed-block cache, and direct reads (apr_pread_direct) of a handle opened
 * with FILE_FLAG_NO_BUFFERING, as aprfast.io.direct opens it.  Built with MinGW and run under Wine by
 * tests/windows/run.sh; prints "ok" and exits 0 when everything holds. */
#include <errno.h>
#include <fcntl.h>
#include <io.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#define WIN32_LEAN_AND_MEAN
#include <windows.h>

#include "buffers.h"
#include "crc32.h"
#include "pio.h"

#define SIZE ((size_t)20 << 20) /* past PARALLEL_MIN: the read is split over threads */

static int failures;
#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            printf("FAILED line %d: %s\n", __LINE__, #cond);                \
            failures++;                                                     \
        }                                                                   \
    } while (0)

int main(void)
{
    const char *path = "pio_check.bin";
    uint8_t *data = malloc(SIZE), *back = malloc(SIZE);
    for (size_t i = 0; i < SIZE; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 13);
    int fd = _open(path, _O_CREAT | _O_TRUNC | _O_RDWR | _O_BINARY, _S_IREAD | _S_IWRITE);
    CHECK(fd >= 0);
    int rc = apr_preallocate(fd, SIZE);
    printf("preallocate: %s\n", rc == 0 ? "reserved" : strerror(rc));
    CHECK(rc == 0 || rc == ENOSYS); /* Wine may not implement FileAllocationInfo */
    CHECK(_write(fd, data, (unsigned)SIZE) == (int)SIZE);

    uint32_t want = apr_crc32(0, data + 7, SIZE - 7), got = 0;
    memset(back, 0, SIZE);
    CHECK(apr_pread_exact(fd, back, 7, SIZE - 7, 4, &got) == 0);
    CHECK(memcmp(back, data + 7, SIZE - 7) == 0 && got == want);
    CHECK(apr_pread_exact(fd, back, 100, 1000, 1, NULL) == 0 && memcmp(back, data + 100, 1000) == 0);
    CHECK(apr_pread_exact(fd, back, SIZE - 10, 20, 1, NULL) == -1); /* the file ends first */
    size_t n = 99;
    CHECK(apr_pread_some(fd, back, SIZE - 5, 100, &n) == 0 && n == 5);
    CHECK(apr_pread_some(fd, back, SIZE, 100, &n) == 0 && n == 0);
    _close(fd);
    CHECK(apr_pread_exact(fd, back, 0, 10, 1, NULL) != 0); /* a closed descriptor is an error */

    /* direct reads: unaligned offset, length and buffer, with CRC, several threads */
    HANDLE h = CreateFileA(path, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                           OPEN_EXISTING, FILE_FLAG_NO_BUFFERING | FILE_FLAG_SEQUENTIAL_SCAN, NULL);
    CHECK(h != INVALID_HANDLE_VALUE);
    int dfd = _open_osfhandle((intptr_t)h, _O_RDONLY | _O_BINARY);
    CHECK(dfd >= 0);
    memset(back, 0, SIZE);
    got = 0;
    want = apr_crc32(0, data + 7, SIZE - 10);
    CHECK(apr_pread_direct(dfd, back + 3, 7, SIZE - 10, 4, &got, 4096) == 0);
    CHECK(memcmp(back + 3, data + 7, SIZE - 10) == 0 && got == want);
    CHECK(apr_pread_direct(dfd, back, 8192, 4096, 1, NULL, 4096) == 0 && memcmp(back, data + 8192, 4096) == 0);
    CHECK(apr_pread_direct(dfd, back, SIZE - 10, 20, 1, NULL, 4096) == -1); /* the file ends first */
    _close(dfd);

    size_t sizes[] = {100, (size_t)300 << 10, (size_t)40 << 20};
    for (int k = 0; k < 3; k++) {
        for (int round = 0; round < 3; round++) { /* the same size again: served by the cache */
            apr_block b;
            CHECK(apr_block_alloc(&b, sizes[k], 4096) == 0);
            CHECK(((uintptr_t)b.ptr & 4095) == 0 && b.capacity >= sizes[k]);
            CHECK((sizes[k] >= APR_MAP_THRESHOLD) == (b.mapped != 0));
            memset(b.ptr, 0x5a, sizes[k]);
            CHECK(b.ptr[sizes[k] - 1] == 0x5a);
            apr_block_free(&b);
        }
    }
    apr_cache_stats stats;
    apr_cache_stats_get(&stats);
    CHECK(stats.hits == 4 && stats.blocks == 1);
    apr_cache_release(-1);
    apr_cache_stats_get(&stats);
    CHECK(stats.blocks == 0);
    CHECK(apr_default_threads() >= 1);
    remove(path);
    free(data);
    free(back);
    printf(failures ? "%d failures\n" : "ok\n", failures);
    return failures != 0;
}
