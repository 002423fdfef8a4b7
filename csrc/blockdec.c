/* Parallel block decoding for compressed APR2 tensors: see blockdec.h. */
#include "blockdec.h"

#include <string.h>

#include "lz4block.h"
#include "parallel.h"

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#else
#include <dlfcn.h>
#endif

/* Below this many output bytes a thread costs more than it saves (starting one is
 * ~30 us; decoding 256 KiB of LZ4 takes about as long). */
#define MIN_BYTES_PER_THREAD (256u << 10)

/* --- libzstd, resolved at run time ------------------------------------------------- */
/* The stable one-shot API (zstd >= 1.0); declared here so no header is needed. */
typedef void zstd_dctx;
static struct {
    zstd_dctx *(*create)(void);
    size_t (*free_ctx)(zstd_dctx *);
    size_t (*decompress)(zstd_dctx *, void *, size_t, const void *, size_t);
    unsigned (*is_error)(size_t);
    const char *(*error_name)(size_t);
    size_t (*frame_size)(const void *, size_t);
    int ok;
} zstd;

#if defined(_WIN32)
/* A zstd DLL on the search path (rare on Windows: then the zstandard package decodes). */
static INIT_ONCE zstd_once = INIT_ONCE_STATIC_INIT;
static const char *zstd_names[] = {"libzstd.dll", "zstd.dll"};
#define lib_open(name) ((void *)LoadLibraryA(name))
static void *dlsym(void *lib, const char *symbol)
{
    union { FARPROC f; void *p; } u;
    u.f = GetProcAddress((HMODULE)lib, symbol);
    return u.p;
}
#else
static pthread_once_t zstd_once = PTHREAD_ONCE_INIT;
static const char *zstd_names[] = {"libzstd.so.1", "libzstd.so", "libzstd.1.dylib", "libzstd.dylib"};
#define lib_open(name) dlopen(name, RTLD_NOW | RTLD_LOCAL)
#endif

static void zstd_load(void)
{
    void *lib = NULL;
    for (size_t i = 0; i < sizeof zstd_names / sizeof *zstd_names && !lib; i++)
        lib = lib_open(zstd_names[i]);
    if (!lib)
        return;
    /* Through a union: ISO C has no cast from void * to a function pointer. */
    union { void *p; zstd_dctx *(*f)(void); } c = {dlsym(lib, "ZSTD_createDCtx")};
    union { void *p; size_t (*f)(zstd_dctx *); } fr = {dlsym(lib, "ZSTD_freeDCtx")};
    union { void *p; size_t (*f)(zstd_dctx *, void *, size_t, const void *, size_t); } d =
        {dlsym(lib, "ZSTD_decompressDCtx")};
    union { void *p; unsigned (*f)(size_t); } e = {dlsym(lib, "ZSTD_isError")};
    union { void *p; const char *(*f)(size_t); } n = {dlsym(lib, "ZSTD_getErrorName")};
    union { void *p; size_t (*f)(const void *, size_t); } s = {dlsym(lib, "ZSTD_findFrameCompressedSize")};
    if (!c.p || !fr.p || !d.p || !e.p || !n.p || !s.p)
        return;  /* too old a libzstd: the library stays loaded, unused */
    zstd.create = c.f;
    zstd.free_ctx = fr.f;
    zstd.decompress = d.f;
    zstd.is_error = e.f;
    zstd.error_name = n.f;
    zstd.frame_size = s.f;
    zstd.ok = 1;
}

#if defined(_WIN32)
static BOOL CALLBACK zstd_load_once(PINIT_ONCE once, PVOID param, PVOID *context)
{
    (void)once;
    (void)param;
    (void)context;
    zstd_load();
    return TRUE;
}
#endif

int apr_zstd_available(void)
{
#if defined(_WIN32)
    InitOnceExecuteOnce(&zstd_once, zstd_load_once, NULL, NULL);
#else
    pthread_once(&zstd_once, zstd_load);
#endif
    return zstd.ok;
}

const char *apr_zstd_error_name(size_t code)
{
    const char *name = apr_zstd_available() ? zstd.error_name(code) : NULL;
    return name ? name : "unknown zstd error";
}

/* --- one block ------------------------------------------------------------------ */
static void zstd_block(apr_block_job *job, zstd_dctx **ctx)
{
    if (!apr_zstd_available()) {
        job->rc = APR_BLOCK_ZSTD_MISSING;
        return;
    }
    /* Exactly one frame: trailing bytes would be data nothing ever reads. */
    size_t frame = zstd.frame_size(job->src, job->srclen);
    if (zstd.is_error(frame) || frame != job->srclen) {
        job->rc = zstd.is_error(frame) ? APR_BLOCK_ZSTD_ERROR : APR_BLOCK_ZSTD_FRAMES;
        job->where = frame;
        return;
    }
    if (!*ctx && !(*ctx = zstd.create())) {
        job->rc = APR_BLOCK_ZSTD_NOMEM;
        return;
    }
    /* One shot into exactly dstlen bytes: libzstd refuses to write past them, and
     * uses the output itself as the window (no window allocation a frame can inflate). */
    size_t got = zstd.decompress(*ctx, job->dst, job->dstlen, job->src, job->srclen);
    if (zstd.is_error(got)) {
        job->rc = APR_BLOCK_ZSTD_ERROR;
        job->where = got;
    } else if (got != job->dstlen) {
        job->rc = APR_BLOCK_ZSTD_SIZE;
        job->where = got;
    }
}

static void run_job(apr_block_job *job, zstd_dctx **ctx)
{
    job->rc = 0;
    job->where = 0;
    switch (job->codec) {
    case APR_BLOCK_COPY:
        if (job->srclen != job->dstlen)
            job->rc = APR_BLOCK_COPY_SIZE;
        else if (job->dstlen)
            memcpy(job->dst, job->src, job->dstlen);
        break;
    case APR_BLOCK_LZ4:
        job->rc = apr_lz4_block_decode(job->src, job->srclen, job->dst, job->dstlen, &job->where);
        break;
    case APR_BLOCK_ZSTD:
        zstd_block(job, ctx);
        break;
    default:
        job->rc = APR_BLOCK_BAD_CODEC;
    }
}

/* --- many blocks over threads ---------------------------------------------------- */
/* Threads take jobs from a shared counter, a few at a time, so a thread slowed down by
 * another process's load leaves its share to the others instead of holding up the end
 * (a static split measured up to 3x slower on a busy 2-core machine). */
#define JOBS_PER_GRAB 4

typedef struct {
    apr_block_job *jobs;
    size_t n;
    size_t *next;  /* shared by every piece */
} run;

static size_t grab(size_t *next)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_fetch_add(next, JOBS_PER_GRAB, __ATOMIC_RELAXED);
#else
    size_t at = *next;  /* no atomics: apr_parallel_run runs pieces one after another here */
    *next += JOBS_PER_GRAB;
    return at;
#endif
}

static void run_piece(void *arg)
{
    run *r = (run *)arg;
    zstd_dctx *ctx = NULL;
    for (size_t at = grab(r->next); at < r->n; at = grab(r->next))
        for (size_t i = at; i < r->n && i < at + JOBS_PER_GRAB; i++)
            run_job(&r->jobs[i], &ctx);
    if (ctx)
        zstd.free_ctx(ctx);
}

ptrdiff_t apr_decode_blocks(apr_block_job *jobs, size_t n, int nthreads)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += jobs[i].dstlen;
    int most = apr_parallel_cpu_count(APR_PARALLEL_MAX_THREADS);
    if (nthreads <= 0 || nthreads > most)
        nthreads = most;
    size_t by_size = total / MIN_BYTES_PER_THREAD;
    if ((size_t)nthreads > by_size)
        nthreads = by_size ? (int)by_size : 1;
    size_t grabs = (n + JOBS_PER_GRAB - 1) / JOBS_PER_GRAB;
    if ((size_t)nthreads > grabs)
        nthreads = grabs ? (int)grabs : 1;
#if !(defined(__GNUC__) || defined(__clang__)) && defined(APR_HAVE_THREADS)
    nthreads = 1;  /* the counter above is not atomic without the builtins */
#endif
    size_t next = 0;
    run runs[APR_PARALLEL_MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        runs[t].jobs = jobs;
        runs[t].n = n;
        runs[t].next = &next;
    }
    apr_parallel_run(runs, sizeof(run), nthreads, run_piece);
    for (size_t i = 0; i < n; i++)
        if (jobs[i].rc)
            return (ptrdiff_t)i;
    return -1;
}
