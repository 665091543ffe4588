"""Certificate authorities and certificates made by the tests, for real TLS (see test_auth)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM, written beside each other."""

    cert: Path
    key: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key.read_bytes()


class Authority:
    """A self-signed CA that issues server and client certificates into `directory`."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            _builder(subject, subject, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.issued = self._write(name, self._cert, self._key)

    def server(self, name: str = "localhost") -> Issued:
        return self._issue(
            name,
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        )

    def client(self, name: str) -> Issued:
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def _issue(
        self, name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = _builder(subject, self._cert.subject, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return self._write(name, builder.sign(self._key, hashes.SHA256()), key)

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"{self.name}-{name}".replace(" ", "_")
        issued = Issued(stem.with_suffix(".crt"), stem.with_suffix(".key"))
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        issued.key.chmod(0o600)  # the engine refuses a key that others may read
        return issued


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
