/* Run a piece of work on each of n pieces, one thread a piece: pthreads on
 * POSIX, Win32 threads (CreateThread) on _WIN32.
 *
 * Header-only: every function is static inline. */
#ifndef APR_PARALLEL_H
#define APR_PARALLEL_H

#include <stddef.h>

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#define APR_HAVE_THREADS 1
#else
#include <pthread.h>
#include <unistd.h>
#define APR_HAVE_THREADS 1
#endif
#if defined(__linux__)
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Most threads any caller asks for; more pieces than this still run, the
 * extra ones on the calling thread. */
#define APR_PARALLEL_MAX_THREADS 64

typedef void (*apr_piece_fn)(void *piece);

/* Online processors, clamped to [1, most]; 1 where there are no threads. */
static inline int apr_parallel_cpu_count(int most)
{
#ifdef APR_HAVE_THREADS
    /* glibc's sysconf reads /sys/devices/system/cpu/online on every call (~6 us, more
     * than a whole 80 KiB copy), so ask once per translation unit.  Racing first calls
     * store the same value; a plain int store cannot tear. */
    static volatile long cached = 0;
    long n = cached;
    if (n == 0) {
#if defined(_WIN32)
        cached = n = (long)GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
#else
        cached = n = sysconf(_SC_NPROCESSORS_ONLN);
#endif
    }
    return n < 1 ? 1 : (n > most ? most : (int)n);
#else
    (void)most;
    return 1;
#endif
}

/* Threads worth starting now for work that is large enough to split: the online
 * processors, clamped to [1, most], less those other threads are running on at this
 * moment (Linux: the runnable count in /proc/loadavg, which includes the caller; it
 * counts the whole machine, so it is taken from every online processor, not from a
 * container's share).  Why: a thread started while every other core is busy waits
 * for a scheduler time slice (about 4 ms) before it can even finish, and the caller
 * must join it; on a 2-core VM shared with other jobs, two threads measured 2-10x
 * slower than one for 2-16 Mi element conversions.  A snapshot, not the 1-minute
 * average: a burst that is over does not keep threads off.  One small read (a few
 * microseconds), so only call it where the work is at least hundreds of them. */
static inline int apr_parallel_idle_cpus(int most)
{
    int cpus = apr_parallel_cpu_count(most);
#if defined(__linux__)
    if (cpus > 1) {
        char text[256];
#ifdef O_CLOEXEC /* hidden in strict ISO C builds without _GNU_SOURCE */
        int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
#else
        int fd = open("/proc/loadavg", O_RDONLY);
#endif
        if (fd < 0)
            return cpus;
        ssize_t got = read(fd, text, sizeof text - 1);
        close(fd);
        if (got <= 0)
            return cpus;
        text[got] = '\0';
        /* "0.52 0.58 0.59 3/811 12345": the fourth field is running/total. */
        const char *p = text;
        for (int field = 0; field < 3 && p; field++) {
            p = strchr(p, ' ');
            if (p)
                p++;
        }
        if (!p)
            return cpus;
        char *end = NULL;
        long running = strtol(p, &end, 10);
        if (end == p || *end != '/' || running < 1)
            return cpus;
        long online = apr_parallel_cpu_count(1 << 30);
        long idle = online - (running - 1);
        if (idle < cpus)
            cpus = idle < 1 ? 1 : (int)idle;
    }
#endif
    return cpus;
}

#ifdef APR_HAVE_THREADS
typedef struct {
    apr_piece_fn work;
    void *piece;
} apr_parallel_task;

#if defined(_WIN32)
typedef HANDLE apr_thread;
static inline DWORD WINAPI apr_parallel_trampoline(LPVOID arg)
{
    apr_parallel_task *task = (apr_parallel_task *)arg;
    task->work(task->piece);
    return 0;
}
static inline int apr_thread_start(apr_thread *thread, apr_parallel_task *task)
{
    *thread = CreateThread(NULL, 0, apr_parallel_trampoline, task, 0, NULL);
    return *thread != NULL;
}
static inline void apr_thread_join(apr_thread thread)
{
    WaitForSingleObject(thread, INFINITE);
    CloseHandle(thread);
}
#else
typedef pthread_t apr_thread;
static inline void *apr_parallel_trampoline(void *arg)
{
    apr_parallel_task *task = (apr_parallel_task *)arg;
    task->work(task->piece);
    return NULL;
}
static inline int apr_thread_start(apr_thread *thread, apr_parallel_task *task)
{
    return pthread_create(thread, NULL, apr_parallel_trampoline, task) == 0;
}
static inline void apr_thread_join(apr_thread thread) { pthread_join(thread, NULL); }
#endif
#endif

/* Run work(piece) for each of the n pieces of piece_size bytes at pieces.
 * The calling thread takes the last piece; a thread that cannot be started
 * is made up for by running its piece here.  Returns when all are done. */
static inline void apr_parallel_run(void *pieces, size_t piece_size, int n, apr_piece_fn work)
{
    unsigned char *base = (unsigned char *)pieces;
    if (n < 1)
        return;
#ifdef APR_HAVE_THREADS
    apr_thread threads[APR_PARALLEL_MAX_THREADS];
    apr_parallel_task tasks[APR_PARALLEL_MAX_THREADS];
    int started[APR_PARALLEL_MAX_THREADS] = {0};
    int spawn = n - 1 < APR_PARALLEL_MAX_THREADS ? n - 1 : APR_PARALLEL_MAX_THREADS;
    for (int i = 0; i < spawn; i++) {
        tasks[i].work = work;
        tasks[i].piece = base + (size_t)i * piece_size;
        started[i] = apr_thread_start(&threads[i], &tasks[i]);
    }
    for (int i = spawn; i < n; i++)
        work(base + (size_t)i * piece_size);
    for (int i = 0; i < spawn; i++) {
        if (started[i])
            apr_thread_join(threads[i]);
        else
            work(base + (size_t)i * piece_size);
    }
#else
    for (int i = 0; i < n; i++)
        work(base + (size_t)i * piece_size);
#endif
}

#ifdef __cplusplus
}
#endif

#endif /* APR_PARALLEL_H */
