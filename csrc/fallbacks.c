#include "fallbacks.h"

#include "cpu.h" /* APR_LOAD_RELAXED / APR_STORE_RELAXED */

/* Read by any thread, GIL or not; a relaxed atomic, as nothing else is published
 * through it (a read racing a change takes either path, both correct). */
static unsigned int forced;

void apr_set_fallbacks(unsigned int flags) { APR_STORE_RELAXED(&forced, flags & APR_FALLBACK_ALL); }

unsigned int apr_fallbacks(void) { return APR_LOAD_RELAXED(&forced); }
