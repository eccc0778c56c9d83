"""The certificates a real control plane needs, made fresh for each one: a cluster CA, serving
certificates, client certificates (a Kubernetes user is a certificate's CN, its groups the O's), and
the key pair that signs ServiceAccount tokens."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any test session, short enough that a leaked file is soon worthless.
VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Credential:
    """A certificate and its key, as files the components read."""

    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*parts, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class CertificateAuthority:
    """One cluster CA in `directory`; it signs every other certificate of that cluster."""

    def __init__(self, directory: Path, common_name: str = "batchd-test-ca") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._subject = _name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(self._subject)
            .issuer_name(self._subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / "ca.crt"
        self.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, directory / "ca.key")
        self.key = directory / "ca.key"

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
        client: bool = True,
    ) -> Credential:
        """A certificate signed by this CA, for a server (with `hosts` as its names and addresses),
        a client (a user `common_name` in the groups `organizations`), or both."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(h) for h in hosts]), False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        credential = Credential(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        credential.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, credential.key)
        return credential


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def service_account_keys(directory: Path) -> tuple[Path, Path]:
    """The key pair that signs ServiceAccount tokens: (private key, public key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / "sa.key", directory / "sa.pub"
    _write_key(key, private)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public
