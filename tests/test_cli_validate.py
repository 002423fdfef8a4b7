"""`apr validate`: --checksum, --nan-check, --zero-check, --json and the exit codes
(0 pass, 3 missing, 4 unreadable, 5 a check failed), in-process and as a real command."""

import json
import os

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main
from aprfast.cli.validate import validate_file

APR = "import sys, runpy; sys.argv[0] = 'apr'; runpy.run_module('aprfast.cli', run_name='__main__')"


def healthy(rng):
    return {"encoder.layer_norm.weight": (1 + 0.05 * rng.standard_normal(16)).astype(np.float32),
            "encoder.fc1.weight": (0.03 * rng.standard_normal((16, 8))).astype(np.float32),
            "encoder.fc1.bias": np.zeros(16, np.float32),
            "step": np.array(3, np.int64)}


@pytest.fixture
def model(tmp_path, rng):
    path = tmp_path / "m.apr"
    aprfast.save_file(healthy(rng), path, layout="apr2")
    return path


def data_offset(path, name):
    with aprfast.open(path) as f:
        return f.info(name).offset


def flip_byte(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x01]))


def put_f32(path, offset, value):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(np.array([value], "<f4").tobytes())


def test_healthy_file_passes_every_check(model, capsys):
    assert main(["validate", str(model)]) == 0
    out, err = capsys.readouterr()
    assert "[PASS] checksum" in out and "[PASS] nan-check" in out and "result: PASS" in out
    assert "[WARN] zero-check" in out and "encoder.fc1.bias" in out  # a zero bias only warns
    assert err == ""


def test_flipped_data_byte_fails_the_checksum_with_e004(model, capsys):
    flip_byte(model, data_offset(model, "encoder.fc1.weight") + 5)
    assert main(["validate", "--checksum", str(model)]) == 5
    out, err = capsys.readouterr()
    assert "[FAIL] checksum [E004]" in out and "E004" in err
    assert main(["validate", "--checksum", "--json", str(model)]) == 5
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False
    assert [(c["name"], c["status"], c["code"]) for c in report["checks"]] == [("checksum", "FAIL", "E004")]


def test_injected_nan_and_inf_fail_the_nan_check(model, capsys):
    offset = data_offset(model, "encoder.fc1.weight")
    put_f32(model, offset + 8, np.float32(np.nan))  # 0x7FC00000, QA #26
    assert main(["validate", "--nan-check", "--json", str(model)]) == 5
    check = json.loads(capsys.readouterr().out)["checks"][0]
    assert check["status"] == "FAIL" and check["tensors"] == ["encoder.fc1.weight"]
    put_f32(model, offset + 8, np.float32(0.01))
    put_f32(model, offset + 12, np.float32(np.inf))  # QA #27
    assert main(["validate", "--nan-check", str(model)]) == 5
    assert "1 Inf" in capsys.readouterr().out
    # the data changed, so the CRC no longer matches either; --nan-check alone does not look
    assert main(["validate", "--checksum", str(model)]) == 5


def test_all_zero_weight_fails_the_zero_check(tmp_path, rng, capsys):
    tensors = healthy(rng)
    tensors["encoder.fc1.weight"] = np.zeros((16, 8), np.float32)  # QA #31
    path = tmp_path / "z.apr"
    aprfast.save_file(tensors, path)
    assert main(["validate", "--zero-check", str(path)]) == 5
    out = capsys.readouterr().out
    assert "[FAIL] zero-check" in out and "encoder.fc1.weight" in out
    assert main(["validate", "--checksum", "--nan-check", str(path)]) == 0


def test_quantized_and_unknown_dtype_tensors(tmp_path, rng, capsys):
    path = tmp_path / "q.apr"
    aprfast.save_file({"w": aprfast.quantize(rng.standard_normal((4, 64)).astype(np.float32), "q8_0"),
                       "c": np.ones(3, np.complex64)}, path, layout="apr2")
    assert main(["validate", "--json", str(path)]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks[1]["skipped"] == ["c"]  # no statistics for complex: said, not hidden


def test_missing_unreadable_and_bad_arguments(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.apr")]) == 3
    assert "[E007]" in capsys.readouterr().err
    bad = tmp_path / "bad.apr"
    bad.write_bytes(b"ZZZZ" + bytes(60))
    assert main(["validate", str(bad)]) == 4
    assert "[E001]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["validate"])
    assert info.value.code == 2


def test_encrypted_v1_file_with_password_from_the_environment(tmp_path, monkeypatch, capsys):
    path = tmp_path / "enc.apr"
    v1.save_model({"w": np.arange(8, dtype=np.float32)}, path, password="s3cret")
    monkeypatch.setenv("APR_TEST_PW", "s3cret")
    assert main(["validate", "--password-env", "APR_TEST_PW", str(path)]) == 0
    assert "result: PASS" in capsys.readouterr().out
    monkeypatch.setenv("APR_TEST_PW", "wrong")
    assert main(["validate", "--password-env", "APR_TEST_PW", str(path)]) == 4
    assert "[E005]" in capsys.readouterr().err
    assert main(["validate", "--password-env", "APR_NOT_SET_ANYWHERE", str(path)]) == 2
    assert "not set" in capsys.readouterr().err


def test_validate_file_api(model):
    with aprfast.open(model) as f:
        report = validate_file(f, checks=["nan-check"])
    assert report["passed"] and [c["name"] for c in report["checks"]] == ["nan-check"]
    with aprfast.open(model) as f, pytest.raises(ValueError):
        validate_file(f, checks=["frobnicate"])


def test_as_a_real_command(model, run_child):
    done = run_child(APR, "validate", "--json", model)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["passed"] is True
    flip_byte(model, data_offset(model, "step"))
    done = run_child(APR, "validate", "--checksum", model)
    assert done.returncode == 5 and "E004" in done.stdout and "E004" in done.stderr
    done = run_child(APR, "validate", os.path.join(os.path.dirname(str(model)), "missing.apr"))
    assert done.returncode == 3 and done.stdout == ""


def test_recipient_encrypted_and_signed_v1_with_key_files(tmp_path, capsys):
    from aprfast.crypto import core as crypto

    secret, public = crypto.generate_x25519_key()
    seed, signer = crypto.generate_signing_key()
    key, trusted, other = tmp_path / "k.key", tmp_path / "signer.pub", tmp_path / "other.pub"
    crypto.save_key(key, secret, kind="x25519-private")
    crypto.save_key(trusted, signer, kind="ed25519-public")
    crypto.save_key(other, crypto.generate_signing_key()[1], kind="ed25519-public")
    path = tmp_path / "r.apr"
    v1.save_model({"w": np.linspace(-1, 1, 16, dtype=np.float32)}, path, recipient=public, signing_key=seed)
    assert main(["validate", "--key-file", str(key), "--trusted-key", str(trusted), str(path)]) == 0
    assert "signature valid" in capsys.readouterr().out
    assert main(["validate", "--key-file", str(key), "--trusted-key", str(other), str(path)]) == 4
    assert "[E006]" in capsys.readouterr().err
    assert main(["validate", str(path)]) == 4  # encrypted, and no key given
    assert "[E005]" in capsys.readouterr().err
