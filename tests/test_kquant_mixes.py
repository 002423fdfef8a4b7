"""llama.cpp's named mixes (Q4_K_M, Q5_K_M, Q4_K_S, Q5_K_S, Q6_K, Q8_0): the per-tensor
types of ``llama_tensor_get_type`` (aprfast.numerics.mixes) worked out by hand here
from llama-quant.cpp, and ``convert``/``apr convert``/``apr quantize`` writing them.
Byte for byte against llama-quantize itself: tests/engines/test_engines_mixes.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.convert import open_source, tensor_mix_types
from aprfast.errors import LayoutError
from aprfast.numerics.mixes import MIXES, NOT_OFFERED, MixParams, mix, mix_params, mix_types, quantizable

#: llama.cpp's use_more_bits(i, 10): the first eighth, the last eighth, every third between.
MORE_BITS_10 = {0, 3, 6, 8, 9}


def llama(n_layer=10, hidden=256, ff=512, vocab=64, tied=False, kv=128):
    """(name, shape) of a LLaMA in GGUF names, rows last (NumPy order)."""
    out = [("token_embd.weight", (vocab, hidden)), ("output_norm.weight", (hidden,))]
    if not tied:
        out.append(("output.weight", (vocab, hidden)))
    for i in range(n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (hidden,)), (b + "attn_q.weight", (hidden, hidden)),
                (b + "attn_k.weight", (kv, hidden)), (b + "attn_v.weight", (kv, hidden)),
                (b + "attn_output.weight", (hidden, hidden)), (b + "ffn_norm.weight", (hidden,)),
                (b + "ffn_gate.weight", (ff, hidden)), (b + "ffn_up.weight", (ff, hidden)),
                (b + "ffn_down.weight", (hidden, ff))]
    return out


def test_names_and_file_types():
    assert {n: m.ftype for n, m in MIXES.items()} == {
        "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13,
        "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30,
        "TQ1_0": 36, "TQ2_0": 37, "MXFP4_MOE": 38, "IQ3_S": 26, "IQ3_M": 27, "Q1_0": 40}
    assert mix("q4_k_m").name == "Q4_K_M" and mix("Q6_K").base == "Q6_K"
    assert mix("Q6_K", suffixed_only=True) is None and mix("Q4_K") is None and mix(3) is None


@pytest.mark.parametrize("name", ["Q4_K_M", "Q5_K_M"])
def test_m_mixes_give_more_bits_layers_q6_k(name):
    types = mix_types(name, llama())
    base = MIXES[name].base
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == base
    for i in range(10):
        want = "Q6_K" if i in MORE_BITS_10 else base
        assert types[f"blk.{i}.attn_v.weight"] == want, i
        assert types[f"blk.{i}.ffn_down.weight"] == want, i
        for t in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{t}.weight"] == base
    assert all(types[n] is None for n, _ in llama() if n.endswith("norm.weight"))


def test_s_mixes():
    types = mix_types("Q4_K_S", llama())
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(10)] == ["Q5_K"] * 4 + ["Q4_K"] * 6
    assert [types[f"blk.{i}.ffn_down.weight"] for i in range(10)] == ["Q5_K"] + ["Q4_K"] * 9  # i < 10/8
    types = mix_types("Q5_K_S", llama())
    assert {types[n] for n, s in llama() if len(s) == 2} == {"Q5_K", "Q6_K"} and types["output.weight"] == "Q6_K"


def test_single_type_mixes():
    q6 = mix_types("Q6_K", llama())
    assert {q6[n] for n, s in llama() if len(s) == 2} == {"Q6_K"}
    q8 = mix_types("Q8_0", llama())
    assert {q8[n] for n, s in llama() if len(s) == 2} == {"Q8_0"}
    q4 = mix_types("Q4_0", llama())
    assert q4["output.weight"] == "Q6_K" and q4["blk.0.attn_v.weight"] == "Q4_0"


def test_tied_embeddings_take_the_output_rule():
    types = mix_types("Q4_K_M", llama(tied=True))
    assert types["token_embd.weight"] == "Q6_K"


def test_fallbacks_for_rows_that_are_not_whole_blocks():
    types = mix_types("Q4_K_M", llama(n_layer=2, hidden=96, ff=200, kv=48))
    assert types["output.weight"] == "Q8_0"  # rows not whole Q4_K blocks
    assert types["token_embd.weight"] == "Q5_0" and types["blk.0.attn_q.weight"] == "Q5_0"
    assert types["blk.1.attn_v.weight"] == "Q8_0"  # Q6_K (more bits) -> Q8_0
    assert types["blk.0.ffn_down.weight"] == "F16"  # 200: not even whole 32-blocks
    assert mix_types("Q5_K_M", llama(n_layer=2, hidden=96))["blk.0.attn_q.weight"] == "Q5_1"
    assert mix_types("Q8_0", llama(n_layer=2, hidden=96, ff=200))["blk.0.ffn_down.weight"] == "F16"


def test_hyper_parameters():
    # LLaMA 70B (80 layers, grouped-query): attn_v's Q4_K becomes Q5_K
    params = mix_params({"general.architecture": "llama", "llama.block_count": 80, "llama.attention.head_count": 64,
                         "llama.attention.head_count_kv": 8})
    assert params.is_70b and params.n_gqa == 8
    types = mix_types("Q4_K_M", llama(n_layer=80), params)
    assert types["blk.20.attn_v.weight"] == "Q5_K" and types["blk.21.attn_v.weight"] == "Q6_K"  # (21-10)%3 == 2
    assert types["blk.20.ffn_down.weight"] == "Q4_K"  # the 70B rule is attn_v's only
    assert mix_types("Q4_K_M", llama(n_layer=80))["blk.20.attn_v.weight"] == "Q4_K"
    # eight experts: attn_v and attn_k Q8_0
    moe = MixParams("llama", 10, 32, 8, 8)
    types = mix_types("Q4_K_M", llama(), moe)
    assert types["blk.0.attn_v.weight"] == "Q8_0" and types["blk.0.attn_k.weight"] == "Q8_0"
    # Hugging Face config.json
    assert mix_params(config={"model_type": "mistral", "num_hidden_layers": 4, "num_attention_heads": 8,
                              "num_key_value_heads": 2}) == MixParams("llama", 4, 8, 2, 0)


def moe(n_expert=4, n_layer=2, hidden=256):
    """llama() with Mixtral's 3-D experts and routers instead of the dense MLP."""
    out = [(n, s) for n, s in llama(n_layer=n_layer, hidden=hidden) if ".ffn_" not in n or "norm" in n]
    for i in range(n_layer):
        out += [(f"blk.{i}.ffn_gate_inp.weight", (n_expert, hidden))]
        out += [(f"blk.{i}.ffn_{t}_exps.weight", (n_expert, hidden, hidden)) for t in ("gate", "up", "down")]
    return out


def test_iq4_mixes():
    for name in ("IQ4_NL", "IQ4_XS"):
        types = mix_types(name, llama(), MixParams("llama", 10, 4, 2))  # grouped-query factor 2
        assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == name
        assert [types[f"blk.{i}.ffn_down.weight"] for i in range(10)] == ["Q5_K"] + [name] * 9  # i < 10/8
        assert {types[f"blk.{i}.attn_v.weight"] for i in range(10)} == {name}
        gqa4 = mix_types(name, llama(), MixParams("llama", 10, 8, 2))
        assert {gqa4[f"blk.{i}.attn_v.weight"] for i in range(10)} == {"Q5_K"}
        odd = mix_types(name, llama(n_layer=2, hidden=96, ff=200, kv=48))
        assert odd["blk.0.attn_q.weight"] == "IQ4_NL" and odd["blk.0.ffn_down.weight"] == "F16"
        assert odd["output.weight"] == "Q8_0"  # 96: Q8_0 (IQ4_XS's blocks) or Q6_K's fallback (IQ4_NL)
        eight = mix_types(name, moe(8, n_layer=10), MixParams("llama", 10, 4, 2, 8))
        assert eight["blk.0.attn_output.weight"] == "Q5_K" and eight["blk.0.attn_v.weight"] == "Q8_0"
        assert eight["blk.0.ffn_down_exps.weight"] == "Q5_K" and eight["blk.1.ffn_up_exps.weight"] == name


def test_iq3_mixes():
    """IQ3_S: attn_v Q4_K at a grouped-query factor of 4 or more; IQ3_M: attn_v and attn_output
    Q4_K, ffn_down Q4_K in the first eighth (and the "more bits" layers with 8 experts)."""
    gqa2, gqa4 = MixParams("llama", 10, 4, 2), MixParams("llama", 10, 8, 2)
    types = mix_types("IQ3_S", llama(), gqa2)
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "IQ3_S"
    assert {types[n] for n, s in llama() if len(s) == 2} == {"IQ3_S", "Q6_K"}
    assert {mix_types("IQ3_S", llama(), gqa4)[f"blk.{i}.attn_v.weight"] for i in range(10)} == {"Q4_K"}
    m = mix_types("IQ3_M", llama(), gqa2)
    assert {m[f"blk.{i}.attn_v.weight"] for i in range(10)} == {"Q4_K"}
    assert {m[f"blk.{i}.attn_output.weight"] for i in range(10)} == {"Q4_K"}
    assert [m[f"blk.{i}.ffn_down.weight"] for i in range(10)] == ["Q4_K"] + ["IQ3_S"] * 9  # i < 10/8
    assert m["blk.3.attn_q.weight"] == m["blk.3.ffn_up.weight"] == m["token_embd.weight"] == "IQ3_S"
    for name in ("IQ3_S", "IQ3_M"):
        odd = mix_types(name, llama(n_layer=2, hidden=96, ff=200, kv=48))
        assert odd["blk.0.attn_q.weight"] == "IQ4_NL" and odd["blk.0.ffn_down.weight"] == "F16"
        eight = mix_types(name, moe(8, n_layer=10), MixParams("llama", 10, 4, 2, 8))
        assert eight["blk.0.attn_output.weight"] == "Q5_K" and eight["blk.0.attn_v.weight"] == "Q8_0"
    eight = mix_types("IQ3_M", moe(8, n_layer=10), MixParams("llama", 10, 4, 2, 8))
    assert [eight[f"blk.{i}.ffn_down_exps.weight"] for i in range(10)] == [
        "Q4_K" if i in MORE_BITS_10 else "IQ3_S" for i in range(10)]
    assert mix("IQ3_M", suffixed_only=True).base == "IQ3_S" and mix("IQ3_S", suffixed_only=True) is None


def test_q1_0_mix():
    types = mix_types("Q1_0", llama())
    assert types["output.weight"] == "Q6_K" and {types[n] for n, s in llama() if len(s) == 2} == {"Q1_0", "Q6_K"}
    assert mix_types("Q1_0", llama(tied=True))["token_embd.weight"] == "Q6_K"
    assert mix_types("Q1_0", llama(n_layer=2, hidden=384, ff=512))["output.weight"] == "Q8_0"  # Q6_K's fallback
    with pytest.raises(LayoutError, match="no fallback type for Q1_0"):
        mix_types("Q1_0", llama(n_layer=2, hidden=96))


def test_ternary_mixes():
    for name in ("TQ1_0", "TQ2_0"):
        types = mix_types(name, llama())
        assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
        assert {types[n] for n, s in llama() if len(s) == 2} - {"Q4_K", "Q6_K"} == {name}
        assert mix_types(name, llama(tied=True))["token_embd.weight"] == "Q6_K"
        assert mix_types(name, llama(n_layer=2, hidden=96))["blk.0.attn_q.weight"] == "Q4_0"


def test_mxfp4_moe_mix():
    types = mix_types("MXFP4_MOE", moe())
    assert types["output.weight"] == types["token_embd.weight"] == types["blk.0.attn_q.weight"] == "Q8_0"
    assert {types[f"blk.{i}.ffn_{t}_exps.weight"] for i in range(2) for t in ("gate", "up", "down")} == {"MXFP4"}
    assert types["blk.0.ffn_gate_inp.weight"] is None  # the router is never quantized
    assert types["blk.0.ffn_norm.weight"] is None
    assert mix_types("MXFP4_MOE", moe(n_expert=1))["blk.0.ffn_up_exps.weight"] == "Q8_0"  # ne[2] == 1
    dense = mix_types("MXFP4_MOE", llama())
    assert {dense[n] for n, s in llama() if len(s) == 2} == {"Q8_0"}
    assert MIXES["MXFP4_MOE"].types == ("MXFP4", "Q8_0") and MIXES["MXFP4_MOE"].suffixed


@pytest.mark.parametrize("name", sorted(NOT_OFFERED))
def test_mixes_not_offered_say_why(name):
    with pytest.raises(LayoutError, match=f"{name} mix is not offered: .*(importance matrix|quantizer|file type)"):
        mix(name)
    with pytest.raises(LayoutError, match="not offered"):
        mix_types(name, llama())
    if name in ("Q2_K_S", "IQ2_M", "IQ3_XS"):  # not GGML type names: a mix whatever the destination
        with pytest.raises(LayoutError, match="not offered"):
            mix(name, suffixed_only=True)
    else:
        assert mix(name, suffixed_only=True) is None


def test_cli_refuses_mixes_not_offered_as_usage_errors(gguf_model, tmp_path, capsys):
    src, _ = gguf_model
    assert main(["convert", str(src), str(tmp_path / "x.gguf"), "--quantize", "q2_k_s"]) == 2
    assert "Q2_K_S mix is not offered: needs an importance matrix" in capsys.readouterr().err
    assert main(["quantize", str(src), str(tmp_path / "x.apr"), "--type", "iq2_m"]) == 2
    assert "IQ2_M mix is not offered: needs an importance matrix" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.apr").exists()


def test_what_is_never_quantized():
    assert not quantizable("blk.0.ffn_gate_inp.weight", (8, 256))
    assert not quantizable("position_embd.weight", (8, 256))
    assert not quantizable("blk.0.attn_q.bias", (256, 1))
    assert quantizable("blk.0.ffn_up_exps.weight", (8, 512, 256))


def test_hugging_face_names_read_as_gguf_names():
    hf = [("model.embed_tokens.weight", (64, 256)), ("lm_head.weight", (64, 256))]
    hf += [(f"model.layers.{i}.self_attn.v_proj.weight", (128, 256)) for i in range(10)]
    types = tensor_mix_types("Q4_K_M", hf)
    assert types["lm_head.weight"] == "Q6_K" and types["model.embed_tokens.weight"] == "Q4_K"
    assert [types[f"model.layers.{i}.self_attn.v_proj.weight"] for i in range(10)] == \
        ["Q6_K" if i in MORE_BITS_10 else "Q4_K" for i in range(10)]


@pytest.fixture
def gguf_model(tmp_path):
    rng = np.random.default_rng(5)
    tensors = {name: (0.05 * rng.standard_normal(shape) + (1.0 if len(shape) == 1 else 0.0)).astype(np.float32)
               for name, shape in llama(n_layer=3)}
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, metadata={"general.architecture": "llama", "llama.block_count": 3})
    return path, tensors


def _gguf_types(path):
    source = open_source(str(path))
    try:
        return {s.name: s.dtype.name for s in source.specs}, source.metadata
    finally:
        source.close()


def test_convert_writes_the_mix(gguf_model, tmp_path):
    src, tensors = gguf_model
    out = tmp_path / "m.gguf"
    aprfast.convert(src, out, quantize="q4_k_m", max_drift=None)
    got, metadata = _gguf_types(out)
    want = mix_types("Q4_K_M", [(n, v.shape) for n, v in tensors.items()])
    assert got == {n: t or "F32" for n, t in want.items()}
    assert metadata["general.file_type"] == 15 and metadata["general.quantization_version"] == 2
    source = open_source(str(out))
    try:
        for spec in source.specs:
            if want[spec.name]:  # the bytes are aprfast.quantize's of the same values
                expected = aprfast.quantize(tensors[spec.name], want[spec.name])
                assert np.asarray(source.read(spec).data).tobytes() == expected.data.tobytes(), spec.name
    finally:
        source.close()


def test_a_bare_type_name_is_the_mix_only_for_a_gguf_model(gguf_model, tmp_path):
    src, _ = gguf_model
    aprfast.convert(src, tmp_path / "m6.gguf", quantize="Q6_K", max_drift=None)
    got, metadata = _gguf_types(tmp_path / "m6.gguf")
    assert metadata["general.file_type"] == 18 and got["blk.0.attn_q.weight"] == "Q6_K"
    aprfast.convert(src, tmp_path / "m4.gguf", quantize="Q4_0", max_drift=None)
    assert _gguf_types(tmp_path / "m4.gguf")[0]["output.weight"] == "Q6_K"  # llama.cpp's Q4_0 file type
    aprfast.convert(src, tmp_path / "m4.apr", quantize="Q4_0", max_drift=None)
    with aprfast.open(tmp_path / "m4.apr") as f:  # not GGUF: the type, everywhere it fits
        assert f.info("output.weight").dtype.name == "Q4_0"


def test_q3_k_and_q2_k_mixes(gguf_model, tmp_path):
    src, tensors = gguf_model
    for name in ("Q3_K_M", "Q2_K"):
        out = tmp_path / f"{name}.gguf"
        aprfast.convert(src, out, quantize=name, max_drift=None)
        got, metadata = _gguf_types(out)
        want = mix_types(name, [(n, v.shape) for n, v in tensors.items()])
        assert got == {n: t or "F32" for n, t in want.items()} and metadata["general.file_type"] == MIXES[name].ftype
    assert want["blk.0.ffn_down.weight"] == "Q3_K" and want["blk.0.attn_q.weight"] == "Q2_K"
    assert main(["convert", str(src), str(tmp_path / "x.gguf"), "--quantize", "q9_k_m"]) == 2


def test_cli(gguf_model, tmp_path, capsys):
    src, tensors = gguf_model
    assert main(["convert", str(src), str(tmp_path / "c.gguf"), "--quantize", "Q5_K_M", "--max-drift", "off"]) == 0
    got, metadata = _gguf_types(tmp_path / "c.gguf")
    want = mix_types("Q5_K_M", [(n, v.shape) for n, v in tensors.items()])
    assert got == {n: t or "F32" for n, t in want.items()} and metadata["general.file_type"] == 17
    capsys.readouterr()
    assert main(["quantize", "--json", str(src), str(tmp_path / "q.apr"), "--type", "q4_k_m"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["type"] == "Q4_K_M"
    want = mix_types("Q4_K_M", [(n, v.shape) for n, v in tensors.items()])
    assert {n: t["type"] for n, t in result["tensors"].items()} == want
    assert result["tensors"]["output_norm.weight"]["reason"] == "llama.cpp's mix does not quantize it"
