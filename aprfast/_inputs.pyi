from collections.abc import Callable, Mapping
from typing import Any

class TensorInput:
    name: str
    dtype: Any
    shape: tuple[int, ...]
    data: Any
    nbytes: int
    def __init__(self, name: str, dtype: Any, shape: tuple[int, ...], data: Any, nbytes: int) -> None: ...

def inputs_of(tensors: Mapping[str, Any], native: dict[Any, Any],
              fallback: Callable[[str, Any], TensorInput]) -> list[TensorInput]: ...
