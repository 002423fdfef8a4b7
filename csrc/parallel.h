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
