"""TLS material for a deployment: a run CA, server and client certificates, ``ssl`` contexts.

Everything is X.509 made with ``cryptography`` (ECDSA P-256, SHA-256) and checked by the
standard library's :mod:`ssl` (OpenSSL): chain, validity period, host name, and -- on the
key authority -- that the peer presents a certificate of the *client* CA. Used by
``securefkm deploy`` (a run CA in the run directory), by ``securefkm authority serve`` and
by the ServerApp's :class:`~securefkm.flower.authority_client.RemoteAuthority`.

Two CAs on purpose: the **server CA** signs what peers must trust as servers (SuperLink,
key authority); the **authority-client CA** signs exactly one certificate, the
ServerApp's, so "a certificate of this CA" means "the ServerApp" to the authority
(:func:`server_context` additionally pins the admitted common names).
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..exceptions import InputError

#: the common name of the ServerApp's client certificate (what the authority admits)
SERVERAPP_NAME = "securefkm-serverapp"


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its private key on disk (PEM)."""

    cert: Path
    key: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _save(prefix: Path, cert: x509.Certificate, key) -> CertFiles:
    return CertFiles(
        _write(prefix.with_suffix(".pem"), cert.public_bytes(serialization.Encoding.PEM)),
        _write(prefix.with_suffix(".key"), key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), private=True),
    )


def _load(files: CertFiles):
    cert = x509.load_pem_x509_certificate(Path(files.cert).read_bytes())
    key = serialization.load_pem_private_key(Path(files.key).read_bytes(), password=None)
    return cert, key


def create_ca(prefix, common_name: str, *, days: int = 30) -> CertFiles:
    """A self-signed CA (``prefix.pem`` + ``prefix.key``, key mode 0600)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return _save(Path(prefix), cert, key)


def issue(ca: CertFiles, prefix, common_name: str, *, server: bool, hosts=("127.0.0.1", "localhost"),
          days: int = 30, not_before: _dt.datetime | None = None) -> CertFiles:
    """A leaf certificate signed by ``ca``: a TLS server (``hosts`` as SANs) or a TLS client.

    ``not_before`` / ``days`` exist so tests can make an expired certificate.
    """
    ca_cert, ca_key = _load(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or (_dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if server:
        sans = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _save(Path(prefix), builder.sign(ca_key, hashes.SHA256()), key)


def _need(path, what: str, flag: str) -> str:
    if not path:
        raise InputError(f"{what} is required for TLS: pass {flag} (or --insecure on loopback for debugging).")
    if not Path(path).is_file():
        raise InputError(f"{what} {str(path)!r} does not exist ({flag}).")
    return str(path)


def server_context(cert, key, client_ca) -> ssl.SSLContext:
    """TLS >= 1.2 server context that *requires* a client certificate signed by ``client_ca``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(_need(cert, "the server certificate", "--cert"), _need(key, "its private key", "--key"))
    ctx.load_verify_locations(_need(client_ca, "the CA of the allowed clients", "--client-ca"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca, cert=None, key=None) -> ssl.SSLContext:
    """TLS >= 1.2 client context trusting only ``ca``, presenting ``cert``/``key`` if given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname + CERT_REQUIRED by default
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(_need(ca, "the CA that signed the authority's certificate", "authority-ca"))
    if cert or key:
        ctx.load_cert_chain(_need(cert, "the client certificate", "authority-cert"),
                            _need(key, "the client key", "authority-key"))
    return ctx


def peer_common_name(peercert: dict | None) -> str | None:
    """The subject CN of a verified peer certificate as :meth:`ssl.SSLSocket.getpeercert` gives it."""
    for rdn in (peercert or {}).get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                return v
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RunPKI:
    """The certificates ``securefkm deploy`` makes in a run directory (loopback)."""

    root: Path
    ca: CertFiles                # server CA: SuperLink + authority certificates
    superlink: CertFiles
    authority: CertFiles
    client_ca: CertFiles         # authority-client CA: signs only the ServerApp's certificate
    serverapp: CertFiles


def create_run_pki(root, *, hosts=("127.0.0.1", "localhost")) -> RunPKI:
    """A fresh run CA and every certificate a loopback deployment needs, under ``root``."""
    root = Path(root)
    ca = create_ca(root / "ca", "securefkm run CA")
    client_ca = create_ca(root / "authority-client-ca", "securefkm authority client CA")
    return RunPKI(
        root, ca,
        issue(ca, root / "superlink", "securefkm-superlink", server=True, hosts=hosts),
        issue(ca, root / "authority", "securefkm-authority", server=True, hosts=hosts),
        client_ca,
        issue(client_ca, root / "serverapp", SERVERAPP_NAME, server=False),
    )
