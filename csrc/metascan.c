/* Metadata scanners: syntax, depth and a memory estimate, without building
 * anything (contract in metascan.h).
 *
 * The cost model.  Every figure is the largest of CPython 3.9-3.13 (64-bit,
 * default build) so the sum stays an upper bound on each of them:
 *
 *   str      48-byte header if ASCII, else 72, plus (chars + 1) * kind bytes
 *            (kind 1, 2 or 4: the widest character decides)
 *   int      24 + 4 per 30-bit digit;  float 24;  bytes 33 + length
 *   list     56 (GC header included) + 8 per slot; json.loads appends, so
 *            its lists carry list_resize's over-allocation (n/8 + 6 slots)
 *   dict     64 + a key table: 40-byte header, 2^s index slots of 1/2/4/8
 *            bytes and 2^(s+1)/3 entries of 24 bytes, s as the dict grew
 *   map key  one more entry in the decoder's key cache (json's memo dict,
 *            msgpack's interning of str keys), charged as a dict of all keys
 *   nil, true, false  nothing (singletons)
 *
 * Each allocation is rounded as the allocator rounds it (pymalloc's 16-byte
 * classes up to 512 bytes, malloc's chunk header above, whole pages for a
 * mapping), and 1/64 is added to the total for the allocators' own headers.  On top of what the decode keeps, the largest transient of any
 * one step is added: the old table of a dict being resized, the old item
 * array of a list being grown, both buffers of a str being widened, the
 * bytes copy of a number being converted.  For JSON the text json.loads
 * parses is added as well (see apr_meta_json_text for how it is kept small).
 *
 * Singletons and caches (small ints, one-character strings, repeated keys)
 * make real decodes cheaper than the estimate, never dearer. */
#include "metascan.h"
#include "utf8.h"

#include <stdlib.h>
#include <string.h>

/* --- the cost model -------------------------------------------------------- */
#define STR_ASCII_HEAD 48u /* PyASCIIObject (40 from 3.12) */
#define STR_WIDE_HEAD 72u  /* PyCompactUnicodeObject (56 from 3.12) */
#define LIST_HEAD 56u      /* PyListObject 40 + PyGC_Head 16 */
#define DICT_HEAD 64u      /* PyDictObject 48 + PyGC_Head 16 */
#define KEYS_HEAD 40u      /* PyDictKeysObject (3.9/3.10; 32 from 3.11) */
#define KEYS_ENTRY 24u     /* PyDictKeyEntry (16 for str-only keys from 3.11) */
#define INT_HEAD 24u       /* PyLongObject; + 4 bytes per 30-bit digit */
#define FLOAT_SIZE 24u     /* PyFloatObject */
#define BYTES_HEAD 33u     /* PyBytesObject, trailing NUL included */
#define EXT_EXTRA 256u     /* ExtType (2-tuple + code int) or Timestamp (object + 2 ints) */
/* msgpack interns str keys: it grows the interpreter's interned-strings dict,
 * which already holds the identifiers of every module loaded (about 13,000
 * with aprfast and NumPy imported).  Charged as if it held this many, so the
 * one resize a few new keys may trigger is counted. */
#define INTERNED_BEFORE 16384u

typedef uint64_t u64;

static u64 alloc_cost(u64 n)
{
    if (n <= 512)
        return (n + 15) & ~(u64)15;          /* pymalloc size class */
    if (n < ((u64)128 << 10))
        return (n + 8 + 15) & ~(u64)15;      /* malloc chunk */
    return (n + 16 + 4095) & ~(u64)4095;     /* mmap'd chunk: whole pages */
}

static u64 max_u64(u64 a, u64 b) { return a > b ? a : b; }

/* What the allocators keep beside the blocks they hand out: pymalloc's pool
 * and arena headers, partly filled pools (about 1/64 more). */
static u64 with_overhead(u64 bytes) { return bytes + bytes / 64; }

/* kind: 0 ASCII, else bytes per character (1, 2, 4). */
static u64 str_cost(u64 chars, int kind)
{
    if (kind == 0)
        return alloc_cost(STR_ASCII_HEAD + chars + 1);
    return alloc_cost(STR_WIDE_HEAD + (chars + 1) * (u64)kind);
}

static u64 int_cost(u64 digits30) { return alloc_cost(INT_HEAD + 4 * (digits30 ? digits30 : 1)); }

/* CPython keeps one object for each int in [-5, 256]: decoding one builds nothing. */
static int small_int(int negative, u64 magnitude) { return negative ? magnitude <= 5 : magnitude <= 256; }

static u64 list_cost(u64 n, int appended)
{
    u64 cost = alloc_cost(LIST_HEAD);
    if (n)
        cost += alloc_cost(8 * (appended ? n + (n >> 3) + 6 : n));
    return cost;
}

/* log2 of the key table of a dict holding n entries: grown from 8 slots by
 * doubling when full (json.loads, and msgpack past its presize), or presized
 * by _PyDict_NewPresized (msgpack): whichever is larger. */
static unsigned dict_log2(u64 n)
{
    unsigned grown = 3, presized = 3;
    u64 want = (3 * n + 1) / 2;
    while ((((u64)1 << (grown + 1)) / 3) < n)
        grown++;
    while (((u64)1 << presized) < want)
        presized++;
    return grown > presized ? grown : presized;
}

static u64 keys_cost(unsigned log2)
{
    u64 size = (u64)1 << log2, usable = (size << 1) / 3;
    u64 index_bytes = log2 < 8 ? 1 : log2 < 16 ? 2 : log2 < 32 ? 4 : 8;
    return alloc_cost(KEYS_HEAD + index_bytes * size + KEYS_ENTRY * usable);
}

static u64 dict_cost(u64 n) { return alloc_cost(DICT_HEAD) + (n ? keys_cost(dict_log2(n)) : 0); }

/* While a dict grows past its last table, the old table is still alive. */
static u64 dict_transient(u64 n)
{
    unsigned s = dict_log2(n);
    return s > 3 ? keys_cost(s - 1) : 0;
}

/* The decoder's key cache after `keys` map keys (all assumed distinct). */
static u64 key_cache_cost(u64 keys, int interned)
{
    unsigned s;
    if (!keys)
        return 0;
    if (interned)
        keys += INTERNED_BEFORE;
    s = dict_log2(keys);
    return alloc_cost(DICT_HEAD) + keys_cost(s) + (s > 3 ? keys_cost(s - 1) : 0);
}

/* A str of `chars` characters of `kind` built by a _PyUnicodeWriter from
 * `units` units: at its worst the writer holds a buffer of the final kind and
 * the narrower one it is widening from (or the smaller one it is growing
 * from), each of `units` characters.  Returned: that peak less the final str,
 * which is charged on its own. */
static u64 writer_extra(u64 units, u64 chars, int kind)
{
    int k = kind ? kind : 1, narrower = k >= 2 ? k / 2 : 1;
    u64 peak = alloc_cost(STR_WIDE_HEAD + (units + 1) * (u64)k)
             + alloc_cost(STR_WIDE_HEAD + (units + 1) * (u64)narrower);
    u64 final = str_cost(chars, kind);
    return peak > final ? peak - final : 0;
}

static int cp_kind(uint32_t c) { return c < 0x80 ? 0 : c < 0x100 ? 1 : c < 0x10000 ? 2 : 4; }

/* Leading ASCII bytes of p[0..n), a word at a time. */
static size_t ascii_run(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & UINT64_C(0x8080808080808080))
            break;
        i += 8;
    }
    while (i < n && p[i] < 0x80)
        i++;
    return i;
}

/* --- shared walker state --------------------------------------------------- */
typedef struct {
    u64 count;    /* JSON: elements or entries so far; MessagePack: items left */
    uint8_t map;  /* 1 for a map / object */
} frame;

/* Keys seen before in the same block share one str (json's memo, msgpack's
 * interning): a direct-mapped cache of recent keys (their raw bytes, compared
 * exactly) lets those cost nothing.  A miss only makes the estimate larger. */
#define KEY_CACHE_SLOTS 4096
#define KEY_CACHE_MAX_LEN 256

typedef struct {
    size_t off, len; /* len 0: empty slot (keys are cached by length + 1) */
} key_slot;

typedef struct {
    const uint8_t *buf;
    size_t len, pos;
    apr_meta_scan *out;
    key_slot *key_cache;
    u64 objects;    /* what the decode keeps */
    u64 transient;  /* largest extra of any one step */
    u64 keys;
    /* JSON: characters of the text by class (raw ones; escapes are ASCII)... */
    u64 text_latin1, text_bmp, text_astral, text_nonascii_bytes;
    /* ...and the writer transients of strings with escapes, or with characters
     * the text may have to escape (kind 2 / kind 4 strings without escapes). */
    u64 tr_escaped, tr_kind2, tr_kind4;
} walker;

/* The explicit stack (max_depth frames) and the key cache of one walk; 0 if either
 * allocation failed (then neither is kept). */
static int walker_alloc(walker *w, frame **stack, size_t max_depth)
{
    *stack = (frame *)malloc((max_depth ? max_depth : 1) * sizeof **stack);
    w->key_cache = (key_slot *)calloc(KEY_CACHE_SLOTS, sizeof *w->key_cache);
    if (*stack && w->key_cache)
        return 1;
    free(*stack);
    free(w->key_cache);
    *stack = NULL;
    w->key_cache = NULL;
    return 0;
}

static void fail(walker *w, size_t at, const char *why)
{
    w->out->status = APR_META_INVALID;
    w->out->error_at = at;
    w->out->error = why;
}

static void too_deep(walker *w, size_t at)
{
    w->out->status = APR_META_TOO_DEEP;
    w->out->error_at = at;
}

/* 1 if the key whose raw bytes are buf[off..off+n) was seen before (and
 * remember it either way). */
static int key_seen(walker *w, size_t off, size_t n)
{
    uint64_t h = UINT64_C(1469598103934665603);
    key_slot *slot;
    if (!w->key_cache || n > KEY_CACHE_MAX_LEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        h = (h ^ w->buf[off + i]) * UINT64_C(1099511628211);
    slot = &w->key_cache[(h ^ (h >> 29)) & (KEY_CACHE_SLOTS - 1)];
    if (slot->len == n + 1 && memcmp(w->buf + slot->off, w->buf + off, n) == 0)
        return 1;
    slot->off = off;
    slot->len = n + 1;
    return 0;
}

static void note_transient(walker *w, u64 t)
{
    if (t > w->transient)
        w->transient = t;
}

/* --- MessagePack ----------------------------------------------------------- */
static int mp_kind(uint8_t b)
{
    if (b <= 0x7F || b >= 0xE0)
        return APR_META_INT;
    if (b <= 0x8F)
        return APR_META_MAP;
    if (b <= 0x9F)
        return APR_META_ARRAY;
    if (b <= 0xBF)
        return APR_META_STR;
    switch (b) {
    case 0xC0: return APR_META_NIL;
    case 0xC2: case 0xC3: return APR_META_BOOL;
    case 0xC4: case 0xC5: case 0xC6: return APR_META_BIN;
    case 0xC7: case 0xC8: case 0xC9: case 0xD4: case 0xD5: case 0xD6: case 0xD7: case 0xD8:
        return APR_META_EXT;
    case 0xCA: case 0xCB: return APR_META_FLOAT;
    case 0xD9: case 0xDA: case 0xDB: return APR_META_STR;
    case 0xDC: case 0xDD: return APR_META_ARRAY;
    case 0xDE: case 0xDF: return APR_META_MAP;
    case 0xC1: return APR_META_UNKNOWN;
    default: return APR_META_INT; /* 0xCC-0xD3 */
    }
}

static u64 be(const uint8_t *p, int n)
{
    u64 v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Read an n-byte big-endian length at w->pos; 0 if truncated. */
static int mp_length(walker *w, int n, u64 *v)
{
    if (w->len - w->pos < (size_t)n) {
        fail(w, w->pos, "truncated: a length runs past the end");
        return 0;
    }
    *v = be(w->buf + w->pos, n);
    w->pos += n;
    return 1;
}

/* A str of n bytes at w->pos; `key`: it is a map key (msgpack interns those). */
static int mp_str(walker *w, u64 n, int key)
{
    const uint8_t *p = w->buf + w->pos, *end;
    u64 chars = 0;
    int kind = 0;
    size_t i;
    if (n > w->len - w->pos) {
        fail(w, w->pos, "truncated: a str runs past the end");
        return 0;
    }
    if (key && key_seen(w, w->pos, (size_t)n)) {
        w->pos += n; /* the same bytes as a key already checked and charged */
        return 1;
    }
    w->keys += key != 0;
    end = p + n;
    i = ascii_run(p, (size_t)n);
    chars = i;
    while (p + i < end) {
        uint32_t cp;
        int k, len;
        if (p[i] < 0x80) {
            i++;
            chars++;
            continue;
        }
        len = apr_utf8_seq(p + i, end, &cp);
        if (!len) {
            fail(w, w->pos + i, "invalid UTF-8 in a str");
            return 0;
        }
        k = cp_kind(cp);
        if (k > kind)
            kind = k;
        i += len;
        chars++;
    }
    w->objects += str_cost(chars, kind);
    if (kind)  /* PyUnicode_DecodeUTF8 starts ASCII, then widens */
        note_transient(w, writer_extra(n, chars, kind));
    w->pos += n;
    return 1;
}

void apr_meta_scan_msgpack(const uint8_t *buf, size_t len, size_t max_depth, apr_meta_scan *out)
{
    walker w;
    frame *stack;
    size_t depth = 0;
    memset(out, 0, sizeof *out);
    memset(&w, 0, sizeof w);
    w.buf = buf;
    w.len = len;
    w.out = out;
    if (len == 0) {
        fail(&w, 0, "empty: no value");
        return;
    }
    out->top = mp_kind(buf[0]);
    if (out->top == APR_META_UNKNOWN) {
        fail(&w, 0, "byte 0xc1 is never used");
        return;
    }
    if (out->top != APR_META_MAP) {
        out->status = APR_META_NOT_MAP;
        return;
    }
    if (!walker_alloc(&w, &stack, max_depth)) {
        out->status = APR_META_NO_MEMORY;
        return;
    }
    for (;;) {
        /* one value at w.pos */
        size_t at = w.pos;
        uint8_t b;
        u64 n = 0;
        int container = 0; /* 1 array, 2 map */
        /* a map's items alternate key, value: a key when an even number are left */
        int is_key = depth && stack[depth - 1].map && stack[depth - 1].count % 2 == 0;
        if (w.pos >= len) {
            fail(&w, w.pos, "truncated: a value is missing");
            break;
        }
        b = buf[w.pos++];
        out->values++;
        if (b <= 0x7F || b >= 0xE0) {
            if (!small_int(b >= 0xE0, b >= 0xE0 ? (u64)(256 - b) : b))
                w.objects += int_cost(1);
        } else if (b <= 0x8F) {
            container = 2;
            n = b & 0x0F;
        } else if (b <= 0x9F) {
            container = 1;
            n = b & 0x0F;
        } else if (b <= 0xBF) {
            if (!mp_str(&w, b & 0x1F, is_key))
                break;
        } else {
            switch (b) {
            case 0xC0: case 0xC2: case 0xC3:
                break;
            case 0xC1:
                fail(&w, at, "byte 0xc1 is never used");
                break;
            case 0xC4: case 0xC5: case 0xC6: {
                if (!mp_length(&w, b == 0xC4 ? 1 : b == 0xC5 ? 2 : 4, &n))
                    break;
                if (n > len - w.pos) {
                    fail(&w, at, "truncated: a bin runs past the end");
                    break;
                }
                w.objects += alloc_cost(BYTES_HEAD + n);
                w.pos += n;
                break;
            }
            case 0xC7: case 0xC8: case 0xC9: case 0xD4: case 0xD5: case 0xD6: case 0xD7: case 0xD8: {
                if (b >= 0xD4)
                    n = (u64)1 << (b - 0xD4);
                else if (!mp_length(&w, b == 0xC7 ? 1 : b == 0xC8 ? 2 : 4, &n))
                    break;
                if (n + 1 > len - w.pos) {
                    fail(&w, at, "truncated: an ext runs past the end");
                    break;
                }
                w.objects += EXT_EXTRA + alloc_cost(BYTES_HEAD + n);
                w.pos += n + 1;
                break;
            }
            case 0xCA: case 0xCB: {
                size_t size = b == 0xCA ? 4 : 8;
                if (size > len - w.pos) {
                    fail(&w, at, "truncated: a float runs past the end");
                    break;
                }
                w.objects += alloc_cost(FLOAT_SIZE);
                w.pos += size;
                break;
            }
            case 0xCC: case 0xCD: case 0xCE: case 0xCF: case 0xD0: case 0xD1: case 0xD2: case 0xD3: {
                size_t size = (size_t)1 << ((b - 0xCC) & 3);
                u64 v;
                int negative;
                if (size > len - w.pos) {
                    fail(&w, at, "truncated: an int runs past the end");
                    break;
                }
                v = be(buf + w.pos, (int)size);
                negative = b >= 0xD0 && (v >> (8 * size - 1));
                if (negative)
                    v = size == 8 ? ~v + 1 : ((u64)1 << (8 * size)) - v;
                if (!small_int(negative, v))
                    w.objects += int_cost(size == 8 ? 3 : 2);
                w.pos += size;
                break;
            }
            case 0xD9: case 0xDA: case 0xDB:
                if (mp_length(&w, b == 0xD9 ? 1 : b == 0xDA ? 2 : 4, &n))
                    mp_str(&w, n, is_key);
                break;
            case 0xDC: case 0xDD:
                container = 1;
                mp_length(&w, b == 0xDC ? 2 : 4, &n);
                break;
            case 0xDE: case 0xDF:
                container = 2;
                mp_length(&w, b == 0xDE ? 2 : 4, &n);
                break;
            }
        }
        if (out->status != APR_META_OK)
            break;
        if (container) {
            u64 items = container == 2 ? 2 * n : n;
            /* Every item takes at least a byte: a count the rest cannot hold is a
             * lie, refused before it is believed (msgpack refuses it too). */
            if (items > len - w.pos) {
                fail(&w, at, container == 2 ? "truncated: a map declares more entries than bytes follow"
                                            : "truncated: an array declares more items than bytes follow");
                break;
            }
            if (container == 2) {
                w.objects += dict_cost(n);
                note_transient(&w, dict_transient(n));
            } else {
                w.objects += list_cost(n, 0);
            }
            if (items) {
                if (depth >= max_depth) {
                    too_deep(&w, at);
                    break;
                }
                stack[depth].count = items;
                stack[depth].map = container == 2;
                depth++;
                if ((u64)depth > out->max_depth_seen)
                    out->max_depth_seen = depth;
                continue;
            }
        }
        /* a value is complete: close every container it completes */
        while (depth && --stack[depth - 1].count == 0)
            depth--;
        if (!depth)
            break;
    }
    free(stack);
    free(w.key_cache);
    if (out->status != APR_META_OK)
        return;
    if (w.pos != len) {
        fail(&w, w.pos, "extra bytes after the map");
        return;
    }
    out->estimate = with_overhead(w.objects + key_cache_cost(w.keys, 1) + w.transient);
}

/* --- JSON ------------------------------------------------------------------- */
static const uint8_t WS[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1};

/* 1 for bytes a string may hold as they are: printable ASCII (DEL included)
 * but '"' and '\\'.  Control characters must be escaped, bytes from 0x80 on
 * start UTF-8 sequences. */
static const uint8_t PLAIN[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

static size_t skip_ws(const uint8_t *buf, size_t len, size_t pos)
{
    while (pos < len && WS[buf[pos]])
        pos++;
    return pos;
}

static int hex4(const uint8_t *p, uint32_t *v)
{
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        x <<= 4;
        if (c >= '0' && c <= '9')
            x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            x |= (uint32_t)(c - 'A' + 10);
        else
            return 0;
    }
    *v = x;
    return 1;
}

static int json_kind(uint8_t c)
{
    switch (c) {
    case '{': return APR_META_MAP;
    case '[': return APR_META_ARRAY;
    case '"': return APR_META_STR;
    case 't': case 'f': return APR_META_BOOL;
    case 'n': return APR_META_NIL;
    case '-': case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8': case '9':
        return APR_META_INT;
    default: return APR_META_UNKNOWN;
    }
}

/* The string whose opening quote is at w->pos, as json's scanstring reads it;
 * `key`: it is an object's key (json.loads shares equal keys). */
static int json_string(walker *w, int key)
{
    const uint8_t *buf = w->buf;
    size_t len = w->len, start = w->pos, pos = w->pos + 1;
    u64 chars = 0;
    int kind = 0, escaped = 0;
    for (;;) {
        size_t run = pos;
        uint8_t c;
        while (run < len && PLAIN[buf[run]])
            run++;
        chars += run - pos;
        pos = run;
        if (pos >= len) {
            fail(w, start, "unterminated string");
            return 0;
        }
        c = buf[pos];
        if (c == '"') {
            pos++;
            break;
        }
        if (c == '\\') {
            uint32_t cp, lo;
            if (pos + 1 >= len) {
                fail(w, start, "unterminated string");
                return 0;
            }
            escaped = 1;
            switch (buf[pos + 1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                pos += 2;
                chars++;
                continue;
            case 'u':
                if (len - pos < 6 || !hex4(buf + pos + 2, &cp)) {
                    fail(w, pos, "invalid \\uXXXX escape");
                    return 0;
                }
                pos += 6;
                if (cp >= 0xD800 && cp <= 0xDBFF && len - pos >= 6 && buf[pos] == '\\' && buf[pos + 1] == 'u') {
                    if (!hex4(buf + pos + 2, &lo)) {
                        fail(w, pos, "invalid \\uXXXX escape");
                        return 0;
                    }
                    if (lo >= 0xDC00 && lo <= 0xDFFF) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        pos += 6;
                    }
                }
                chars++;
                if (cp_kind(cp) > kind)
                    kind = cp_kind(cp);
                continue;
            default:
                fail(w, pos, "invalid escape");
                return 0;
            }
        }
        if (c < 0x20) {
            fail(w, pos, "control character in a string");
            return 0;
        } else {
            uint32_t cp;
            int n = apr_utf8_seq(buf + pos, buf + len, &cp), k;
            if (!n) {
                fail(w, pos, "invalid UTF-8");
                return 0;
            }
            k = cp_kind(cp);
            if (k > kind)
                kind = k;
            if (k == 1)
                w->text_latin1++;
            else if (k == 2)
                w->text_bmp++;
            else
                w->text_astral++;
            w->text_nonascii_bytes += (u64)n;
            pos += (size_t)n;
            chars++;
        }
    }
    w->pos = pos;
    if (key) {
        if (key_seen(w, start + 1, pos - start - 2))
            return 1;
        w->keys++;
    }
    w->objects += str_cost(chars, kind);
    /* Without escapes json takes a substring of the text (exact size); with
     * them a _PyUnicodeWriter over-allocating by a quarter builds it. */
    if (escaped)
        w->tr_escaped = max_u64(w->tr_escaped, writer_extra(chars + chars / 4, chars, kind));
    else if (kind == 2)
        w->tr_kind2 = max_u64(w->tr_kind2, writer_extra(chars + chars / 4, chars, kind));
    else if (kind == 4)
        w->tr_kind4 = max_u64(w->tr_kind4, writer_extra(chars + chars / 4, chars, kind));
    return 1;
}

static int json_literal(walker *w, const char *word, size_t n)
{
    if (w->len - w->pos < n || memcmp(w->buf + w->pos, word, n) != 0) {
        fail(w, w->pos, "expected a value");
        return 0;
    }
    w->pos += n;
    return 1;
}

static int json_number(walker *w)
{
    const uint8_t *buf = w->buf;
    size_t len = w->len, start = w->pos, pos = w->pos, digits_at;
    int is_float = 0;
    if (buf[pos] == '-')
        pos++;
    digits_at = pos;
    if (pos < len && buf[pos] == '0') {
        pos++;
    } else if (pos < len && buf[pos] >= '1' && buf[pos] <= '9') {
        while (pos < len && buf[pos] >= '0' && buf[pos] <= '9')
            pos++;
    } else {
        fail(w, start, "expected a value");
        return 0;
    }
    if (pos + 1 < len && buf[pos] == '.' && buf[pos + 1] >= '0' && buf[pos + 1] <= '9') {
        pos += 2;
        while (pos < len && buf[pos] >= '0' && buf[pos] <= '9')
            pos++;
        is_float = 1;
    }
    if (pos < len && (buf[pos] == 'e' || buf[pos] == 'E')) {
        size_t q = pos + 1;
        if (q < len && (buf[q] == '+' || buf[q] == '-'))
            q++;
        if (q < len && buf[q] >= '0' && buf[q] <= '9') {
            while (q < len && buf[q] >= '0' && buf[q] <= '9')
                q++;
            pos = q;
            is_float = 1;
        }
    }
    if (is_float) {
        w->objects += alloc_cost(FLOAT_SIZE);
    } else {
        /* a 30-bit digit holds at least 9 decimal digits */
        u64 d = (u64)(pos - digits_at), v = 0;
        for (size_t i = digits_at; d <= 3 && i < pos; i++)
            v = v * 10 + (u64)(buf[i] - '0');
        if (d > 3 || !small_int(buf[start] == '-', v))
            w->objects += int_cost((d + 8) / 9);
    }
    /* json copies the number's text into a bytes object to convert it */
    note_transient(w, alloc_cost(BYTES_HEAD + (pos - start)) + int_cost((pos - start) / 9 + 1));
    w->pos = pos;
    return 1;
}

static u64 text_len(const walker *w, int kind)
{
    u64 ascii = w->len - w->text_nonascii_bytes;
    if (kind == 1)
        return ascii + w->text_latin1 + 6 * w->text_bmp + 12 * w->text_astral;
    if (kind == 2)
        return ascii + w->text_latin1 + w->text_bmp + 12 * w->text_astral;
    return ascii + w->text_latin1 + w->text_bmp + w->text_astral;
}

/* Choose the text's kind: the cheapest of the str itself plus the writer
 * transients of the strings whose characters it escapes. */
static void json_plan(walker *w, u64 *extra)
{
    apr_meta_scan *out = w->out;
    int best = 1;
    u64 best_cost = 0;
    for (int k = 1; k <= 4; k *= 2) {
        u64 cost, strs;
        if ((k == 2 && !w->text_bmp) || (k == 4 && !w->text_astral))
            continue; /* the str must be as narrow as its widest character allows */
        cost = str_cost(text_len(w, k), k == 1 ? (w->text_latin1 ? 1 : 0) : k);
        strs = w->tr_escaped;
        if (k == 1)
            strs = max_u64(strs, max_u64(w->tr_kind2, w->tr_kind4));
        else if (k == 2)
            strs = max_u64(strs, w->tr_kind4);
        cost += max_u64(strs, w->transient);
        if (k == 1 || cost < best_cost) {
            best = k;
            best_cost = cost;
        }
    }
    out->text_kind = best;
    out->text_length = text_len(w, best);
    out->text_maxchar = best == 4 ? 0x10FFFF : best == 2 ? 0xFFFF : w->text_latin1 ? 0xFF : 0x7F;
    *extra = best_cost;
}

void apr_meta_scan_json(const uint8_t *buf, size_t len, size_t max_depth, apr_meta_scan *out)
{
    walker w;
    frame *stack;
    size_t depth = 0, pos;
    u64 extra;
    memset(out, 0, sizeof *out);
    memset(&w, 0, sizeof w);
    w.buf = buf;
    w.len = len;
    w.out = out;
    pos = skip_ws(buf, len, 0);
    if (pos == len) {
        fail(&w, pos, "no value (empty or only whitespace)");
        return;
    }
    out->top = json_kind(buf[pos]);
    if (out->top == APR_META_UNKNOWN) {
        fail(&w, pos, "expected a value");
        return;
    }
    if (out->top != APR_META_MAP) {
        out->status = APR_META_NOT_MAP;
        return;
    }
    if (!walker_alloc(&w, &stack, max_depth)) {
        out->status = APR_META_NO_MEMORY;
        return;
    }
    w.pos = pos;

value:
    /* a value starts at w.pos (whitespace skipped) */
    if (w.pos >= len) {
        fail(&w, w.pos, "truncated: expected a value");
        goto done;
    }
    out->values++;
    if (depth && !stack[depth - 1].map)
        stack[depth - 1].count++;
    switch (buf[w.pos]) {
    case '{':
    case '[':
        if (depth >= max_depth) {
            too_deep(&w, w.pos);
            goto done;
        }
        stack[depth].map = buf[w.pos] == '{';
        stack[depth].count = 0;
        depth++;
        if ((u64)depth > out->max_depth_seen)
            out->max_depth_seen = depth;
        w.pos = skip_ws(buf, len, w.pos + 1);
        if (w.pos < len && buf[w.pos] == (stack[depth - 1].map ? '}' : ']'))
            goto close;
        if (stack[depth - 1].map)
            goto key;
        goto value;
    case '"':
        if (!json_string(&w, 0))
            goto done;
        goto after;
    case 't':
        if (!json_literal(&w, "true", 4))
            goto done;
        goto after;
    case 'f':
        if (!json_literal(&w, "false", 5))
            goto done;
        goto after;
    case 'n':
        if (!json_literal(&w, "null", 4))
            goto done;
        goto after;
    default:
        if (!json_number(&w))
            goto done;
        goto after;
    }

key:
    /* an object's key starts at w.pos (whitespace skipped) */
    if (w.pos >= len || buf[w.pos] != '"') {
        fail(&w, w.pos, w.pos >= len ? "truncated: expected a key" : "expected a string key");
        goto done;
    }
    if (!json_string(&w, 1))
        goto done;
    stack[depth - 1].count++;
    w.pos = skip_ws(buf, len, w.pos);
    if (w.pos >= len || buf[w.pos] != ':') {
        fail(&w, w.pos, "expected ':' after a key");
        goto done;
    }
    w.pos = skip_ws(buf, len, w.pos + 1);
    goto value;

close:
    /* the container on top closes at w.pos */
    {
        frame *f = &stack[depth - 1];
        if (f->map) {
            w.objects += dict_cost(f->count);
            note_transient(&w, dict_transient(f->count));
        } else {
            w.objects += list_cost(f->count, 1);
            if (f->count) /* the item array it outgrew, alive while copied */
                note_transient(&w, alloc_cost(8 * f->count));
        }
        depth--;
        w.pos++;
    }

after:
    /* a value ended just before w.pos */
    w.pos = skip_ws(buf, len, w.pos);
    if (!depth) {
        if (w.pos != len)
            fail(&w, w.pos, "extra data after the top-level value");
        goto done;
    }
    if (w.pos >= len) {
        fail(&w, w.pos, stack[depth - 1].map ? "truncated: an object is not closed" : "truncated: an array is not closed");
        goto done;
    }
    if (buf[w.pos] == ',') {
        w.pos = skip_ws(buf, len, w.pos + 1);
        if (stack[depth - 1].map)
            goto key;
        goto value;
    }
    if (buf[w.pos] == (stack[depth - 1].map ? '}' : ']'))
        goto close;
    fail(&w, w.pos, stack[depth - 1].map ? "expected ',' or '}'" : "expected ',' or ']'");

done:
    free(stack);
    free(w.key_cache);
    if (out->status != APR_META_OK)
        return;
    json_plan(&w, &extra);
    out->estimate = with_overhead(w.objects + key_cache_cost(w.keys, 0) + extra);
}

/* --- the text json.loads parses -------------------------------------------- */
static const char HEX[] = "0123456789abcdef";

int apr_meta_json_text(const uint8_t *buf, size_t len, const apr_meta_scan *scan, void *out, uint64_t capacity)
{
    int kind = scan->text_kind;
    uint8_t *o1 = (uint8_t *)out;
    uint16_t *o2 = (uint16_t *)out;
    uint32_t *o4 = (uint32_t *)out;
    u64 n = 0;
    uint32_t widest = 0;
    size_t i = 0;
#define PUT(c)                                                                    \
    do {                                                                          \
        uint32_t c_ = (c);                                                        \
        if (n >= capacity)                                                        \
            return -1;                                                            \
        if (kind == 1)                                                            \
            o1[n] = (uint8_t)c_;                                                  \
        else if (kind == 2)                                                       \
            o2[n] = (uint16_t)c_;                                                 \
        else                                                                      \
            o4[n] = c_;                                                           \
        n++;                                                                      \
    } while (0)
#define PUT_ESCAPE(u)                                                             \
    do {                                                                          \
        uint32_t u_ = (u);                                                        \
        PUT('\\');                                                                \
        PUT('u');                                                                 \
        PUT(HEX[(u_ >> 12) & 15]);                                                \
        PUT(HEX[(u_ >> 8) & 15]);                                                 \
        PUT(HEX[(u_ >> 4) & 15]);                                                 \
        PUT(HEX[u_ & 15]);                                                        \
    } while (0)
    if (kind != 1 && kind != 2 && kind != 4)
        return -1;
    while (i < len) {
        uint32_t cp;
        int k, seq;
        if (kind == 1) {
            size_t run = ascii_run(buf + i, len - i);
            if (run > capacity - n)
                return -1;
            memcpy(o1 + n, buf + i, run);
            n += run;
            i += run;
            if (i >= len)
                break;
        } else if (buf[i] < 0x80) {
            PUT(buf[i]);
            i++;
            continue;
        }
        seq = apr_utf8_seq(buf + i, buf + len, &cp);
        if (!seq)
            return -1;
        i += (size_t)seq;
        k = cp_kind(cp);
        if (k <= kind) {
            PUT(cp);
            if (cp > widest)
                widest = cp;
        } else if (cp < 0x10000) {
            PUT_ESCAPE(cp);
        } else {
            PUT_ESCAPE(0xD800 + ((cp - 0x10000) >> 10));
            PUT_ESCAPE(0xDC00 + ((cp - 0x10000) & 0x3FF));
        }
    }
#undef PUT
#undef PUT_ESCAPE
    if (n != capacity)
        return -1;
    /* The str must be exactly as wide as its widest character (CPython's rule). */
    if (kind == 1 ? (widest > 0x7F) != (scan->text_maxchar == 0xFF) : cp_kind(widest) != kind)
        return -1;
    return 0;
}
