"""TLS certificates and SuperNode authentication keys for a Deployment Engine on loopback.

The SuperLink serves TLS with a certificate for 127.0.0.1 and localhost, signed by a CA that the sites
verify against; each SuperNode authenticates with an ECDSA key (NIST curve) in OpenSSH format, whose
public half is registered beforehand (`flwr supernode register`). Valid files are reused, so that a
second pilot on the same folder keeps its sites' identities; private keys are mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cli.deployment.processes import LOOPBACK
from dirichlet_fl.files import write_atomically

CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.pem", "server.key"
_VALIDITY = dt.timedelta(days=365)
_RENEW_MARGIN = dt.timedelta(days=1)
_NODE_KEY_CURVE = ec.SECP384R1()  # the curve Flower's docs use (ssh-keygen -t ecdsa -b 384)
_NIST_CURVES = ("secp256r1", "secp384r1", "secp521r1")


@dataclass(frozen=True)
class CertPaths:
    """PEM files for TLS: the CA the sites trust and the SuperLink's server certificate and key."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode's authentication key pair, both in OpenSSH format (what Flower 1.42 reads)."""

    private_key: Path
    public_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)


def _build_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that may sign only end-entity certificates (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name("dirichlet-fl pilot CA"))
        .issuer_name(_name("dirichlet-fl pilot CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(ski, critical=False)
    )
    return key, builder.sign(key, hashes.SHA256())


def _build_server(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate for 127.0.0.1 and localhost, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))])
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    return key, builder.sign(ca_key, hashes.SHA256())


def _same_key(private: object, cert: x509.Certificate) -> bool:
    pem = serialization.Encoding.PEM
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    public = private.public_key()  # type: ignore[attr-defined]
    return public.public_bytes(pem, spki) == cert.public_key().public_bytes(pem, spki)


def certificates_valid(paths: CertPaths) -> bool:
    """Whether existing files form a usable set: CA signs server cert, keys match, SANs, dates."""
    try:
        ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
        server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
        server_key = serialization.load_pem_private_key(paths.server_key.read_bytes(), password=None)
        ca.verify_directly_issued_by(ca)
        server.verify_directly_issued_by(ca)
        san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception:  # any unreadable, mismatched or malformed file: the set is not usable
        return False
    horizon = dt.datetime.now(dt.UTC) + _RENEW_MARGIN
    has_names = "localhost" in san.get_values_for_type(x509.DNSName) and ipaddress.ip_address(
        LOOPBACK
    ) in san.get_values_for_type(x509.IPAddress)
    in_date = min(ca.not_valid_after_utc, server.not_valid_after_utc) > horizon
    return has_names and in_date and _same_key(ca_key, ca) and _same_key(server_key, server)


def make_certificates(directory: Path) -> CertPaths:
    """Create (or reuse, if present and valid) a self-signed CA and a loopback server certificate.

    The server certificate carries SAN DNS:localhost and IP:127.0.0.1 so that SuperNodes and the
    CLI, which dial 127.0.0.1, can verify it. Private keys are written with mode 0600. Any
    inconsistent or expiring set is replaced as a whole, so the CA always matches the server cert.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(directory / CA_CERT, directory / CA_KEY, directory / SERVER_CERT, directory / SERVER_KEY)
    if certificates_valid(paths):
        os.chmod(paths.ca_key, 0o600)
        os.chmod(paths.server_key, 0o600)
        return paths
    ca_key, ca_cert = _build_ca()
    server_key, server_cert = _build_server(ca_key, ca_cert)
    pkcs8 = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    pem = serialization.Encoding.PEM
    write_atomically(paths.ca_key, ca_key.private_bytes(pem, pkcs8, none), mode=0o600)
    write_atomically(paths.server_key, server_key.private_bytes(pem, pkcs8, none), mode=0o600)
    write_atomically(paths.ca_cert, ca_cert.public_bytes(pem))
    write_atomically(paths.server_cert, server_cert.public_bytes(pem))
    return paths


def _node_keys_valid(keys: NodeKeys) -> bool:
    """Whether an existing pair parses as Flower reads it and the public key matches the private."""
    try:
        private = serialization.load_ssh_private_key(keys.private_key.read_bytes(), password=None)
        public = serialization.load_ssh_public_key(keys.public_key.read_bytes())
    except Exception:  # unreadable or not an OpenSSH key: generate a fresh pair
        return False
    if not isinstance(private, ec.EllipticCurvePrivateKey) or private.curve.name not in _NIST_CURVES:
        return False
    ssh = serialization.Encoding.OpenSSH
    return private.public_key().public_bytes(ssh, serialization.PublicFormat.OpenSSH) == (
        public.public_bytes(ssh, serialization.PublicFormat.OpenSSH)
    )


def make_node_keys(directory: Path, site_id: int) -> NodeKeys:
    """Create (or reuse, if present and valid) site ``site_id``'s SuperNode authentication keys.

    Same format as ``ssh-keygen -t ecdsa -b 384 -N ""`` (Flower's documented recipe): an OpenSSH
    private key (mode 0600), given to the SuperNode with ``--auth-supernode-private-key``, and an
    OpenSSH public key, registered with ``flwr supernode register``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    keys = NodeKeys(directory / f"supernode-{site_id}", directory / f"supernode-{site_id}.pub")
    if _node_keys_valid(keys):
        os.chmod(keys.private_key, 0o600)
        return keys
    private = ec.generate_private_key(_NODE_KEY_CURVE)
    private_bytes = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public_bytes = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    write_atomically(keys.private_key, private_bytes, mode=0o600)
    write_atomically(keys.public_key, public_bytes + f" site-{site_id}\n".encode())
    return keys

