"""F16 and BF16 GGUFs (issue 26 item 4): ``precision="f16"``/``"bf16"`` gives the file
``convert_hf_to_gguf.py --outtype f16``/``bf16`` writes (2-D weights in the type; 1-D
tensors and norms F32), byte for byte, and llama.cpp runs it.

llama.cpp multiplies F16/BF16 weights by activations rounded to the same type, so its
logits are not transformers' float32 ones to 1e-4: measured on these models 4e-4 to 9e-4
(F16) and 3e-3 to 9e-3 (BF16), and as far from transformers running the same rounded
weights in float32.  The bounds below are about twice that; the file being the
reference's, llama.cpp's logits are the reference file's exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from gguf_compare import differences
from gguf_compare import read as read_gguf
from test_engines_llama import llama_cpp_logits

import aprfast

ARCHS = list(tiny_models.ARCHS)
#: max |llama.cpp - transformers (float32)| over the logits, by precision
TOLERANCE = {"f16": 2e-3, "bf16": 2e-2}
FILE_TYPE = {"f16": 1, "bf16": 32}  # MOSTLY_F16, MOSTLY_BF16


@pytest.fixture(scope="module")
def half(tiny_model, tmp_path_factory):
    done = {}

    def get(arch, precision):
        if (arch, precision) not in done:
            directory, _ = tiny_model(arch)
            out = tmp_path_factory.mktemp(f"gguf-{arch}-{precision}") / "model.gguf"
            aprfast.convert(directory, out, precision=precision)
            done[arch, precision] = out
        return done[arch, precision]

    return get


def _pre(path) -> str:
    return read_gguf(path)[0]["tokenizer.ggml.pre"][1]


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_gguf_is_the_reference_converters(arch, precision, tiny_model, half, reference_converter, tmp_path):
    directory, _ = tiny_model(arch)
    ours = half(arch, precision)
    reference = reference_converter(directory, tmp_path / "reference.gguf", precision, _pre(ours))
    assert differences(ours, reference) == []
    keys, tensors = read_gguf(ours)
    assert keys["general.file_type"] == (["UINT32"], FILE_TYPE[precision])
    assert tensors["blk.0.attn_q.weight"][0] == precision.upper() and tensors["output_norm.weight"][0] == "F32"


@pytest.mark.parametrize("precision", ["f16", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_runs_the_half_gguf(arch, precision, tiny_model, half, llama_cpp_lib):
    _, model = tiny_model(arch)
    got = llama_cpp_logits(llama_cpp_lib, half(arch, precision))
    assert np.abs(got - tiny_models.hf_logits(model)).max() <= TOLERANCE[precision]
