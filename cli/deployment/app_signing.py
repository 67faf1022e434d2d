"""App pinning with Flower 1.42's own FAB verification: a reviewer's Ed25519 key signs the app, each site
trusts only that key (``flower-supernode --trusted-entities``) and refuses any other app before its code runs.

A pinned SuperNode checks every new run's FAB for an Ed25519 signature of a trusted key over
``signed_at || sha256(FAB)`` and otherwise starts no ClientApp. Flower attaches such records only to FABs
the SuperLink fetched from a Hub (cli/deployment/app_hub.py plays it). The site checks with its own copy of the
public key, so neither the Hub nor the SuperLink nor the coordinator can pass off another app; run-config
overrides are not signed, the site policy checks them (client/site.py). docs/pilot-security.md.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from cli.deployment.processes import DeploymentError
from dirichlet_fl.files import write_atomically

_KEY_NAME = "app-reviewer"


@dataclass(frozen=True)
class ReviewerKey:
    """An Ed25519 signing key in OpenSSH format (what ``flwr app review`` and ``--trusted-entities`` read)."""

    private_key: Path
    public_key: Path

    @property
    def public_line(self) -> str:
        """The public key as one ``ssh-ed25519 AAAA...`` line, without its comment."""
        return " ".join(self.public_key.read_text().split()[:2])

    @property
    def key_id(self) -> str:
        """The key's id in a trusted-entities file and in a FAB's verification records: a hash of the key."""
        return "fpk_" + hashlib.sha256(self.public_line.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Verification:
    """One verification record of a FAB, as Flower Hub returns it for ``fetch-fab``."""

    public_key_id: str
    signature: str  # base64url without padding, as Flower Hub stores it
    signed_at: int

    def as_hub_record(self) -> dict[str, str | int]:
        """The record in Flower Hub's JSON shape (control_handlers._format_verification reads it)."""
        return {"public_key_id": self.public_key_id, "signature": self.signature, "signed_at": self.signed_at}


def make_reviewer_key(directory: Path) -> ReviewerKey:
    """Create (or reuse, if present and valid) the Ed25519 key that signs the apps the sites accept."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ReviewerKey(directory / _KEY_NAME, directory / f"{_KEY_NAME}.pub")
    if _reviewer_key_valid(key):
        os.chmod(key.private_key, 0o600)
        return key
    private = ed25519.Ed25519PrivateKey.generate()
    private_bytes = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    write_atomically(key.private_key, private_bytes, mode=0o600)
    write_atomically(key.public_key, public + b" app-reviewer\n")
    return key


def _reviewer_key_valid(key: ReviewerKey) -> bool:
    try:
        private = serialization.load_ssh_private_key(key.private_key.read_bytes(), password=None)
        public = serialization.load_ssh_public_key(key.public_key.read_bytes())
    except Exception:  # unreadable, absent or not OpenSSH: generate a fresh key
        return False
    if not isinstance(private, ed25519.Ed25519PrivateKey) or not isinstance(public, ed25519.Ed25519PublicKey):
        return False
    return private.public_key().public_bytes_raw() == public.public_bytes_raw()


def build_fab(app_dir: Path) -> bytes:
    """The app's FAB exactly as ``flwr build``/``flwr run`` would bundle it (Flower's own builder)."""
    from flwr.cli.build import build_fab_from_disk

    if not (app_dir / "pyproject.toml").is_file():
        raise DeploymentError(f"app folder {app_dir} has no pyproject.toml: give the Flower app's folder")
    return build_fab_from_disk(app_dir)


def fab_identity(fab: bytes) -> tuple[str, str]:
    """The FAB's Hub id ``@publisher/name`` and version ``x.y.z``, read from its own pyproject.toml."""
    from flwr.common.config import get_fab_config, get_metadata_from_config

    fab_id, version = get_metadata_from_config(get_fab_config(fab))
    return f"@{fab_id}", version


def sign_fab(fab: bytes, key: ReviewerKey, signed_at: int | None = None) -> Verification:
    """Sign ``signed_at || sha256(fab)`` with the reviewer key, as ``flwr app review`` does."""
    from flwr.supercore.primitives.asymmetric_ed25519 import create_message_to_sign

    private = serialization.load_ssh_private_key(key.private_key.read_bytes(), password=None)
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise DeploymentError(f"{key.private_key} is not an Ed25519 key: app signatures need one")
    when = int(time.time()) if signed_at is None else signed_at
    signature = private.sign(create_message_to_sign(hashlib.sha256(fab).digest(), when))
    encoded = base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii")
    return Verification(key.key_id, encoded, when)


def check_trusted_entities(path: Path) -> Path:
    """`path` resolved if it is a usable ``--trusted-entities`` file: YAML mapping at least one key id to a
    public key. Flower 1.42 verifies apps only when the mapping is non-empty (``if trusted_entities:``), so an
    empty pin (``{}``, a careless "trust no keys") would run ANY app unverified: it is refused, loudly, and so
    is a file Flower cannot read as a mapping. DeploymentError names the file and the fix."""
    import yaml  # a dependency of flwr; only this check reads YAML

    if not path.is_file():
        raise DeploymentError(f"--trusted-entities: file not found: {path}")
    try:
        entities = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise DeploymentError(f"--trusted-entities {path} is unreadable ({type(error).__name__})") from None
    if not isinstance(entities, dict) or not entities:
        raise DeploymentError(
            f"--trusted-entities {path} trusts no key: Flower would then run any app unverified; list the "
            "reviewer's key ('<key id>: ssh-ed25519 ...'), or do not start this site (an empty pin refuses every app)"
        )
    return path.resolve()


def write_trusted_entities(path: Path, keys: list[ReviewerKey]) -> Path:
    """A site's ``--trusted-entities`` YAML file: the reviewer keys whose signature it accepts (mode 0600)."""
    if not keys:
        raise DeploymentError("trusted entities: give at least one reviewer key (an empty file trusts nobody)")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = "".join(f"{key.key_id}: '{key.public_line}'\n" for key in keys)
    write_atomically(path, lines.encode(), mode=0o600)
    return path
