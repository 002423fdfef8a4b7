"""The timing loop every benchmark script shares."""

import gc
import time


def best(fn, repeat, min_sample=0.0):
    """Best per-call time over ``repeat`` samples after one warm-up call (page cache,
    first touch, code paths).  Like timeit, each sample loops the call enough times to
    last ``min_sample`` seconds, so fast calls are not timer noise; 0 times one call per
    sample.  On a shared machine the best sample is the one no other process disturbed."""
    fn()
    number = 1
    while min_sample > 0:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_sample or number >= 1_000_000:
            break
        number *= max(2, min(10, int(min_sample / max(elapsed, 1e-9)) + 1))
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return min(times)
