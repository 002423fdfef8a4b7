/* One pass over a metadata block (MessagePack or JSON) that builds nothing: it
 * checks the syntax, bounds the nesting, and adds up an upper bound of the
 * memory that decoding the block with Python's decoder (msgpack.unpackb,
 * json.loads) would need at its peak.  The caller refuses a block whose
 * estimate is over its budget before any object is built.
 *
 * The walkers are iterative (an explicit stack of max_depth frames, allocated
 * on the heap), so no input can exhaust the C stack, and they read only
 * buf[0..len).  All functions are thread-safe and need no GIL.
 *
 * The estimate models CPython 3.9-3.13 on a 64-bit platform (default build):
 * object headers, pymalloc's 16-byte size classes, malloc's chunk header, list
 * over-allocation, dict key tables as they grow, the decoder's key cache
 * (json's memo dict, msgpack's interning) and the largest transient buffer of
 * any single step (a str being widened, a list or dict being resized, a number
 * being converted).  tests/test_metadata_bounds.py checks it against
 * tracemalloc for every shape it knows.  metascan.c documents each constant. */
#ifndef APRFAST_METASCAN_H
#define APRFAST_METASCAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the top-level value is (of either format). */
enum apr_meta_kind {
    APR_META_NONE = 0,  /* no value at all (empty input, or only whitespace) */
    APR_META_MAP,       /* MessagePack map, JSON object */
    APR_META_ARRAY,
    APR_META_STR,
    APR_META_BIN,       /* MessagePack only */
    APR_META_INT,       /* JSON: a number without fraction or exponent */
    APR_META_FLOAT,
    APR_META_BOOL,
    APR_META_NIL,       /* MessagePack nil, JSON null */
    APR_META_EXT,       /* MessagePack only */
    APR_META_UNKNOWN    /* a first byte no value starts with */
};

enum apr_meta_status {
    APR_META_OK = 0,       /* a map, well formed; estimate is set */
    APR_META_NOT_MAP = 1,  /* the top level is another kind (see top); nothing
                              after its first byte was looked at */
    APR_META_INVALID = 2,  /* malformed at error_at: error says how */
    APR_META_TOO_DEEP = 3, /* more than max_depth containers open at error_at */
    APR_META_NO_MEMORY = 4 /* the walker's stack could not be allocated */
};

typedef struct apr_meta_scan {
    int status;           /* enum apr_meta_status */
    int top;              /* enum apr_meta_kind */
    uint64_t estimate;    /* OK: bytes the decode may hold at its peak, the
                             input itself excluded (JSON: the text it parses
                             included) */
    uint64_t error_at;    /* INVALID, TOO_DEEP: offset of the offending byte */
    const char *error;    /* INVALID: static text */
    uint64_t values;      /* OK: values in the block (containers included) */
    uint64_t max_depth_seen;
    /* JSON only, for apr_meta_json_text: the text json.loads will be given. */
    uint64_t text_length; /* characters */
    uint32_t text_maxchar;/* 127, 255, 0xFFFF or 0x10FFFF: the str's kind */
    int text_kind;        /* 1, 2 or 4: characters wider than this are written
                             as \uXXXX escapes (inside strings only) */
} apr_meta_scan;

/* Scan a MessagePack block (one value, no trailing bytes), as
 * msgpack.unpackb(raw=False, strict_map_key=True) reads it.  max_depth is the
 * most non-empty containers open at once (msgpack's own limit is 1024). */
void apr_meta_scan_msgpack(const uint8_t *buf, size_t len, size_t max_depth, apr_meta_scan *out);

/* Scan a JSON block (UTF-8, one value, whitespace around it allowed) as
 * json.loads reads it (strict: no control characters in strings, no NaN or
 * Infinity).  max_depth is the most containers open at once. */
void apr_meta_scan_json(const uint8_t *buf, size_t len, size_t max_depth, apr_meta_scan *out);

/* Write the text of a JSON block that apr_meta_scan_json accepted into out,
 * which holds capacity characters of scan->text_kind bytes each: the block
 * decoded from UTF-8, except that characters wider than text_kind (they only
 * occur inside strings) are written as \uXXXX escapes (a surrogate pair for
 * characters above U+FFFF), which json.loads decodes to the same characters.
 * Returns 0 on success, -1 if the bytes no longer match the scan (they changed
 * in between: the caller must not use out). */
int apr_meta_json_text(const uint8_t *buf, size_t len, const apr_meta_scan *scan, void *out,
                       uint64_t capacity);

#ifdef __cplusplus
}
#endif

#endif
