"""A sibling Hugging Face ``tokenizer.json`` as seed 001 §5.2's embedded tokenizer.

Only what §5.2 lists is kept (the vocabulary in id order, its size, the model type and
the special token ids), not merges or normalizer rules: the metadata stays a fraction
of the tokenizer file.  The file is untrusted like any input: bounded in size, every id
checked to be a small non-negative int before a list is sized by it.
"""

from __future__ import annotations

import json
import os

from ..errors import CorruptError, LimitError, os_error

__all__ = ["tokenizer_metadata", "MAX_TOKENIZER_BYTES"]

MAX_TOKENIZER_BYTES = 128 << 20


def _read_json(path):
    try:
        size = os.path.getsize(path)
        if size > MAX_TOKENIZER_BYTES:
            raise LimitError(f"tokenizer file is {size} bytes, more than {MAX_TOKENIZER_BYTES}", path=path)
        with open(path, "rb") as f:
            data = f.read(MAX_TOKENIZER_BYTES + 1)
    except OSError as exc:
        raise os_error(exc, "cannot read tokenizer file", path=path) from exc
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"tokenizer file is not valid UTF-8 JSON ({type(exc).__name__})", path=path) from None


def _pairs(model: dict, path):
    """(token, id) pairs of the model's vocabulary: a dict (BPE, WordPiece, WordLevel)
    or a list of [token, score] (Unigram, ids are positions)."""
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        return list(vocab.items())
    if isinstance(vocab, list):
        out = []
        for i, entry in enumerate(vocab):
            if not isinstance(entry, list) or not entry:
                raise CorruptError(f"Unigram vocabulary entry {i} is not [token, score]", path=path)
            out.append((entry[0], i))
        return out
    raise CorruptError("tokenizer model has no vocabulary (\"vocab\" object or list)", path=path)


def _vocabulary(pairs, path) -> list:
    limit = 2 * len(pairs) + 1024  # ids are dense in practice; a sparse huge id is hostile
    for token, i in pairs:
        if not isinstance(token, str) or type(i) is not int or not 0 <= i < limit:
            raise CorruptError(f"tokenizer entry {token!r} -> {i!r} is not a string with an id below {limit}",
                               path=path)
    vocabulary = [""] * (max((i for _, i in pairs), default=-1) + 1)
    for token, i in pairs:
        vocabulary[i] = token
    return vocabulary


def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_metadata(directory) -> dict:
    """§5.2 keys for the ``tokenizer.json`` in ``directory`` ({} when there is none)."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        return {}
    doc = _read_json(path)
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict):
        raise CorruptError("tokenizer file has no \"model\" object", path=path)
    pairs = _pairs(model, path)
    added = doc.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise CorruptError("tokenizer \"added_tokens\" is not a list of objects", path=path)
    pairs += [(t.get("content"), t.get("id")) for t in added]
    vocabulary = _vocabulary(pairs, path)
    out = {"tokenizer.vocabulary": vocabulary, "tokenizer.vocab_size": len(vocabulary)}
    if isinstance(model.get("type"), str):
        out["tokenizer.model_type"] = model["type"]
    special = {t["content"]: t["id"] for t in added if t.get("special")}
    if special:
        out["tokenizer.special_token_ids"] = special
    out.update(_bos_eos(directory, {tok: i for tok, i in pairs}))
    return out


def _bos_eos(directory, ids: dict) -> dict:
    """bos/eos ids from a sibling ``tokenizer_config.json`` (where HF records which
    special token is which); absent or unresolvable ones are left out."""
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    config = _read_json(path)
    out = {}
    for which in ("bos", "eos"):
        text = _token_text(config.get(f"{which}_token")) if isinstance(config, dict) else None
        if text in ids:
            out[f"tokenizer.{which}_token_id"] = ids[text]
    return out
