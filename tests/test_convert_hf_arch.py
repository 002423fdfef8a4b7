"""Hugging Face <-> GGUF model conversions without the engines (issue 26): the tables,
the rotary permutation, the keys and their types, the way back.  tests/engines proves
the same files against llama.cpp, its converter and transformers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import aprfast
from aprfast.convert import DestinationExistsError, hf_arch
from aprfast.numerics.quantization import quantize
from aprfast.tensors import RawTensor

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

VOCAB = ["<s>", "</s>", "a", "b", "c", "ab", "abc", "Ġa"]


def _reference_permute(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("rows,heads", [(64, 4), (32, 2), (16, 1)])
def test_rope_rows_is_the_reference_permutation_and_argsort_undoes_it(rows, heads):
    w = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    order = hf_arch.rope_rows(rows, heads)
    assert np.array_equal(hf_arch.permute_rows(w, order), _reference_permute(w, heads))
    assert np.array_equal(hf_arch.permute_rows(hf_arch.permute_rows(w, order), np.argsort(order)), w)
    with pytest.raises(aprfast.LayoutError):
        hf_arch.rope_rows(rows + 1, heads)


def test_permuting_quantized_rows_moves_whole_blocks():
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    order = hf_arch.rope_rows(8, 2)
    packed = quantize(w, "Q8_0")
    moved = hf_arch.permute_rows(packed, order)
    assert isinstance(moved, RawTensor)
    assert moved.data.tobytes() == quantize(w[order], "Q8_0").data.tobytes()


def test_names_both_ways():
    for hf, gg in hf_arch.TENSORS:
        concrete = hf.replace("{n}", "3").replace("{w}", "weight")
        want = None if gg is None else gg.replace("{n}", "3").replace("{w}", "weight")
        assert hf_arch.hf_to_gguf_name(concrete) == want
        if want is not None:
            assert hf_arch.gguf_to_hf_name(want) == concrete
    assert hf_arch.hf_to_gguf_name("vision_tower.x") is ...
    assert hf_arch.hf_to_gguf_name("model.layers.0.self_attn.q_proj.bias") == "blk.0.attn_q.bias"


@pytest.mark.parametrize("name", ["llama-bpe", "qwen2"])
def test_pre_tokenizer_is_read_from_the_regex(name):
    split = {"type": "Split", "pattern": {"Regex": hf_arch.PRE_TOKENIZER_REGEX[name]}, "behavior": "Isolated"}
    pre = {"type": "Sequence", "pretokenizers": [split, {"type": "ByteLevel", "use_regex": False}]}
    assert hf_arch.pre_tokenizer_name({"pre_tokenizer": pre}) == name
    assert hf_arch.pre_tokenizer_name({"pre_tokenizer": {"type": "ByteLevel"}}) == "gpt-2"
    assert hf_arch.pre_tokenizer_name({"pre_tokenizer": {"type": "Whitespace"}}) is None


def _model_dir(path, *, model_type="llama", tie=False, rope=None):
    """A tiny LLaMA-shaped checkpoint written with NumPy: hidden 16, 2 heads, 1 KV head."""
    rng = np.random.default_rng(1)
    hidden, heads, kv, ff, layers, vocab = 16, 2, 1, 32, 2, len(VOCAB)
    head = hidden // heads

    def w(*shape):
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": 1 + w(hidden)}
    if not tie:
        tensors["lm_head.weight"] = w(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": 1 + w(hidden), p + "post_attention_layernorm.weight":
                        1 + w(hidden), p + "self_attn.q_proj.weight": w(heads * head, hidden),
                        p + "self_attn.k_proj.weight": w(kv * head, hidden),
                        p + "self_attn.v_proj.weight": w(kv * head, hidden),
                        p + "self_attn.o_proj.weight": w(hidden, heads * head),
                        p + "mlp.gate_proj.weight": w(ff, hidden), p + "mlp.up_proj.weight": w(ff, hidden),
                        p + "mlp.down_proj.weight": w(hidden, ff)})
    path.mkdir()
    safetensors_numpy.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": model_type, "hidden_size": hidden,
              "intermediate_size": ff, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
              "vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": tie,
              "rope_theta": 500000.0}
    if rope:
        config["rope_scaling"] = rope
    (path / "config.json").write_text(json.dumps(config))
    added = [{"id": i, "content": t, "special": True, "normalized": False} for i, t in enumerate(VOCAB[:2])]
    tokenizer = {"added_tokens": added, "pre_tokenizer": {"type": "ByteLevel", "use_regex": True},
                 "post_processor": {"type": "ByteLevel"},
                 "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(VOCAB)},
                           "merges": [["a", "b"], ["ab", "c"]]}}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tensors


def _read(path):
    reader = gguf.GGUFReader(path)
    keys = {k: ([gguf.GGUFValueType(t).name for t in f.types], f.contents()) for k, f in reader.fields.items()
            if not k.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type.name, np.array(t.data)) for t in reader.tensors}
    return keys, tensors


def test_hugging_face_to_gguf_and_back(tmp_path):
    tensors = _model_dir(tmp_path / "hf")
    report = aprfast.convert(tmp_path / "hf", tmp_path / "m.gguf")
    assert report["names"]["direction"] == "hf-to-gguf" and report["arch"] == "llama"
    assert len(report["names"]["permuted"]) == 4
    keys, out = _read(tmp_path / "m.gguf")
    assert keys["general.architecture"] == (["STRING"], "llama")
    for key in ("llama.block_count", "llama.attention.head_count_kv", "general.file_type", "llama.vocab_size",
                "tokenizer.ggml.bos_token_id"):
        assert keys[key][0] == ["UINT32"], key
    assert keys["general.file_type"][1] == 0
    assert keys["llama.rope.freq_base"] == (["FLOAT32"], 500000.0)
    assert keys["llama.rope.dimension_count"][1] == 8
    assert keys["tokenizer.ggml.model"][1] == "gpt2" and keys["tokenizer.ggml.pre"][1] == "gpt-2"
    assert keys["tokenizer.ggml.tokens"][1] == VOCAB
    assert keys["tokenizer.ggml.token_type"][1] == [3, 3, 1, 1, 1, 1, 1, 1]
    assert keys["tokenizer.ggml.merges"][1] == ["a b", "ab c"]
    assert keys["tokenizer.ggml.add_bos_token"] == (["BOOL"], False)
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    assert np.array_equal(out["blk.1.attn_q.weight"][1], _reference_permute(q, 2))
    k = tensors["model.layers.1.self_attn.k_proj.weight"]
    assert np.array_equal(out["blk.1.attn_k.weight"][1], _reference_permute(k, 1))
    assert np.array_equal(out["blk.0.ffn_up.weight"][1], tensors["model.layers.0.mlp.up_proj.weight"])

    report = aprfast.convert(tmp_path / "m.gguf", f"{tmp_path / 'back'}/")
    assert report["names"]["direction"] == "gguf-to-hf"
    back = safetensors_numpy.load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(tensors)
    assert all(back[n].tobytes() == tensors[n].tobytes() for n in tensors)
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 1
    tokenizer = json.loads((tmp_path / "back" / "tokenizer.json").read_text())
    assert tokenizer["model"]["vocab"] == {t: i for i, t in enumerate(VOCAB)}
    assert tokenizer["model"]["merges"] == [["a", "b"], ["ab", "c"]]
    # the side files are not overwritten without force
    with pytest.raises(DestinationExistsError, match="config.json"):
        aprfast.convert(tmp_path / "m.gguf", f"{tmp_path / 'back'}/")


def test_keys_from_a_gguf_without_the_recorded_config(tmp_path):
    _model_dir(tmp_path / "hf", tie=True)
    aprfast.convert(tmp_path / "hf", tmp_path / "m.gguf")
    keys, _ = _read(tmp_path / "m.gguf")
    assert "output.weight" not in _read(tmp_path / "m.gguf")[1]
    # a GGUF from another converter has no aprfast.hf.config: the config is built from the keys
    aprfast.convert(tmp_path / "m.gguf", tmp_path / "plain.apr")
    with aprfast.open(tmp_path / "plain.apr") as f:
        metadata = dict(f.metadata)
    assert hf_arch.HF_CONFIG_KEY in metadata
    kv = {k: v[1] for k, v in keys.items() if k != hf_arch.HF_CONFIG_KEY}
    kv["tokenizer.ggml.tokens"] = VOCAB
    files = hf_arch.hf_files(hf_arch.ARCHS["llama"], kv, [], "F32")
    config = files["config.json"]
    assert config["tie_word_embeddings"] is True and "head_dim" not in config
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (16, 2, 1)
    assert config["rope_parameters"]["rope_theta"] == 500000.0 and config["vocab_size"] == len(VOCAB)


def test_names_keep_and_unknown_architectures(tmp_path):
    _model_dir(tmp_path / "hf")
    report = aprfast.convert(tmp_path / "hf", tmp_path / "kept.gguf", names="keep")
    assert report["names"] is None and "model.embed_tokens.weight" in _read(tmp_path / "kept.gguf")[1]
    _model_dir(tmp_path / "other", model_type="somethingnew")
    with pytest.warns(hf_arch.ModelConversionWarning, match="somethingnew"):
        aprfast.convert(tmp_path / "other", tmp_path / "other.gguf")
    with pytest.raises(ValueError, match="names="):
        aprfast.convert(tmp_path / "hf", tmp_path / "x.gguf", names="canonical")


def test_unwritten_rope_scaling_is_warned_and_linear_is_written(tmp_path):
    _model_dir(tmp_path / "a", rope={"rope_type": "dynamic", "factor": 8.0})  # (llama3: tests/test_convert_rope.py)
    with pytest.warns(hf_arch.ModelConversionWarning, match="dynamic"):
        aprfast.convert(tmp_path / "a", tmp_path / "a.gguf")
    _model_dir(tmp_path / "b", rope={"type": "linear", "factor": 2.0})
    aprfast.convert(tmp_path / "b", tmp_path / "b.gguf")
    keys, _ = _read(tmp_path / "b.gguf")
    assert keys["llama.rope.scaling.type"][1] == "linear" and keys["llama.rope.scaling.factor"][1] == 2.0


def test_file_type_follows_the_tensors(tmp_path):
    _model_dir(tmp_path / "hf")
    # (Q8_0: hidden 16 rows do not fit its 32-element blocks; tests/engines has it)
    for options, want, norm in (({"precision": "f16"}, 1, "F32"), ({"precision": "bf16"}, 32, "F32")):
        out = tmp_path / f"{want}.gguf"
        aprfast.convert(tmp_path / "hf", out, **options)
        keys, tensors = _read(out)
        assert keys["general.file_type"][1] == want
        assert tensors["blk.0.attn_norm.weight"][0] == norm  # llama.cpp takes norms in F32 only


@pytest.mark.parametrize("family", sorted(hf_arch.FAMILY_TENSORS))
def test_family_names_both_ways(family):
    for hf, gg in hf_arch.FAMILY_TENSORS[family]:
        if "{x}" in hf:  # a wildcard row only drops
            assert gg is None
            continue
        concrete = hf.replace("{n}", "3").replace("{w}", "weight")
        base = concrete.split("]", 1)[1] if concrete.startswith("[") else concrete
        want = None if gg is None else gg.replace("{n}", "3").replace("{w}", "weight")
        assert hf_arch.hf_to_gguf_name(base, family) == want
        if concrete.startswith("["):  # the task model's prefix is read, and not written back
            assert hf_arch.hf_to_gguf_name(concrete[1:].replace("]", "", 1), family) == want
        if want is not None and not base.endswith((".gamma", ".beta")):  # TF-era names: read only
            assert hf_arch.gguf_to_hf_name(want, family) == base
    assert hf_arch.hf_to_gguf_name("model.layers.0.self_attn.q_proj.weight", family) is ...


def _gpt2_dir(path):
    """A GPT-2-shaped checkpoint written with NumPy: n_embd 16, 2 heads, Conv1D weights
    stored [in, out], tied output."""
    rng = np.random.default_rng(2)
    n, layers, vocab, ctx = 16, 2, len(VOCAB), 32

    def w(*shape):
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"transformer.wte.weight": w(vocab, n), "transformer.wpe.weight": w(ctx, n),
               "transformer.ln_f.weight": 1 + w(n), "transformer.ln_f.bias": w(n)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        tensors.update({p + "ln_1.weight": 1 + w(n), p + "ln_1.bias": w(n), p + "ln_2.weight": 1 + w(n),
                        p + "ln_2.bias": w(n), p + "attn.c_attn.weight": w(n, 3 * n), p + "attn.c_attn.bias": w(3 * n),
                        p + "attn.c_proj.weight": w(n, n), p + "attn.c_proj.bias": w(n),
                        p + "mlp.c_fc.weight": w(n, 4 * n), p + "mlp.c_fc.bias": w(4 * n),
                        p + "mlp.c_proj.weight": w(4 * n, n), p + "mlp.c_proj.bias": w(n)})
    path.mkdir()
    safetensors_numpy.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": n, "n_layer": layers,
              "n_head": 2, "n_positions": ctx, "n_ctx": ctx, "n_inner": None, "layer_norm_epsilon": 1e-5,
              "vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 1}
    (path / "config.json").write_text(json.dumps(config))
    return tensors


def test_gpt2_conv1d_weights_are_transposed_both_ways(tmp_path):
    tensors = _gpt2_dir(tmp_path / "hf")
    report = aprfast.convert(tmp_path / "hf", tmp_path / "m.gguf")
    assert report["arch"] == "gpt2" and len(report["names"]["transposed"]) == 8
    keys, out = _read(tmp_path / "m.gguf")
    assert keys["general.architecture"][1] == "gpt2" and "output.weight" not in out
    assert keys["gpt2.feed_forward_length"] == (["UINT32"], 64) and keys["gpt2.context_length"][1] == 32
    assert keys["gpt2.attention.layer_norm_epsilon"][0] == ["FLOAT32"]
    qkv = tensors["transformer.h.1.attn.c_attn.weight"]
    assert np.array_equal(out["blk.1.attn_qkv.weight"][1], qkv.T)  # llama.cpp: [out, in], as a Linear
    assert np.array_equal(out["blk.1.attn_qkv.bias"][1], tensors["transformer.h.1.attn.c_attn.bias"])
    aprfast.convert(tmp_path / "m.gguf", f"{tmp_path / 'back'}/")
    back = safetensors_numpy.load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(tensors)
    assert all(back[n].tobytes() == tensors[n].tobytes() for n in tensors)
    # a GGUF with no recorded config.json: GPT2Config's fields from the keys
    kv = {k: v[1] for k, v in keys.items() if k != hf_arch.HF_CONFIG_KEY}
    specs = [SimpleNamespace(name=n, shape=v.shape) for n, v in back.items()]
    config = hf_arch.hf_files(hf_arch.ARCHS["gpt2"], kv, specs, "F32")["config.json"]
    assert (config["n_embd"], config["n_head"], config["n_layer"], config["n_positions"]) == (16, 2, 2, 32)
    assert config["n_inner"] is None and config["vocab_size"] == len(VOCAB) and config["tie_word_embeddings"]


def test_gpt2_quantized_conv1d_weights_dequantize_then_transpose(tmp_path):
    tensors = _gpt2_dir(tmp_path / "hf")
    aprfast.convert(tmp_path / "hf", tmp_path / "q.gguf", quantize="Q8_0")
    keys, out = _read(tmp_path / "q.gguf")
    assert out["blk.0.ffn_down.weight"][0] == "Q8_0" and out["position_embd.weight"][0] == "F32"
    aprfast.convert(tmp_path / "q.gguf", f"{tmp_path / 'back'}/")
    back = safetensors_numpy.load_file(tmp_path / "back" / "model.safetensors")
    down = tensors["transformer.h.0.mlp.c_proj.weight"]
    assert back["transformer.h.0.mlp.c_proj.weight"].shape == down.shape
    assert np.abs(back["transformer.h.0.mlp.c_proj.weight"] - down).max() < 2e-3


def test_bert_task_model_names_and_tf_layer_norms():
    assert hf_arch.hf_to_gguf_name("bert.encoder.layer.2.output.LayerNorm.gamma", "bert") == \
        "blk.2.layer_output_norm.weight"
    back = "encoder.layer.2.output.LayerNorm.weight"  # BertModel's: the task model's prefix is not written
    assert hf_arch.gguf_to_hf_name("blk.2.layer_output_norm.weight", "bert") == back
    for dropped in ("cls.predictions.decoder.weight", "bert.pooler.dense.bias", "embeddings.position_ids"):
        assert hf_arch.hf_to_gguf_name(dropped, "bert") is None


def test_wordpiece_vocabulary_and_special_tokens():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "##lo": 5}
    added = [{"id": i, "content": t, "special": True} for t, i in list(vocab.items())[:4]]
    cls_sep = [{"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "[SEP]"}}]
    pair = cls_sep + [{"Sequence": {"id": "B"}}, {"SpecialToken": {"id": "[SEP]"}}]
    tokenizer = {"added_tokens": added, "normalizer": {"type": "BertNormalizer", "lowercase": False},
                 "post_processor": {"type": "TemplateProcessing", "single": cls_sep, "pair": pair},
                 "model": {"type": "WordPiece", "vocab": vocab}}
    config = {"model_type": "bert", "vocab_size": 7, "type_vocab_size": 2, "pad_token_id": 0, "hidden_size": 8,
              "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 32}
    files = {"config.json": config,
             "tokenizer.json": tokenizer,
             "tokenizer_config.json": {"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]"}}
    keys = {k: v for k, _, v in hf_arch.gguf_keys(hf_arch.ARCHS["bert"], files, 0, "tiny")}
    assert keys["bert.attention.causal"] is False and "bert.pooling_type" not in keys  # no sentence-transformers
    assert keys["tokenizer.ggml.tokens"] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581hello", "lo", "[PAD6]"]
    assert keys["tokenizer.ggml.token_type"] == [3, 3, 3, 3, 1, 1, 5]
    assert (keys["tokenizer.ggml.bos_token_id"], keys["tokenizer.ggml.eos_token_id"]) == (2, 3)
    assert keys["tokenizer.ggml.add_bos_token"] and keys["tokenizer.ggml.add_eos_token"]
    assert keys["tokenizer.ggml.add_sep_token"] is False and keys["tokenizer.ggml.token_type_count"] == 2
    assert keys["tokenizer.ggml.normalizer.lowercase"] is False
    del keys[hf_arch.HF_CONFIG_KEY]  # another converter's GGUF: the config from the keys
    back = hf_arch.hf_files(hf_arch.ARCHS["bert"], keys, [], "F32")
    assert back["tokenizer.json"]["model"]["vocab"] == vocab
    assert back["config.json"]["type_vocab_size"] == 2 and back["config.json"]["architectures"] == ["BertModel"]
    assert back["tokenizer_config.json"]["do_lower_case"] is False


# --- canonical names in .apr (issue 26 item 3) ----------------------------------
def _apr(path):
    with aprfast.open(path) as f:
        return {n: f.get_tensor(n) for n in f.keys()}, dict(f.metadata)


def _same_files(a, b):
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for path in a.iterdir():
        assert path.read_bytes() == (b / path.name).read_bytes(), path.name


def test_canonical_tables_are_the_name_mappers_and_gpt2s():
    from aprfast.convert import names

    for family in ("llama", "bert"):
        for canonical, sources in names.rules(family):
            for naming in ("hf", "gguf"):
                if sources[naming] is None:
                    continue
                concrete = sources[naming].replace("{n}", "3").replace("{w}", "weight").replace("[model.]", "")
                concrete = concrete.replace("[bert.]", "")
                want = canonical.replace("{n}", "3").replace("{w}", "weight")
                assert hf_arch.canonical_name(family, naming, concrete) == want
    assert hf_arch.canonical_name("llama", "gguf", "blk.2.attn_q_norm.weight") == "layers.2.attn.q_norm.weight"
    for canonical, hf, gg in hf_arch.GPT2_CANONICAL:
        want = canonical.replace("{n}", "1").replace("{w}", "bias")
        assert hf_arch.canonical_name("gpt2", "hf", hf.replace("{n}", "1").replace("{w}", "bias")) == want
        if gg is not None:
            assert hf_arch.canonical_name("gpt2", "gguf", gg.replace("{n}", "1").replace("{w}", "bias")) == want
            # the GGUF table and the canonical one agree on the Hugging Face name
            assert hf_arch.gguf_to_hf_name(gg.replace("{n}", "1").replace("{w}", "bias"), "gpt2") == \
                hf.replace("{n}", "1").replace("{w}", "bias")
    assert hf_arch.canonical_name("gpt2", "hf", "vision.x") is None


def test_hugging_face_to_apr_is_canonical_and_a_hub(tmp_path):
    tensors = _model_dir(tmp_path / "hf")
    report = aprfast.convert(tmp_path / "hf", tmp_path / "m.apr")
    assert report["names"]["direction"] == "hf-to-apr" and report["names"]["permuted"] == []
    stored, metadata = _apr(tmp_path / "m.apr")
    assert "token_embedding" in stored and "layers.1.attn.out_proj.weight" in stored
    assert "model.embed_tokens.weight" not in stored
    # Hugging Face's row order: the same bytes under the canonical name
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    assert stored["layers.1.attn.q_proj.weight"].tobytes() == q.tobytes()
    record = metadata[hf_arch.CANONICAL_KEY]
    assert record["from"] == "hf" and record["arch"] == "llama" and record["rows"] == {}
    assert record["names"]["token_embedding"] == "model.embed_tokens.weight" and record["directory"] == "hf"
    assert metadata[hf_arch.HF_FILES_KEY]["config.json"]["model_type"] == "llama"
    # .apr -> GGUF is HF -> GGUF, byte for byte; .apr -> safetensors gives Hugging Face's names back
    aprfast.convert(tmp_path / "hf", tmp_path / "direct.gguf")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "via.gguf")
    assert (tmp_path / "via.gguf").read_bytes() == (tmp_path / "direct.gguf").read_bytes()
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.safetensors")
    back = safetensors_numpy.load_file(tmp_path / "back.safetensors")
    assert sorted(back) == sorted(tensors) and all(back[n].tobytes() == tensors[n].tobytes() for n in tensors)
    # names="keep": today's container conversion, names as they are and no record
    aprfast.convert(tmp_path / "hf", tmp_path / "kept.apr", names="keep")
    stored, metadata = _apr(tmp_path / "kept.apr")
    assert sorted(stored) == sorted(tensors) and hf_arch.CANONICAL_KEY not in metadata


def test_gguf_to_apr_is_canonical_in_hugging_faces_row_order(tmp_path):
    tensors = _model_dir(tmp_path / "hf")
    aprfast.convert(tmp_path / "hf", tmp_path / "m.gguf")
    report = aprfast.convert(tmp_path / "m.gguf", tmp_path / "m.apr")
    assert report["names"]["direction"] == "gguf-to-apr" and len(report["names"]["permuted"]) == 4
    stored, metadata = _apr(tmp_path / "m.apr")
    for hf_name, canonical in (("model.layers.0.self_attn.q_proj.weight", "layers.0.attn.q_proj.weight"),
                               ("model.layers.1.self_attn.k_proj.weight", "layers.1.attn.k_proj.weight"),
                               ("lm_head.weight", "lm_head.weight"), ("model.norm.weight", "norm.weight")):
        assert stored[canonical].tobytes() == tensors[hf_name].tobytes(), canonical  # un-permuted
    record = metadata[hf_arch.CANONICAL_KEY]
    assert record["from"] == "gguf" and record["rows"] == {"layers.0.attn.q_proj.weight": 2,
                                                           "layers.0.attn.k_proj.weight": 1,
                                                           "layers.1.attn.q_proj.weight": 2,
                                                           "layers.1.attn.k_proj.weight": 1}
    assert metadata["general.architecture"] == "llama"  # the GGUF's keys, all kept
    # GGUF -> .apr -> GGUF: the same bytes; GGUF -> .apr -> HF: what GGUF -> HF gives
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == (tmp_path / "m.gguf").read_bytes()
    aprfast.convert(tmp_path / "m.gguf", f"{tmp_path / 'direct'}/")
    aprfast.convert(tmp_path / "m.apr", f"{tmp_path / 'via'}/")
    _same_files(tmp_path / "direct", tmp_path / "via")


def test_quantized_gguf_rows_move_as_whole_blocks_through_apr(tmp_path):
    w = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    aprfast.convert(tmp_path / "q.gguf", tmp_path / "q.apr", validate="off")
    stored, _ = _apr(tmp_path / "q.apr")
    back_order = np.argsort(hf_arch.rope_rows(8, 2))
    assert stored["layers.0.attn.q_proj.weight"].data.tobytes() == quantize(w[back_order], "Q8_0").data.tobytes()
    aprfast.convert(tmp_path / "q.apr", tmp_path / "q-back.gguf", validate="off")
    assert (tmp_path / "q-back.gguf").read_bytes() == (tmp_path / "q.gguf").read_bytes()


def test_gpt2_in_apr_is_held_as_linear_weights(tmp_path):
    tensors = _gpt2_dir(tmp_path / "hf")
    aprfast.convert(tmp_path / "hf", tmp_path / "m.apr")
    stored, metadata = _apr(tmp_path / "m.apr")
    assert np.array_equal(stored["layers.1.attn.qkv_proj.weight"], tensors["transformer.h.1.attn.c_attn.weight"].T)
    assert np.array_equal(stored["layers.0.fc2.bias"], tensors["transformer.h.0.mlp.c_proj.bias"])
    assert sorted(metadata[hf_arch.CANONICAL_KEY]["transposed"]) == sorted(
        f"layers.{i}.{n}.weight" for i in range(2) for n in ("attn.qkv_proj", "attn.out_proj", "fc1", "fc2"))
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.safetensors")
    back = safetensors_numpy.load_file(tmp_path / "back.safetensors")
    assert sorted(back) == sorted(tensors) and all(back[n].tobytes() == tensors[n].tobytes() for n in tensors)
    aprfast.convert(tmp_path / "hf", tmp_path / "direct.gguf")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "via.gguf")
    assert (tmp_path / "via.gguf").read_bytes() == (tmp_path / "direct.gguf").read_bytes()
    # from GGUF: no transposition (GGUF holds Linear weights too), and back the same bytes
    aprfast.convert(tmp_path / "direct.gguf", tmp_path / "g.apr")
    from_gguf, _ = _apr(tmp_path / "g.apr")
    assert sorted(from_gguf) == sorted(s for s in stored)  # the same canonical names and layout
    assert all(from_gguf[n].tobytes() == stored[n].tobytes() for n in stored)
    aprfast.convert(tmp_path / "g.apr", tmp_path / "g.gguf")
    assert (tmp_path / "g.gguf").read_bytes() == (tmp_path / "direct.gguf").read_bytes()


def test_bert_task_model_names_come_back_exactly(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {"bert.embeddings.word_embeddings.weight": rng.standard_normal((8, 4)).astype(np.float32) * 0.03,
               "bert.embeddings.LayerNorm.gamma": np.ones(4, np.float32),
               "bert.pooler.dense.weight": rng.standard_normal((4, 4)).astype(np.float32) * 0.03,
               "cls.predictions.bias": np.zeros(8, np.float32),
               "cls.seq_relationship.weight": rng.standard_normal((2, 4)).astype(np.float32) * 0.03}
    (tmp_path / "hf").mkdir()
    safetensors_numpy.save_file(tensors, tmp_path / "hf" / "model.safetensors")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    aprfast.convert(tmp_path / "hf", tmp_path / "m.apr", validate="off")
    stored, metadata = _apr(tmp_path / "m.apr")
    assert sorted(stored) == ["cls.seq_relationship.weight", "embeddings.layer_norm.weight", "mlm.bias",
                              "pooler.dense.weight", "token_embedding"]  # no canonical name: kept
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.safetensors", validate="off")
    back = safetensors_numpy.load_file(tmp_path / "back.safetensors")
    assert sorted(back) == sorted(tensors) and all(back[n].tobytes() == tensors[n].tobytes() for n in tensors)


def test_gguf_without_head_counts_keeps_its_names_in_apr(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.ones((8, 4), np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.ones((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.warns(hf_arch.ModelConversionWarning, match="head_count"):
        aprfast.convert(tmp_path / "x.gguf", tmp_path / "x.apr", validate="off")
    stored, metadata = _apr(tmp_path / "x.apr")
    assert sorted(stored) == ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"] and hf_arch.CANONICAL_KEY not in metadata
    aprfast.convert(tmp_path / "x.apr", tmp_path / "y.gguf", validate="off")
    assert (tmp_path / "y.gguf").read_bytes() == (tmp_path / "x.gguf").read_bytes()


def test_a_damaged_canonical_record_is_refused_before_anything_is_written(tmp_path):
    w = np.ones((4, 8), np.float32)
    record = {"from": "gguf", "names": {"a": "x", "b": "x"}}
    aprfast.save_file({"a": w, "b": w}, tmp_path / "two.apr", metadata={hf_arch.CANONICAL_KEY: record})
    with pytest.raises(aprfast.LayoutError, match="two tensors"):
        aprfast.convert(tmp_path / "two.apr", tmp_path / "two.gguf", validate="off")
    record = {"from": "gguf", "names": {}, "rows": {"a": 3}}  # 4 rows are not 2 x 3 heads x ...
    aprfast.save_file({"a": w}, tmp_path / "rows.apr", metadata={hf_arch.CANONICAL_KEY: record})
    with pytest.raises(aprfast.LayoutError, match="heads"):
        aprfast.convert(tmp_path / "rows.apr", tmp_path / "rows.gguf", validate="off")
    assert not (tmp_path / "two.gguf").exists() and not (tmp_path / "rows.gguf").exists()
    # names="keep": the container as it is
    aprfast.convert(tmp_path / "two.apr", tmp_path / "kept.gguf", validate="off", names="keep")
