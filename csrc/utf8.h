/* UTF-8 as Python's strict decoder accepts it (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF): one rule for every validator in aprfast, the
 * metadata walker (metascan.c) and the tensor-index parser (_index.pyx).
 *
 * Header-only: every function is static inline. */
#ifndef APRFAST_UTF8_H
#define APRFAST_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid multi-byte UTF-8 sequence at p (2-4, *cp set) or 0 if
 * invalid; p < end, and p[0] >= 0x80 (ASCII is the caller's fast path). */
static inline int apr_utf8_seq(const uint8_t *p, const uint8_t *end, uint32_t *cp)
{
    uint8_t b0 = p[0], lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (end - p < 2 || (p[1] & 0xC0) != 0x80)
            return 0;
        *cp = ((uint32_t)(b0 & 0x1F) << 6) | (p[1] & 0x3F);
        return 2;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (end - p < 3)
            return 0;
        if (b0 == 0xE0)
            lo = 0xA0;
        else if (b0 == 0xED)
            hi = 0x9F;
        if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80)
            return 0;
        *cp = ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
        return 3;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (end - p < 4)
            return 0;
        if (b0 == 0xF0)
            lo = 0x90;
        else if (b0 == 0xF4)
            hi = 0x8F;
        if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        *cp = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) | ((uint32_t)(p[2] & 0x3F) << 6)
            | (p[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* -1 if p[0..n) is valid UTF-8, else the offset of the first invalid sequence. */
static inline ptrdiff_t apr_utf8_error(const uint8_t *p, size_t n)
{
    const uint8_t *s = p, *end = p + n;
    uint32_t cp;
    while (s < end) {
        if (*s < 0x80) {
            s++;
            continue;
        }
        int len = apr_utf8_seq(s, end, &cp);
        if (!len)
            return s - p;
        s += len;
    }
    return -1;
}

#endif
