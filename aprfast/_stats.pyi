from typing import Optional

import numpy as np
from typing_extensions import Buffer

KINDS: dict[str, int]
ITEMSIZE: dict[str, int]
MOMENTS: int
HIST: int
MAX_BINS: int

def compute(kind: str, data: Buffer, want: int, counts: Optional[np.ndarray] = None, lo: float = 0.0,
            hi: float = 0.0, threads: int = 0) -> dict: ...
def compute_quant(qtype: int, data: Buffer, rows: int, row: int, want: int, counts: Optional[np.ndarray] = None,
                  lo: float = 0.0, hi: float = 0.0, threads: int = 0) -> dict: ...
def default_threads() -> int: ...
