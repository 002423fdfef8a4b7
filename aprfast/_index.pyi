from typing import Any

import numpy as np

RULE_UNKNOWN: int
RULE_FIXED: int
RULE_ROW_BLOCKS: int
RULE_FLAT_BLOCKS: int
RULE_SCALE_PLUS_ONE: int

class Entries:
    blob: Any
    count: int
    fields: np.ndarray
    extents: np.ndarray
    dims: np.ndarray
    name_start: np.ndarray
    name_len: np.ndarray
    dtype_id: np.ndarray
    ndim: np.ndarray
    dim_start: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    raw_size: np.ndarray
    flags: np.ndarray
    def shape(self, i: int) -> tuple[int, ...]: ...
    def names(self) -> list[str]: ...

def decode_names(blob: Any, fields: np.ndarray) -> list[str]: ...
def parse_entries(blob: Any, start: int, end: int, count: int, spec_layout: bool, max_dims: int,
                  max_name_bytes: int) -> tuple[Entries, int]: ...
def check_entries(entries: Entries, rule: np.ndarray, rule_a: np.ndarray, rule_b: np.ndarray, data_len: int,
                  strict_dtypes: bool, names: list[str], pad_to: int = 1) -> int: ...
def names_strictly_sorted(blob: Any, fields: np.ndarray) -> bool: ...
def encode_entries(tensors: list[Any], offsets: list[int], id_of: dict[Any, int], spec_layout: bool) -> bytes: ...
def lay_out(tensors: list[Any], alignment: int) -> tuple[list[int], list[int], int]: ...
def all_rows(entries: Entries, data_start: int) -> list[tuple[int, int, int, tuple[int, ...]]]: ...
