"""The benchmark models, importable without torch (fresh-process children use them)."""

import numpy as np


def model(name: str, scale: float) -> dict:
    """One benchmark model, built only when asked for (the large one is 504 MiB).

    "large": 200 float32 tensors of 645x1024 (504 MiB; --quick scales the rows to 1/8);
    "small": 50 of 80x256 (3.9 MiB); "tiny": 10,000 of 256 floats; "index": 100,000
    of 16 floats (for the inspect row); "million": 1,000,000 of 4 floats (for
    bench_inspect.py; views of one array, so building it takes seconds, not minutes)."""
    rng = np.random.default_rng(0)
    if name == "large":
        rows = max(8, int(645 * scale))
        return {f"layers.{i:03d}.weight": rng.standard_normal((rows, 1024), dtype=np.float32)
                for i in range(200)}
    if name == "small":
        return {f"layers.{i:02d}.weight": rng.standard_normal((80, 256), dtype=np.float32) for i in range(50)}
    if name == "index":
        return {f"t.{i:06d}": rng.standard_normal(16, dtype=np.float32) for i in range(100_000)}
    if name == "million":
        data = rng.standard_normal((1_000_000, 4), dtype=np.float32)
        return {f"t.{i:07d}": data[i] for i in range(1_000_000)}
    if name == "tiny":
        return {f"t.{i:05d}": rng.standard_normal(256, dtype=np.float32) for i in range(10_000)}
    raise ValueError(f"unknown model {name!r}")
