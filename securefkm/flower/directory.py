"""Node identity keys and the public directory: the bottom layer of securefkm's deployment PKI.

Pure data and crypto (``cryptography``, no ``flwr``, no other ``securefkm.flower`` module),
so everything above -- :mod:`.provision` (what the ServerApp/SuperNodes do with them),
:mod:`.authority_service` and :mod:`.authority_client` -- imports this one and never each
other in a circle. See :mod:`securefkm.flower.provision` for the provisioning steps.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..exceptions import InputError

DIRECTORY_FORMAT = "securefkm-directory/v1"


# ------------------------------------------------------------------ keys
def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def create_node_key(path, *, exist_ok: bool = True) -> bytes:
    """Create this node's Ed25519 identity key at ``path`` (PEM, mode 0600); return the public key.

    The private key never leaves the node; its public half (32 raw bytes, also written as
    hex to ``path.pub``) goes into the directory. With ``exist_ok`` an existing key is kept
    (its public key is returned), so the command is idempotent.
    """
    path = Path(path)
    if path.exists():
        if not exist_ok:
            raise InputError(f"{path} already exists; refusing to overwrite an identity key.")
        public = public_key_of(load_node_key(path))
    else:
        sk = Ed25519PrivateKey.generate()
        _write_private(path, sk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        public = sk.public_key().public_bytes_raw()
    Path(f"{path}.pub").write_text(public.hex() + "\n")
    return public


def load_node_key(path) -> bytes:
    """The raw 32-byte Ed25519 private key stored (PEM) at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"identity key {str(path)!r} does not exist; create it on this node with "
            f"`securefkm provision node-key {path}` and enroll the printed public key in the directory."
        )
    try:
        sk = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"identity key {str(path)!r} is not an unencrypted PEM private key ({exc}).") from None
    if not isinstance(sk, Ed25519PrivateKey):
        raise InputError(f"identity key {str(path)!r} is not an Ed25519 key.")
    return sk.private_bytes_raw()


def public_key_of(private: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def parse_public_key(text: str, what: str = "public key") -> bytes:
    """32 raw bytes from 64 hex digits, or from a file holding them (e.g. ``node.key.pub``)."""
    text = str(text).strip()
    if len(text) != 64 and os.path.isfile(text):
        text = Path(text).read_text().strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise InputError(f"{what} must be 64 hex digits (an Ed25519 public key) or a file holding them, got {text[:80]!r}.")
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise InputError(f"{what} is not a valid Ed25519 public key ({exc}).") from None
    return raw


# ------------------------------------------------------------------ directory
@dataclass(frozen=True)
class Directory:
    """The public directory: client id -> enrolled Ed25519 public key, + the authority's key.

    ``nodes[i]`` is the public key of client ``i``; ``names[i]`` a label for operators;
    ``authority_key`` the key authority's Ed25519 verify key (Paillier only, else None).
    """

    nodes: tuple[bytes, ...]
    names: tuple[str, ...] = ()
    authority_key: bytes | None = None

    def __post_init__(self):
        if not self.nodes:
            raise InputError("the directory lists no nodes; enroll at least two node keys.")
        if len(set(self.nodes)) != len(self.nodes):
            raise InputError("the directory lists one node key twice; every client needs its own key.")
        if self.names and len(self.names) != len(self.nodes):
            raise InputError("the directory's names and nodes differ in length.")
        if not self.names:
            object.__setattr__(self, "names", tuple(f"node_{i}" for i in range(len(self.nodes))))

    # -- lookups
    def __len__(self) -> int:
        return len(self.nodes)

    def client_id_of(self, public: bytes) -> int | None:
        try:
            return self.nodes.index(public)
        except ValueError:
            return None

    def as_dict(self) -> dict[int, bytes]:
        return dict(enumerate(self.nodes))

    @property
    def digest(self) -> bytes:
        """SHA-256 of the canonical JSON: names this exact directory in signatures."""
        return hashlib.sha256(self.to_json().encode()).digest()

    def with_authority(self, authority_key: bytes) -> Directory:
        return Directory(self.nodes, self.names, bytes(authority_key))

    # -- JSON
    def to_json(self) -> str:
        return json.dumps(
            {
                "format": DIRECTORY_FORMAT,
                "authority": None if self.authority_key is None else self.authority_key.hex(),
                "nodes": [{"name": n, "key": k.hex()} for n, k in zip(self.names, self.nodes)],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, source: str = "directory") -> Directory:
        try:
            raw = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise InputError(f"{source} is not valid JSON ({exc}); write it with `securefkm provision directory`.") from None
        if not isinstance(raw, dict) or raw.get("format") != DIRECTORY_FORMAT or not isinstance(raw.get("nodes"), list):
            raise InputError(f"{source} is not a {DIRECTORY_FORMAT} directory; write it with `securefkm provision directory`.")
        names, keys = [], []
        for i, node in enumerate(raw["nodes"]):
            if not isinstance(node, dict) or not isinstance(node.get("key"), str):
                raise InputError(f"{source}: nodes[{i}] must be an object with 'key' (hex) and 'name'.")
            keys.append(parse_public_key(node["key"], f"{source} nodes[{i}].key"))
            names.append(str(node.get("name", f"node_{i}")))
        auth = raw.get("authority")
        auth = None if auth in (None, "") else parse_public_key(auth, f"{source} authority")
        return cls(tuple(keys), tuple(names), auth)

    @classmethod
    def load(cls, path) -> Directory:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"directory file {str(path)!r} does not exist; copy the deployment's directory.json there.")
        return cls.from_json(path.read_text(), f"directory {str(path)!r}")

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json() + "\n")
        os.replace(tmp, path)
        return path


def directory_from_config(value, what: str) -> Directory:
    """A directory from a config value: inline JSON (starts with ``{``) or a file path."""
    text = str(value or "").strip()
    if text.startswith("{"):
        return Directory.from_json(text, what)
    return Directory.load(text)
