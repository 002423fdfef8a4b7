"""One aprfast.open / load_file / load for every .apr variant (issue 10 part 1): the same
tensors, the same keyword arguments, and the same refusals whatever the file is."""

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.errors import DecryptError, SignatureError
from aprfast.files.reader import AprFile
from aprfast.v1.reader import V1File

TENSORS = {"embed.weight": np.arange(4096, dtype=np.float32).reshape(64, 64) / 7,
           "head.bias": np.linspace(-1, 1, 33).astype(np.float16),
           "steps": np.arange(10, dtype=np.int64)}
SEED, PUBLIC = crypto.generate_signing_key()
SECRET, RECIPIENT = crypto.generate_x25519_key()

# name -> (writer, keyword arguments a reader needs)
VARIANTS = {
    "v2 aprender": (lambda p: aprfast.save_file(TENSORS, p, layout="aprender"), {}),
    "v2 apr2": (lambda p: aprfast.save_file(TENSORS, p, layout="apr2"), {}),
    "v2 apr2 lz4 tensors": (lambda p: aprfast.save_file(TENSORS, p, compression="lz4"), {}),
    "v2 apr2 zstd tensors": (lambda p: aprfast.save_file(TENSORS, p, compression="zstd"), {}),
    "v2 apr2 password": (lambda p: aprfast.save_file(TENSORS, p, password="pw"), {"password": "pw"}),
    "v2 apr2 recipients zstd names": (
        lambda p: aprfast.save_file(TENSORS, p, recipients=[RECIPIENT], compression="zstd", encrypt_names=True),
        {"private_key": SECRET}),
    "v2 apr2 signed lz4": (lambda p: aprfast.save_file(TENSORS, p, signing_key=SEED, compression="lz4"),
                           {"trusted_keys": [PUBLIC]}),
    "v2 apr2 password signed": (lambda p: aprfast.save_file(TENSORS, p, password="pw", signing_key=SEED),
                                {"password": "pw", "trusted_keys": [PUBLIC]}),
    "v1 plain": (lambda p: v1.save_model(TENSORS, p), {}),
    "v1 zstd": (lambda p: v1.save_model(TENSORS, p, compression="zstd"), {}),
    "v1 lz4": (lambda p: v1.save_model(TENSORS, p, compression="lz4"), {}),
    "v1 password": (lambda p: v1.save_model(TENSORS, p, password="pw"), {"password": "pw"}),
    "v1 recipient": (lambda p: v1.save_model(TENSORS, p, recipient=RECIPIENT), {"private_key": SECRET}),
    "v1 signed": (lambda p: v1.save_model(TENSORS, p, signing_key=SEED), {"trusted_keys": [PUBLIC]}),
    "v1 streaming zstd": (lambda p: v1.save_model(TENSORS, p, compression="zstd", streaming=True), {}),
    "v1 streaming lz4 password signed": (
        lambda p: v1.save_model(TENSORS, p, compression="lz4", streaming=True, password="pw", signing_key=SEED,
                                chunk_size=4096),
        {"password": "pw", "trusted_keys": [PUBLIC]}),
    "v1 trueno-native": (lambda p: v1.save_model({k: v for k, v in TENSORS.items() if k != "steps"}, p,
                                                 trueno_native=True), {}),
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, tmp_path):
    write, keys = VARIANTS[request.param]
    path = tmp_path / "model.apr"
    write(path)
    expected = {k: v for k, v in TENSORS.items() if not (request.param.endswith("trueno-native") and k == "steps")}
    return request.param, path, keys, expected


def _same(got: dict, expected: dict):
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)


def test_open_reads_every_variant(variant):
    name, path, keys, expected = variant
    with aprfast.open(path, **keys) as f:
        assert isinstance(f, V1File if name.startswith("v1") else AprFile)
        assert f.keys() == sorted(expected)
        _same({k: f.get_tensor(k) for k in f.keys()}, expected)
        np.testing.assert_array_equal(f.get_slice("embed.weight")[3:9], expected["embed.weight"][3:9])
        f.verify()
    with aprfast.open(path, verify=True, **keys) as f:
        assert len(f) == len(expected)


@pytest.mark.parametrize("mmap", [True, False])
def test_load_file_and_load_read_every_variant(variant, mmap):
    _, path, keys, expected = variant
    _same(aprfast.load_file(path, mmap=mmap, **keys), expected)
    owned = aprfast.load(path.read_bytes(), **keys)
    _same(owned, expected)
    assert all(a.flags.writeable for a in owned.values())


def test_a_key_for_a_file_that_is_not_encrypted_is_refused(variant):
    name, path, keys, _ = variant
    if "password" in keys or "private_key" in keys:
        pytest.skip("the file is encrypted")
    with pytest.raises(DecryptError):
        aprfast.open(path, password="pw", **keys)
    with aprfast.open(path, password="pw", allow_unencrypted=True, **keys) as f:
        assert f.keys()


def test_a_required_signature_on_an_unsigned_file_is_refused(variant):
    name, path, keys, _ = variant
    if "trusted_keys" in keys:
        pytest.skip("the file is signed")
    with pytest.raises(SignatureError):
        aprfast.open(path, trusted_keys=[PUBLIC], **keys)
    with pytest.raises(SignatureError):
        aprfast.load_file(path, require_signature=True, **keys)


@pytest.mark.parametrize("save", [lambda p: v1.save_model(TENSORS, p, signing_key=SEED),
                                  lambda p: aprfast.save_file(TENSORS, p, signing_key=SEED)])
def test_a_signed_file_from_an_untrusted_key_is_refused(tmp_path, save):
    path = tmp_path / "signed.apr"
    save(path)
    _, other = crypto.generate_signing_key()
    with pytest.raises(SignatureError):
        aprfast.open(path, trusted_keys=[other])


@pytest.mark.parametrize("save", [
    lambda p: v1.save_model(TENSORS, p, compression="zstd", streaming=True, password="pw"),
    lambda p: aprfast.save_file(TENSORS, p, compression="zstd", password="pw")])
def test_an_encrypted_file_without_its_key_is_refused(tmp_path, save):
    path = tmp_path / "secret.apr"
    save(path)
    with pytest.raises(DecryptError):
        aprfast.open(path)
    with pytest.raises(DecryptError):
        aprfast.open(path, password="wrong")


def test_v1_files_have_aprfile_surface(tmp_path):
    quantized = {"q": aprfast.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "Q8_0")}
    for kind, kw in (("plain", {}), ("streaming", {"streaming": True, "compression": "zstd"})):
        path = tmp_path / f"{kind}.apr"
        v1.save_model(quantized, path, **kw)
        with aprfast.open(path) as f:
            if kind == "plain":  # a STREAMING file slices elementwise dtypes only (read packed ones whole)
                assert f.get_slice("q").get_dtype() == "Q8_0"
            assert f.get_tensor("q", dequantize=True).dtype == np.float32
    path = tmp_path / "trueno.apr"
    v1.save_model({"w": TENSORS["embed.weight"]}, path, trueno_native=True)
    with aprfast.open(path) as f:
        assert f.get_slice("w").get_dtype() == "F32" and f.get_slice("w").get_shape() == [64, 64]
