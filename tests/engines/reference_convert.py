"""Run llama.cpp's ``convert_hf_to_gguf.py`` (from the llama-cpp-python sdist's
``vendor/llama.cpp``) on a model directory, as the second oracle of the engine tests.

The converter names the BPE pre-tokenizer from a hash of how the tokenizer splits a
fixed text, and refuses tokenizers it has no hash for, as every tokenizer trained in a
test is.  This wrapper answers that one question with ``--pre`` (what aprfast writes
for the architecture) and leaves everything else to the converter.

Usage: python reference_convert.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf OUTTYPE PRE
"""

import sys
from pathlib import Path


def main() -> None:
    llama_cpp, model, out, outtype, pre = sys.argv[1:6]
    sys.path.insert(0, str(Path(llama_cpp) / "gguf-py"))
    sys.path.insert(0, llama_cpp)
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", outtype]
    import runpy

    runpy.run_path(str(Path(llama_cpp) / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
