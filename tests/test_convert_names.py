"""Name mapping (seed 001 §10.8, §13.5): Whisper, LLaMA and BERT from their Hugging Face,
GGUF and ONNX names to the canonical .apr names; detection; collisions; rename= after
the mapper; `apr convert/import --arch`; `apr explain` through the same detector."""

import json
import warnings

import numpy as np
import pytest
import safetensors.numpy as sn

import aprfast
from aprfast.cli import main
from aprfast.cli.explain import detect_architecture
from aprfast.convert import NameMappingWarning
from aprfast.convert.names import ARCHS, detect_arch, map_name, map_names, rules

# --- the seed's own rows (§10.8), verbatim -------------------------------------------------
SEED_ROWS = [
    ("whisper", "model.encoder.conv1.weight", "encoder.conv1.weight", "hf"),
    ("whisper", "model.encoder.embed_positions.weight", "encoder.positional_embedding", "hf"),
    ("whisper", "model.decoder.embed_tokens.weight", "decoder.token_embedding", "hf"),
    ("whisper", "encoder.conv1.weight", "encoder.conv1.weight", "apr"),  # PyTorch and GGUF rows
    ("whisper", "/encoder/conv1/weight", "encoder.conv1.weight", "onnx"),
    ("llama", "model.embed_tokens.weight", "token_embedding", "hf"),
    ("llama", "model.layers.0.self_attn.q_proj.weight", "layers.0.attn.q_proj.weight", "hf"),
    ("llama", "token_embd.weight", "token_embedding", "gguf"),
    ("llama", "blk.0.attn_q.weight", "layers.0.attn.q_proj.weight", "gguf"),
]

# "Full HuggingFace Whisper Mapping" of §10.8, N = 3
SEED_WHISPER_FULL = {
    "model.encoder.conv1.bias": "encoder.conv1.bias",
    "model.encoder.conv2.weight": "encoder.conv2.weight",
    "model.encoder.conv2.bias": "encoder.conv2.bias",
    "model.encoder.layer_norm.weight": "encoder.layer_norm.weight",
    "model.encoder.layer_norm.bias": "encoder.layer_norm.bias",
    "model.encoder.layers.3.self_attn_layer_norm.weight": "encoder.layers.3.self_attn_layer_norm.weight",
    "model.encoder.layers.3.self_attn.q_proj.weight": "encoder.layers.3.self_attn.q_proj.weight",
    "model.decoder.embed_positions.weight": "decoder.positional_embedding",
    "model.decoder.layer_norm.weight": "decoder.layer_norm.weight",
    "model.decoder.layer_norm.bias": "decoder.layer_norm.bias",
    "model.decoder.layers.3.self_attn_layer_norm.weight": "decoder.layers.3.self_attn_layer_norm.weight",
    "model.decoder.layers.3.encoder_attn_layer_norm.weight": "decoder.layers.3.encoder_attn_layer_norm.weight",
    "model.decoder.layers.3.final_layer_norm.weight": "decoder.layers.3.final_layer_norm.weight",
}


@pytest.mark.parametrize("arch,source,canonical,naming", SEED_ROWS)
def test_the_seeds_mapping_rows(arch, source, canonical, naming):
    assert map_name(arch, source) == (canonical, naming)


def test_the_seeds_full_hugging_face_whisper_table():
    for source, canonical in SEED_WHISPER_FULL.items():
        assert map_name("whisper", source) == (canonical, "hf"), source


# --- whole models in each naming: one layer, every tensor -----------------------------------
def whisper_names(naming):
    """Every tensor of a one-layer Whisper (HF's WhisperForConditionalGeneration or
    OpenAI's checkpoint, which whisper.cpp and GGUF keep) -> its canonical name."""
    out = {}
    hf = naming == "hf"
    for part in ("encoder", "decoder"):
        pre = f"model.{part}" if hf else part
        if part == "encoder":
            for conv in ("conv1", "conv2"):
                for w in ("weight", "bias"):
                    out[f"{pre}.{conv}.{w}"] = f"encoder.{conv}.{w}"
        out[f"{pre}.embed_positions.weight" if hf else f"{part}.positional_embedding"] = \
            f"{part}.positional_embedding"
        post = "layer_norm" if hf else ("ln_post" if part == "encoder" else "ln")
        attn = [("self_attn", "attn")] + ([("encoder_attn", "cross_attn")] if part == "decoder" else [])
        for w in ("weight", "bias"):
            out[f"{pre}.{post}.{w}"] = f"{part}.layer_norm.{w}"
            layer, block = f"{pre}.layers.0", f"{part}.blocks.0"
            pairs = [("fc1", "mlp.0"), ("fc2", "mlp.2"), ("final_layer_norm", "mlp_ln")]
            for apr_attn, openai_attn in attn:
                pairs.append((f"{apr_attn}_layer_norm", f"{openai_attn}_ln"))
                for p, o in (("q", "query"), ("v", "value"), ("out", "out")) + ((("k", "key"),) if w == "weight"
                                                                                else ()):
                    pairs.append((f"{apr_attn}.{p}_proj", f"{openai_attn}.{o}"))
            for apr, openai in pairs:
                out[f"{layer}.{apr}.{w}" if hf else f"{block}.{openai}.{w}"] = f"{part}.layers.0.{apr}.{w}"
    out["model.decoder.embed_tokens.weight" if hf else "decoder.token_embedding.weight"] = "decoder.token_embedding"
    if hf:
        out["proj_out.weight"] = "proj_out.weight"
    return out


def llama_names(naming):
    """A one-layer LLaMA in HF (LlamaForCausalLM) or llama.cpp GGUF names -> canonical."""
    hf = naming == "hf"
    table = [("model.embed_tokens.weight", "token_embd.weight", "token_embedding"),
             ("model.norm.weight", "output_norm.weight", "norm.weight"),
             ("lm_head.weight", "output.weight", "lm_head.weight"),
             ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", "layers.0.attn_norm.weight"),
             ("model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", "layers.0.mlp_norm.weight")]
    for h, g, a in (("q", "q", "q"), ("k", "k", "k"), ("v", "v", "v"), ("o", "output", "out")):
        table.append((f"model.layers.0.self_attn.{h}_proj.weight", f"blk.0.attn_{g}.weight",
                      f"layers.0.attn.{a}_proj.weight"))
    for p in ("gate", "up", "down"):
        table.append((f"model.layers.0.mlp.{p}_proj.weight", f"blk.0.ffn_{p}.weight", f"layers.0.mlp.{p}_proj.weight"))
    return {(h if hf else g): a for h, g, a in table}


def bert_names(naming):
    """A one-layer BERT (HF BertForMaskedLM, or llama.cpp's GGUF BERT) -> canonical."""
    hf = naming == "hf"
    table = [("bert.embeddings.word_embeddings.weight", "token_embd.weight", "token_embedding"),
             ("bert.embeddings.position_embeddings.weight", "position_embd.weight", "positional_embedding"),
             ("bert.embeddings.token_type_embeddings.weight", "token_types.weight", "token_type_embedding")]
    for w in ("weight", "bias"):
        table += [
            (f"bert.embeddings.LayerNorm.{w}", f"token_embd_norm.{w}", f"embeddings.layer_norm.{w}"),
            (f"bert.encoder.layer.0.attention.self.query.{w}", f"blk.0.attn_q.{w}", f"layers.0.attn.q_proj.{w}"),
            (f"bert.encoder.layer.0.attention.self.key.{w}", f"blk.0.attn_k.{w}", f"layers.0.attn.k_proj.{w}"),
            (f"bert.encoder.layer.0.attention.self.value.{w}", f"blk.0.attn_v.{w}", f"layers.0.attn.v_proj.{w}"),
            (f"bert.encoder.layer.0.attention.output.dense.{w}", f"blk.0.attn_output.{w}",
             f"layers.0.attn.out_proj.{w}"),
            (f"bert.encoder.layer.0.attention.output.LayerNorm.{w}", f"blk.0.attn_output_norm.{w}",
             f"layers.0.attn_layer_norm.{w}"),
            (f"bert.encoder.layer.0.intermediate.dense.{w}", f"blk.0.ffn_up.{w}", f"layers.0.fc1.{w}"),
            (f"bert.encoder.layer.0.output.dense.{w}", f"blk.0.ffn_down.{w}", f"layers.0.fc2.{w}"),
            (f"bert.encoder.layer.0.output.LayerNorm.{w}", f"blk.0.layer_output_norm.{w}",
             f"layers.0.final_layer_norm.{w}"),
        ]
    out = {(h if hf else g): a for h, g, a in table}
    if hf:  # the MLM head and the pooler have no GGUF names
        out.update({"bert.pooler.dense.weight": "pooler.dense.weight", "cls.predictions.bias": "mlm.bias",
                    "cls.predictions.transform.dense.weight": "mlm.dense.weight",
                    "cls.predictions.transform.LayerNorm.weight": "mlm.layer_norm.weight",
                    "cls.predictions.decoder.weight": "mlm.decoder.weight",
                    "bert.embeddings.position_ids": "position_ids"})
    return out


MODELS = {"whisper": whisper_names, "llama": llama_names, "bert": bert_names}


def namings(table, naming):
    """What map_names counts: names already canonical (lm_head.weight, OpenAI's
    encoder.conv1.weight) as "apr", the others as ``naming``."""
    same = sum(s == d for s, d in table.items())
    return {k: v for k, v in ((naming, len(table) - same), ("apr", same)) if v}


def onnx_names(table):
    """torch.onnx keeps state-dict names; graph paths use "/" (normalised on read)."""
    return {"/" + name.replace(".", "/"): canonical for name, canonical in table.items()}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("naming", ["hf", "gguf", "onnx"])
def test_every_tensor_of_each_naming_maps(arch, naming):
    table = onnx_names(MODELS[arch]("hf")) if naming == "onnx" else MODELS[arch](naming)
    mapping = map_names(table, arch)
    assert mapping.unknown == []
    assert mapping.names == table
    assert mapping.namings == namings(table, naming)


@pytest.mark.parametrize("arch", ARCHS)
def test_canonical_names_map_to_themselves_and_namings_agree(arch):
    hf = MODELS[arch]("hf")
    gguf = MODELS[arch]("gguf")
    canonical = sorted(set(hf.values()))
    assert map_names(canonical, arch).names == {n: n for n in canonical}  # idempotent
    # what both namings hold maps to the same canonical names
    assert set(gguf.values()) <= set(hf.values())
    assert len(set(hf.values())) == len(hf) and len(set(gguf.values())) == len(gguf)  # no collisions


def test_hf_base_models_without_the_task_prefix():
    assert map_name("whisper", "encoder.embed_positions.weight") == ("encoder.positional_embedding", "hf")
    assert map_name("llama", "layers.2.self_attn.o_proj.weight") == ("layers.2.attn.out_proj.weight", "hf")
    assert map_name("bert", "encoder.layer.11.attention.self.query.bias") == ("layers.11.attn.q_proj.bias", "hf")
    assert map_name("bert", "bert.embeddings.LayerNorm.gamma") == ("embeddings.layer_norm.weight", "hf")


def test_unknown_names_are_reported_not_guessed():
    assert map_name("llama", "model.layers.0.mlp.experts.3.w1.weight") == (None, None)
    mapping = map_names(["blk.0.attn_q.weight", "mystery.weight"], "llama")
    assert mapping.names == {"blk.0.attn_q.weight": "layers.0.attn.q_proj.weight", "mystery.weight": "mystery.weight"}
    assert mapping.unknown == ["mystery.weight"]
    with pytest.raises(ValueError, match="arch='gpt2'"):
        map_names(["x"], "gpt2")


# --- detection ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("naming", ["hf", "gguf", "onnx", "apr"])
def test_detection_from_names_in_every_naming(arch, naming):
    if naming == "apr":
        names = list(MODELS[arch]("hf").values())
    elif naming == "onnx":
        names = list(onnx_names(MODELS[arch]("hf")))
    else:
        names = list(MODELS[arch](naming))
    assert detect_arch(names) == arch


def test_detection_prefers_ggufs_general_architecture():
    names = list(llama_names("gguf"))
    assert detect_arch(names, {"general.architecture": "llama"}) == "llama"
    assert detect_arch(names, {"general.architecture": "bert"}) == "bert"  # what the file says wins
    assert detect_arch(names, {"general.architecture": "qwen2"}) is None  # not guessed as llama
    mapping = map_names(names, "auto", {"general.architecture": "qwen2"})
    assert mapping.arch is None and "qwen2" in mapping.reason and mapping.names == {n: n for n in names}
    assert detect_arch(["h.0.attn.c_attn.weight"]) == "gpt2" and detect_arch(["x.weight"]) is None


def test_apr_explain_uses_the_same_detector(tmp_path, capsys):
    names = list(llama_names("gguf"))
    assert detect_architecture(names) == {"architecture": "LLaMA", "id": "llama",
                                          "purpose": "Causal language model (decoder-only transformer)"}
    path = tmp_path / "w.apr"
    aprfast.save_file({n: np.zeros(4, np.float32) for n in whisper_names("gguf")}, path)
    assert main(["explain", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"] == "Whisper" and report["id"] == "whisper"


# --- through convert ---------------------------------------------------------------------------
def values_for(table, rng):
    """Plausible values for each name (LayerNorm weights near 1, the rest small), so the
    conversion passes the default strict validation."""
    out = {}
    for name, canonical in table.items():
        if "position_ids" in name:
            out[name] = np.arange(4, dtype=np.int64)
        elif canonical.endswith("norm.weight"):
            out[name] = (1 + 0.01 * rng.standard_normal(8)).astype(np.float32)
        else:
            out[name] = (0.03 * rng.standard_normal((4, 8))).astype(np.float32)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_convert_maps_hf_safetensors_and_records_the_mapping(tmp_path, rng, arch):
    table = MODELS[arch]("hf")
    tensors = values_for(table, rng)
    sn.save_file(tensors, tmp_path / "m.safetensors")
    result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="auto")
    assert result["arch"] == arch
    assert result["names"] == {"arch": arch, "detected": True, "namings": dict(sorted(namings(table, "hf").items())),
                               "renamed": sum(s != d for s, d in table.items()), "unknown": [],
                               "reason": "from the tensor names"}
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == sorted(table.values())
        for source, canonical in table.items():
            np.testing.assert_array_equal(f.get_tensor(canonical), tensors[source])
        recorded = f.metadata["aprfast.name_mapping"]
    assert recorded["arch"] == arch and recorded["detected"] is True and recorded["unknown"] == []


def test_convert_gguf_llama_by_general_architecture(tmp_path, rng):
    gguf = pytest.importorskip("gguf")
    table = llama_names("gguf")
    tensors = values_for(table, rng)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    result = aprfast.convert(tmp_path / "m.gguf", tmp_path / "m.apr", arch="auto")
    assert result["names"]["reason"] == "from general.architecture"
    assert result["names"]["namings"] == {"gguf": len(table)}
    with aprfast.open(tmp_path / "m.apr") as f:
        np.testing.assert_array_equal(f.get_tensor("layers.0.attn.out_proj.weight"),
                                      tensors["blk.0.attn_output.weight"])
        assert sorted(f.keys()) == sorted(table.values())
    # canonical names convert again unchanged (the detector knows them too)
    again = aprfast.convert(tmp_path / "m.apr", tmp_path / "again.apr", arch="auto")
    assert again["names"]["renamed"] == 0 and again["names"]["namings"] == {"apr": len(table)}


def test_onnx_initializers_map(tmp_path, rng):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    table = onnx_names(MODELS["whisper"]("hf"))
    tensors = values_for(table, rng)
    graph = helper.make_graph([], "g", [], [], [numpy_helper.from_array(v, n) for n, v in tensors.items()])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    result = aprfast.convert(tmp_path / "m.onnx", tmp_path / "m.apr", arch="whisper")
    assert result["names"]["unknown"] == []
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == sorted(table.values())


def test_no_arch_keeps_names_and_records_nothing(tmp_path, rng):
    table = llama_names("hf")
    sn.save_file(values_for(table, rng), tmp_path / "m.safetensors")
    result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr")
    assert result["arch"] is None and result["names"] is None
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == sorted(table) and "aprfast.name_mapping" not in (f.metadata or {})


def test_auto_with_nothing_recognised_keeps_names(tmp_path, rng):
    sn.save_file({"a.weight": np.ones((2, 2), np.float32)}, tmp_path / "m.safetensors")
    result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="auto")
    assert result["arch"] is None and result["names"]["reason"] == "no architecture recognised from the tensor names"
    with aprfast.open(tmp_path / "m.apr") as f:
        assert list(f.keys()) == ["a.weight"] and "aprfast.name_mapping" not in (f.metadata or {})


def test_unknown_names_under_a_chosen_arch_are_kept_with_a_warning(tmp_path, rng):
    table = llama_names("hf")
    tensors = dict(values_for(table, rng), **{"model.layers.0.mlp.extra.weight": np.ones((2, 2), np.float32)})
    sn.save_file(tensors, tmp_path / "m.safetensors")
    with pytest.warns(NameMappingWarning, match=r"does not know 1 tensor name\(s\).*'model.layers.0.mlp.extra.weight'"):
        result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="llama")
    assert result["names"]["unknown"] == ["model.layers.0.mlp.extra.weight"]
    with aprfast.open(tmp_path / "m.apr") as f:
        assert "model.layers.0.mlp.extra.weight" in f.keys()
        assert f.metadata["aprfast.name_mapping"]["unknown"] == ["model.layers.0.mlp.extra.weight"]


def test_a_chosen_arch_the_names_contradict_warns(tmp_path, rng):
    sn.save_file(values_for(bert_names("hf"), rng), tmp_path / "m.safetensors")
    with pytest.warns(NameMappingWarning) as caught:
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="llama")
    assert any("arch='llama' but the source looks like 'bert'" in str(w.message) for w in caught)


def test_two_sources_mapping_to_one_name_is_an_error_naming_both(tmp_path, rng):
    # HF's task model and base model names of one tensor in one file
    tensors = {"model.embed_tokens.weight": np.zeros((2, 2), np.float32),
               "embed_tokens.weight": np.zeros((2, 2), np.float32)}
    sn.save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(aprfast.LayoutError) as info:
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="llama")
    message = str(info.value)
    assert "'embed_tokens.weight'" in message and "'model.embed_tokens.weight'" in message
    assert "'token_embedding'" in message and "llama name mapper" in message
    assert not (tmp_path / "m.apr").exists()


def test_rename_applies_after_the_mapper(tmp_path, rng):
    table = llama_names("gguf")
    sn.save_file(values_for(table, rng), tmp_path / "m.safetensors")
    seen = []

    def rename(name):
        seen.append(name)
        return None if name == "lm_head.weight" else "model." + name

    result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="llama", rename=rename)
    assert sorted(seen) == sorted(table.values())  # rename sees the canonical names
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == sorted("model." + n for n in table.values() if n != "lm_head.weight")
    assert result["tensors"] == len(table) - 1
    # a dict renames the names it holds and keeps the others
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "d.apr", arch="llama",
                    rename={"token_embedding": "embeddings.tokens", "norm.weight": None})
    with aprfast.open(tmp_path / "d.apr") as f:
        assert "embeddings.tokens" in f.keys() and "norm.weight" not in f.keys() and "layers.0.attn_norm.weight" in f
    # rename making a collision after the mapper names both sources
    with pytest.raises(aprfast.LayoutError, match="'blk.0.ffn_up.weight'.*after the llama name mapper and rename"):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "c.apr", arch="llama",
                        rename={"layers.0.mlp.up_proj.weight": "layers.0.mlp.gate_proj.weight"})


def test_strip_prefix_runs_before_the_mapper(tmp_path, rng):
    table = llama_names("hf")
    sn.save_file({"module." + n: v for n, v in values_for(table, rng).items()}, tmp_path / "m.safetensors")
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="auto", strip_prefix="module.")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == sorted(table.values())


def test_bad_arch_is_refused_before_anything_is_written(tmp_path, rng):
    sn.save_file({"a": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="arch='mamba'"):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="mamba")
    assert not (tmp_path / "m.apr").exists()


def test_cli_arch_passes_through(tmp_path, rng, capsys):
    table = whisper_names("hf")
    sn.save_file(values_for(table, rng), tmp_path / "m.safetensors")
    out = tmp_path / "w.apr"
    assert main(["import", str(tmp_path / "m.safetensors"), str(out), "--arch", "auto"]) == 0
    text = capsys.readouterr().out
    assert "names: whisper (detected), 50 renamed (apr 1, hf 50), 0 unknown kept" in text  # apr: proj_out
    with aprfast.open(out) as f:
        assert sorted(f.keys()) == sorted(table.values())
    assert main(["convert", str(out), str(tmp_path / "w.safetensors"), "--arch", "whisper", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arch"] == "whisper" and doc["names"]["namings"] == {"apr": len(table)}
    with pytest.raises(SystemExit) as exited:  # argparse: an invalid choice is exit 2
        main(["convert", str(out), str(tmp_path / "x.apr"), "--arch", "gpt9"])
    assert exited.value.code == 2


def test_the_tables_are_what_format_md_prints():
    # every rule's source patterns compile and name distinct sources per naming
    for arch in ARCHS:
        for naming in ("hf", "gguf"):
            sources = [s[naming] for _, s in rules(arch) if s.get(naming)]
            assert len(sources) == len(set(sources)), (arch, naming)


def test_warnings_are_not_raised_for_a_clean_mapping(tmp_path, rng):
    sn.save_file(values_for(bert_names("hf"), rng), tmp_path / "m.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", arch="bert")
