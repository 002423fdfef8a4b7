"""SentencePiece ``tokenizer.model`` files (Llama 2, Mistral): read and written here.

The file is a serialized ``sentencepiece.ModelProto`` (protocol buffers).  A model
conversion needs only its pieces (text, score, type) and a few trainer and normalizer
fields, so this module reads the wire format itself: no ``sentencepiece`` or
``protobuf`` package is needed, and what it returns is exactly what
``SentencePieceProcessor``'s ``IdToPiece``/``GetScore``/``IsControl``... give (the
engine tests check it against the package).  The file is untrusted: its size, the
number of pieces and each length are bounded before anything is allocated, and every
malformed byte is a typed :class:`~aprfast.errors.CorruptError`.

:func:`write_model` is the way back (GGUF -> Hugging Face): a ModelProto with the
pieces, a BPE trainer spec and the special ids, which transformers' ``LlamaTokenizer``
and ``sentencepiece`` both load.
"""

from __future__ import annotations

import math
import os
import struct

from ..errors import CorruptError, LimitError, os_error

__all__ = ["MAX_MODEL_BYTES", "MAX_PIECES", "read_model", "parse_model", "write_model",
           "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]

#: Largest tokenizer.model read (real ones are 0.5-5 MB).
MAX_MODEL_BYTES = 64 << 20
#: Most pieces a model may have (real ones: 32 000 to 256 000).
MAX_PIECES = 4_000_000
#: ModelProto.SentencePiece.Type (the same numbers as llama.cpp's token types).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
#: TrainerSpec.ModelType
MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}

_NESTING = 3  # ModelProto -> SentencePiece / TrainerSpec / NormalizerSpec: no deeper message is read


def _varint(data, pos: int, end: int):
    value = shift = 0
    while True:
        if pos >= end:
            raise CorruptError("tokenizer.model: a varint runs past its message")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise CorruptError("tokenizer.model: a varint is longer than 10 bytes")


def _fields(data, pos: int, end: int):
    """(field number, wire type, value) of one message: ints for varints and fixed
    fields, (start, end) for length-delimited ones."""
    while pos < end:
        tag, pos = _varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise CorruptError("tokenizer.model: field number 0")
        if wire == 0:
            value, pos = _varint(data, pos, end)
        elif wire == 1:
            if pos + 8 > end:
                raise CorruptError("tokenizer.model: a fixed64 field runs past its message")
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wire == 5:
            if pos + 4 > end:
                raise CorruptError("tokenizer.model: a fixed32 field runs past its message")
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        elif wire == 2:
            size, pos = _varint(data, pos, end)
            if size > end - pos:
                raise CorruptError(f"tokenizer.model: a field of {size} bytes runs past its message")
            value, pos = (pos, pos + size), pos + size
        else:  # 3/4: groups, which ModelProto never uses
            raise CorruptError(f"tokenizer.model: wire type {wire} (field {number}) is not in a ModelProto")
        yield number, wire, value


def _text(data, span, what: str) -> str:
    try:
        return bytes(data[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptError(f"tokenizer.model: {what} is not UTF-8") from None


def _int32(value: int) -> int:
    """An int32 field's varint (negative ones are 64-bit two's complement)."""
    value &= (1 << 64) - 1
    value = value - (1 << 64) if value >> 63 else value
    if not -(1 << 31) <= value < (1 << 31):
        raise CorruptError(f"tokenizer.model: {value} is not an int32")
    return value


def _f32(value: int) -> float:
    return struct.unpack("<f", value.to_bytes(4, "little"))[0]


def _expect(wire: int, wanted: int, what: str) -> None:
    if wire != wanted:
        raise CorruptError(f"tokenizer.model: {what} has wire type {wire}, not {wanted}")


def _piece(data, span, index: int) -> list:
    piece, score, kind = None, 0.0, NORMAL
    for number, wire, value in _fields(data, *span):
        if number == 1:
            _expect(wire, 2, "a piece's text")
            piece = _text(data, value, f"piece {index}")
        elif number == 2:
            _expect(wire, 5, "a piece's score")
            score = _f32(value)
        elif number == 3:
            _expect(wire, 0, "a piece's type")
            kind = value
            if kind not in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE):
                raise CorruptError(f"tokenizer.model: piece {index} has type {kind}, not 1 to 6")
    if piece is None:
        raise CorruptError(f"tokenizer.model: piece {index} has no text")
    return [piece, score, kind]


_TRAINER_INTS = {4: "vocab_size", 40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
_TRAINER_TEXT = {45: "unk_piece", 46: "bos_piece", 47: "eos_piece", 48: "pad_piece"}
_TRAINER_BOOLS = {35: "byte_fallback", 24: "treat_whitespace_as_suffix"}
_NORMALIZER_BOOLS = {3: "add_dummy_prefix", 4: "remove_extra_whitespaces", 5: "escape_whitespaces"}


def _trainer(data, span) -> dict:
    # proto2 defaults, as SentencePieceProcessor sees a field that is absent
    out = {"model_type": "UNIGRAM", "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1, "byte_fallback": False}
    for number, wire, value in _fields(data, *span):
        if number == 3:
            _expect(wire, 0, "trainer_spec.model_type")
            out["model_type"] = MODEL_TYPES.get(value, str(value))
        elif number in _TRAINER_INTS:
            _expect(wire, 0, f"trainer_spec.{_TRAINER_INTS[number]}")
            out[_TRAINER_INTS[number]] = _int32(value)
        elif number in _TRAINER_BOOLS:
            _expect(wire, 0, f"trainer_spec.{_TRAINER_BOOLS[number]}")
            out[_TRAINER_BOOLS[number]] = bool(value)
        elif number in _TRAINER_TEXT:
            _expect(wire, 2, f"trainer_spec.{_TRAINER_TEXT[number]}")
            out[_TRAINER_TEXT[number]] = _text(data, value, f"trainer_spec.{_TRAINER_TEXT[number]}")
    return out


def _normalizer(data, span) -> dict:
    out = {"add_dummy_prefix": True, "remove_extra_whitespaces": True, "escape_whitespaces": True}
    for number, wire, value in _fields(data, *span):
        if number == 1:
            _expect(wire, 2, "normalizer_spec.name")
            out["name"] = _text(data, value, "normalizer_spec.name")
        elif number in _NORMALIZER_BOOLS:
            _expect(wire, 0, f"normalizer_spec.{_NORMALIZER_BOOLS[number]}")
            out[_NORMALIZER_BOOLS[number]] = bool(value)
    return out


def parse_model(data) -> dict:
    """The parts of a serialized ModelProto a model conversion uses.

    Args:
        data: The bytes of a ``tokenizer.model``.

    Returns:
        ``{"pieces": [[text, score, type], ...], "trainer": {...}, "normalizer": {...}}``:
        pieces in id order (types as :data:`NORMAL` ... :data:`BYTE`), the trainer's
        ``model_type``, ``vocab_size``, ``byte_fallback`` and special ids/pieces, the
        normalizer's ``name`` and whitespace flags; JSON-serializable.

    Raises:
        CorruptError: The bytes are not a ModelProto (truncated, wrong wire types,
            a piece with no text or an unknown type, text not UTF-8).
        LimitError: More than :data:`MAX_PIECES` pieces, or more than
            :data:`MAX_MODEL_BYTES` bytes.

    Example:
        >>> parse_model(b"\\n\\x08\\n\\x01a\\x15\\x00\\x00\\x80\\xbf")["pieces"]
        [['a', -1.0, 1]]
    """
    data = memoryview(bytes(data))
    if len(data) > MAX_MODEL_BYTES:
        raise LimitError(f"tokenizer.model is {len(data)} bytes, more than {MAX_MODEL_BYTES}")
    pieces, trainer, normalizer = [], None, None
    for number, wire, value in _fields(data, 0, len(data)):
        if number == 1:
            _expect(wire, 2, "a piece")
            if len(pieces) >= MAX_PIECES:
                raise LimitError(f"tokenizer.model has more than {MAX_PIECES} pieces")
            pieces.append(_piece(data, value, len(pieces)))
        elif number == 2:
            _expect(wire, 2, "trainer_spec")
            trainer = _trainer(data, value)
        elif number == 3:
            _expect(wire, 2, "normalizer_spec")
            normalizer = _normalizer(data, value)
    if not pieces:
        raise CorruptError("tokenizer.model has no pieces")
    return {"pieces": pieces, "trainer": trainer if trainer is not None else _trainer(data, (0, 0)),
            "normalizer": normalizer if normalizer is not None else _normalizer(data, (0, 0))}


def read_model(path) -> dict:
    """:func:`parse_model` of the file at ``path``, read with its size bounded first.

    Args:
        path: A ``tokenizer.model`` file.

    Returns:
        What :func:`parse_model` returns.

    Raises:
        LimitError: The file is larger than :data:`MAX_MODEL_BYTES`.
        CorruptError: Not a ModelProto.
        AprIOError: The file cannot be read.

    Example:
        >>> read_model("Llama-2-7b-hf/tokenizer.model")["trainer"]["model_type"]  # doctest: +SKIP
        'BPE'
    """
    try:
        size = os.path.getsize(path)
        if size > MAX_MODEL_BYTES:
            raise LimitError(f"tokenizer.model is {size} bytes, more than {MAX_MODEL_BYTES}", path=path)
        with open(path, "rb") as f:
            data = f.read(MAX_MODEL_BYTES + 1)
    except OSError as exc:
        raise os_error(exc, "cannot read tokenizer.model", path=path) from exc
    try:
        return parse_model(data)
    except CorruptError as exc:
        raise CorruptError(str(exc), path=path) from None


# --- writing -------------------------------------------------------------------------
def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _put_tag(out: bytearray, number: int, wire: int) -> None:
    _put_varint(out, number << 3 | wire)


def _put_bytes(out: bytearray, number: int, payload: bytes) -> None:
    _put_tag(out, number, 2)
    _put_varint(out, len(payload))
    out += payload


def _put_int(out: bytearray, number: int, value: int) -> None:
    _put_tag(out, number, 0)
    _put_varint(out, int(value))


def write_model(pieces, *, model_type: str = "BPE", unk_id: int = 0, bos_id: int = 1, eos_id: int = 2,
                pad_id: int = -1, byte_fallback: bool = False, add_dummy_prefix: bool = True) -> bytes:
    """A serialized ModelProto of ``pieces``.

    Args:
        pieces: ``(text, score, type)`` in id order (types :data:`NORMAL` ... :data:`BYTE`).
        model_type: "BPE" (llama.cpp's SentencePiece tokenizer merges by score, as a
            BPE model does) or "UNIGRAM".
        unk_id: The unknown piece's id.
        bos_id: The beginning-of-sequence id (-1: none).
        eos_id: The end-of-sequence id (-1: none).
        pad_id: The padding id (-1: none).
        byte_fallback: Unknown characters become ``<0xXX>`` byte pieces.
        add_dummy_prefix: A space is put before the text (llama.cpp's
            ``tokenizer.ggml.add_space_prefix``).

    Returns:
        The bytes of a ``tokenizer.model``.

    Raises:
        ValueError: A type out of range, a score that is not finite, or an unknown model type.

    Example:
        >>> parse_model(write_model([("<unk>", 0.0, UNKNOWN), ("a", -1.0, NORMAL)]))["pieces"]
        [['<unk>', 0.0, 2], ['a', -1.0, 1]]
    """
    types = {name: number for number, name in MODEL_TYPES.items()}
    if model_type not in types:
        raise ValueError(f"model_type={model_type!r}: one of {', '.join(types)}")
    pieces = list(pieces)
    out = bytearray()
    for text, score, kind in pieces:
        if kind not in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE) or not math.isfinite(score):
            raise ValueError(f"piece {text!r}: type {kind!r} / score {score!r}")
        piece = bytearray()
        _put_bytes(piece, 1, str(text).encode("utf-8"))
        _put_tag(piece, 2, 5)
        piece += struct.pack("<f", float(score))
        if kind != NORMAL:
            _put_int(piece, 3, kind)
        _put_bytes(out, 1, bytes(piece))
    trainer = bytearray()
    _put_int(trainer, 3, types[model_type])
    _put_int(trainer, 4, len(pieces))
    _put_int(trainer, 35, bool(byte_fallback))
    for number, value in ((40, unk_id), (41, bos_id), (42, eos_id), (43, pad_id)):
        _put_int(trainer, number, value)
    _put_bytes(out, 2, bytes(trainer))
    normalizer = bytearray()
    _put_bytes(normalizer, 1, b"identity")
    _put_int(normalizer, 3, bool(add_dummy_prefix))
    _put_int(normalizer, 4, False)
    _put_int(normalizer, 5, True)
    _put_bytes(out, 3, bytes(normalizer))
    return bytes(out)
