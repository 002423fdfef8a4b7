"""SentencePiece ``tokenizer.model`` files (aprfast.convert.spm) and the
tokenizer.ggml.* keys a Llama 2 style checkpoint gets from one, without the engines
(tests/engines/test_engines_sentencepiece.py runs them in llama.cpp and transformers)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import aprfast
from aprfast.convert import spm

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

PIECES = [("<unk>", 0.0, spm.UNKNOWN), ("<s>", 0.0, spm.CONTROL), ("</s>", 0.0, spm.CONTROL),
          ("<0x41>", 0.0, spm.BYTE), ("▁a", -1.0, spm.NORMAL), ("b", -2.5, spm.NORMAL),
          ("<sep>", 0.0, spm.USER_DEFINED), ("▁ab", -3.0, spm.NORMAL)]


def test_write_then_parse_gives_the_pieces_and_specs():
    data = spm.write_model(PIECES, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True)
    model = spm.parse_model(data)
    assert model["pieces"] == [list(p) for p in PIECES]
    assert model["trainer"] == {"model_type": "BPE", "vocab_size": len(PIECES), "unk_id": 0, "bos_id": 1,
                                "eos_id": 2, "pad_id": -1, "byte_fallback": True}
    assert model["normalizer"]["add_dummy_prefix"] is True and model["normalizer"]["name"] == "identity"
    json.dumps(model)  # recorded in .apr metadata as it is


def test_parse_matches_sentencepiece(tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    (tmp_path / "corpus.txt").write_text("\n".join(f"the quick brown fox {i} jumps over ünïcödé" for i in range(200)))
    sentencepiece.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "m"),
                                             vocab_size=300, model_type="bpe", byte_fallback=True,
                                             user_defined_symbols=["<sep>"], minloglevel=2, num_threads=1)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    model = spm.read_model(tmp_path / "m.model")
    assert len(model["pieces"]) == processor.vocab_size()
    for i, (text, score, kind) in enumerate(model["pieces"]):
        assert (text, score) == (processor.IdToPiece(i), processor.GetScore(i))
        assert (kind == spm.UNKNOWN) == processor.IsUnknown(i) and (kind == spm.CONTROL) == processor.IsControl(i)
        assert (kind == spm.BYTE) == processor.IsByte(i) and (kind == spm.UNUSED) == processor.IsUnused(i)
    assert model["trainer"]["byte_fallback"] is True and model["trainer"]["model_type"] == "BPE"
    # and back: sentencepiece loads what write_model writes, splitting text the same way
    (tmp_path / "back.model").write_bytes(spm.write_model([tuple(p) for p in model["pieces"]], byte_fallback=True))
    back = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "back.model"))
    text = "the quick brown fox 12 jumps 日本"
    assert back.encode(text) == processor.encode(text)


def _piece(text: bytes, extra: bytes = b"") -> bytes:
    body = b"\n" + bytes([len(text)]) + text + b"\x15" + struct.pack("<f", -1.0) + extra
    return b"\n" + bytes([len(body)]) + body


@pytest.mark.parametrize("data,message", [
    (b"", "no pieces"),
    (_piece(b"a")[:-2], "runs past"),                        # truncated
    (b"\n\xff\xff\xff\xff\x0f", "runs past"),               # a length far beyond the file
    (b"\n\x02\x0b\x00", "wire type 3"),                      # a group
    (_piece(b"\xff\xfe"), "not UTF-8"),
    (_piece(b"a", b"\x18\x09"), "type 9"),                   # a piece type out of range
    (b"\n\x05\x15\x00\x00\x80\xbf", "no text"),
    (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x00\x00", "field number 0"),
])
def test_hostile_models_are_typed_errors(data, message):
    with pytest.raises(aprfast.CorruptError, match=message):
        spm.parse_model(data)


def test_piece_count_and_size_are_bounded(monkeypatch):
    monkeypatch.setattr(spm, "MAX_PIECES", 2)
    with pytest.raises(aprfast.LimitError):
        spm.parse_model(_piece(b"a") * 3)
    monkeypatch.setattr(spm, "MAX_MODEL_BYTES", 10)
    with pytest.raises(aprfast.LimitError):
        spm.parse_model(_piece(b"a") * 3)


def _checkpoint(tmp_path, *, vocab_size=10, tok_config=None, added=None):
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "tokenizer.model").write_bytes(spm.write_model(PIECES, byte_fallback=True))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size,
              "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2}
    (directory / "config.json").write_text(json.dumps(config))
    if tok_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    if added is not None:
        (directory / "added_tokens.json").write_text(json.dumps(added))
    safetensors_numpy.save_file({"model.embed_tokens.weight": np.zeros((vocab_size, 8), np.float32)},
                                str(directory / "model.safetensors"))
    return directory


def _keys(path):
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items() if name.startswith("tokenizer.")}


def test_tokenizer_model_becomes_a_llama_vocabulary(tmp_path):
    """The reference converter's _create_vocab_sentencepiece: pieces (user-defined typed
    normal), [PADi] up to vocab_size, added tokens over them."""
    directory = _checkpoint(tmp_path, tok_config={
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
        "added_tokens_decoder": {"8": {"content": "<|im_end|>", "special": False},
                                 "9": {"content": "my▁word", "special": False},
                                 "99": {"content": "<dropped>", "special": True}}})
    aprfast.convert(directory, tmp_path / "out.gguf")
    keys = _keys(tmp_path / "out.gguf")
    assert keys["tokenizer.ggml.model"] == "llama" and keys["tokenizer.ggml.pre"] == "default"
    assert keys["tokenizer.ggml.tokens"] == [p[0] for p in PIECES] + ["<|im_end|>", "my word"]
    assert keys["tokenizer.ggml.token_type"] == [2, 3, 3, 6, 1, 1, 1, 1, 3, 4]
    assert keys["tokenizer.ggml.scores"] == [0.0, 0.0, 0.0, 0.0, -1.0, -2.5, 0.0, -3.0, -1000.0, -1000.0]
    assert keys["tokenizer.ggml.bos_token_id"] == 1 and keys["tokenizer.ggml.eos_token_id"] == 2
    assert keys["tokenizer.ggml.add_bos_token"] is True and keys["tokenizer.ggml.add_eos_token"] is False


def test_padding_and_added_tokens_json(tmp_path):
    directory = _checkpoint(tmp_path, vocab_size=12, added={"<extra>": 9, "<far>": 40})
    aprfast.convert(directory, tmp_path / "out.gguf")
    keys = _keys(tmp_path / "out.gguf")
    assert keys["tokenizer.ggml.tokens"][8:] == ["[PAD8]", "<extra>", "[PAD10]", "[PAD11]"]
    assert keys["tokenizer.ggml.token_type"][8:] == [5, 4, 5, 5]
    assert keys["tokenizer.ggml.scores"][8:] == [-10000.0, -1000.0, -10000.0, -10000.0]


def test_gguf_back_to_a_tokenizer_model(tmp_path):
    directory = _checkpoint(tmp_path)
    aprfast.convert(directory, tmp_path / "out.gguf")
    aprfast.convert(tmp_path / "out.gguf", f"{tmp_path / 'back'}/")
    model = spm.read_model(tmp_path / "back" / "tokenizer.model")
    assert [p[0] for p in model["pieces"]] == [p[0] for p in PIECES] + ["[PAD8]", "[PAD9]"]
    assert model["trainer"]["byte_fallback"] is True
    assert (model["trainer"]["unk_id"], model["trainer"]["bos_id"], model["trainer"]["eos_id"]) == (0, 1, 2)
    tok_config = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "LlamaTokenizer" and tok_config["bos_token"] == "<s>"


@pytest.mark.parametrize("tok_config,message", [
    ({"added_tokens_decoder": {"x": {"content": "a"}}}, "not a non-negative integer"),
    ({"added_tokens_decoder": {"3": {"special": True}}}, "no content"),
    ({"added_tokens_decoder": []}, "not an object"),
])
def test_hostile_tokenizer_config_is_corrupt(tmp_path, tok_config, message):
    directory = _checkpoint(tmp_path, tok_config=tok_config)
    with pytest.raises(aprfast.CorruptError, match=message):
        aprfast.convert(directory, tmp_path / "out.gguf")
