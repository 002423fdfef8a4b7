"""ECDSA key pairs on the NIST curves P-256, P-384 and P-521, as PEM files.

These are the keys of the OpenSSF model-signing format's ``key`` method (Sigstore
bundles signed offline with a local key, :mod:`aprfast.tools.model_signing`): that format
takes ECDSA keys on these three curves only, not Ed25519, so the Ed25519 keys of
:mod:`aprfast.crypto.core` (the ``.apr`` signature) cannot sign a bundle.  The private key
is PKCS#8 PEM (mode 0600, optionally encrypted with a password), the public key
SubjectPublicKeyInfo PEM, exactly what ``openssl ecparam -genkey`` / ``openssl ec -pubout``
and ``model_signing``'s ``--private_key`` / ``--public_key`` read.  Everything here needs
the ``cryptography`` package only (``pip install 'aprfast[keyfiles]'``), not libsodium.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Optional, Tuple, Union

from .._optional import require
from ..errors import FormatError
from .keyfiles import read_key_file, write_key_file

if TYPE_CHECKING:  # cryptography is imported on use; the annotations only name its classes
    from cryptography.hazmat.primitives.asymmetric import ec

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["CURVES", "generate_ecdsa_key", "save_ecdsa_keypair", "load_ecdsa_private_key",
           "load_ecdsa_public_key", "public_key_pem", "key_hint"]

#: aprfast's name of each curve -> the name ``cryptography`` and OpenSSL give it
CURVES = {"p256": "secp256r1", "p384": "secp384r1", "p521": "secp521r1"}


def _ec():
    require("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec, serialization


def _curve_name(curve: str) -> str:
    name = curve.lower().replace("-", "").replace("ecdsa", "")
    if name not in CURVES:
        raise ValueError(f"curve={curve!r}: one of {', '.join(CURVES)}")
    return name


def generate_ecdsa_key(curve: str = "p256", *, password: Optional[Union[str, bytes]] = None) -> Tuple[bytes, bytes]:
    """A new ECDSA key pair as PEM: (PKCS#8 private key, SubjectPublicKeyInfo public key).

    Args:
        curve: "p256" (default), "p384" or "p521" ("ecdsa-p256" is accepted too).
        password: encrypts the private key PEM (PKCS#8 with the best available
            algorithm) when given; ``model_signing sign key --password`` opens it.

    Returns:
        ``(private_pem, public_pem)``.

    Raises:
        ValueError: an unknown curve.
        MissingDependencyError: the ``cryptography`` package is not installed.

    Example:
        >>> private_pem, public_pem = generate_ecdsa_key("p384")
        >>> public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")
        True
    """
    ec, serialization = _ec()
    name = _curve_name(curve)
    key = ec.generate_private_key(getattr(ec, CURVES[name].upper())())
    encryption = (serialization.NoEncryption() if password is None
                  else serialization.BestAvailableEncryption(_password_bytes(password)))
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    return private_pem, public_key_pem(key.public_key())


def public_key_pem(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """The SubjectPublicKeyInfo PEM of a ``cryptography`` public key.

    Args:
        public_key: an ``EllipticCurvePublicKey`` (any ``cryptography`` public key works).

    Returns:
        The PEM bytes, ``-----BEGIN PUBLIC KEY-----`` ... .
    """
    _, serialization = _ec()
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_hint(public_key: ec.EllipticCurvePublicKey) -> str:
    """The key's identifier in a model-signing bundle: SHA-256 of its public PEM, in hex.

    ``model_signing`` (1.1 and later) writes it as ``verificationMaterial.publicKey.hint``
    and refuses a bundle whose hint is not the verifying key's, so it tells which key
    signed a bundle without trying each one.

    Args:
        public_key: an ``EllipticCurvePublicKey``.

    Returns:
        64 hexadecimal digits.
    """
    return hashlib.sha256(public_key_pem(public_key)).hexdigest()


def save_ecdsa_keypair(path: PathLike, curve: str = "p256", *, password: Optional[Union[str, bytes]] = None) -> dict:
    """Write a new ECDSA key pair: the private key PEM to ``path`` (mode 0600) and the
    public key PEM to ``path + ".pub"``, each atomically.

    Args:
        path: the private key file; the public key goes beside it with ``.pub`` added.
        curve: "p256", "p384" or "p521".
        password: encrypts the private key file when given.

    Returns:
        ``{"private", "public", "curve", "key_hint"}``.

    Raises:
        ValueError: an unknown curve.
        AprIOError: a file cannot be written.
    """
    name = _curve_name(curve)
    private_pem, public_pem = generate_ecdsa_key(name, password=password)
    path = os.fspath(path)
    write_key_file(path, private_pem, private=True)
    write_key_file(path + ".pub", public_pem, private=False)
    return {"private": path, "public": path + ".pub", "curve": name,
            "key_hint": hashlib.sha256(public_pem).hexdigest()}


def load_ecdsa_private_key(path: PathLike, *, password: Optional[Union[str, bytes]] = None,
                           ) -> ec.EllipticCurvePrivateKey:
    """Read an ECDSA private key PEM file (PKCS#8 or SEC1 ``EC PRIVATE KEY``).

    Args:
        path: the PEM file.
        password: the key's password when the PEM is encrypted.

    Returns:
        A ``cryptography`` ``EllipticCurvePrivateKey`` on P-256, P-384 or P-521.

    Raises:
        FormatError: not a PEM private key, a wrong password, or a key that is not ECDSA
            on one of the three curves (an Ed25519 key says so and how to make an ECDSA one).
        AprIOError: the file cannot be read.
    """
    ec, serialization = _ec()
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_private_key(data, None if password is None else _password_bytes(password))
    except TypeError as error:  # encrypted without a password, or a password for a plain key
        raise FormatError(f"unreadable private key: {error}", path=path) from error
    except ValueError as error:
        raise FormatError(f"not a PEM private key this build reads (or a wrong password): {error}",
                          path=path) from error
    except Exception as error:  # cryptography's UnsupportedAlgorithm
        raise FormatError(f"unsupported private key: {error}", path=path) from error
    _check_curve(key, ec.EllipticCurvePrivateKey, path)
    return key


def load_ecdsa_public_key(path: PathLike) -> ec.EllipticCurvePublicKey:
    """Read an ECDSA public key PEM file (SubjectPublicKeyInfo).

    Args:
        path: the PEM file.

    Returns:
        A ``cryptography`` ``EllipticCurvePublicKey`` on P-256, P-384 or P-521.

    Raises:
        FormatError: not a PEM public key, or not ECDSA on one of the three curves.
        AprIOError: the file cannot be read.
    """
    ec, serialization = _ec()
    data = _read_key_file(path)
    if b"PRIVATE KEY-----" in data:
        raise FormatError("this is a private key; verifying takes the public key (the .pub file)", path=path)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as error:
        raise FormatError(f"not a PEM public key: {error}", path=path) from error
    except Exception as error:  # cryptography's UnsupportedAlgorithm
        raise FormatError(f"unsupported public key: {error}", path=path) from error
    _check_curve(key, ec.EllipticCurvePublicKey, path)
    return key


def _check_curve(key, ec_class, path) -> None:
    if not isinstance(key, ec_class):
        kind = type(key).__name__.lstrip("_")
        raise FormatError(f"the file holds a {kind}, not an ECDSA key; model-signing bundles take ECDSA "
                          "keys on P-256, P-384 or P-521 only (make one with: apr keygen PATH --type ecdsa-p256)",
                          path=path)
    if key.curve.name not in CURVES.values():
        raise FormatError(f"an ECDSA key on {key.curve.name}; model-signing bundles take P-256, P-384 or "
                          "P-521 only", path=path)


def _password_bytes(password) -> bytes:
    return password.encode("utf-8") if isinstance(password, str) else bytes(password)


def _read_key_file(path) -> bytes:
    data = read_key_file(path)
    if not data.lstrip().startswith(b"-----BEGIN "):
        raise FormatError("not a PEM key file (ECDSA keys for model signing are PEM)", path=path)
    return data
