"""Out-of-band provisioning of node identities for secure aggregation over Flower.

Paillier and pairwise masking with ``sign_keys=True`` need every data owner to hold a
long-term **Ed25519 identity key** that the other parties know in advance. In process the
layers simulate that PKI; in a deployment it is provisioned out of band:

1. **Node key** (on each node, never shipped): ``securefkm provision node-key PATH`` creates
   an Ed25519 private key (PKCS#8 PEM, mode 0600) at ``PATH`` and prints its public half
   (also written to ``PATH.pub``). The SuperNode gets the path in its node config:
   ``identity-key='PATH'``.
2. **Directory** (public): the operator collects the public keys and, for Paillier, the key
   authority's verify key (``securefkm authority init``) into one JSON file:
   ``securefkm provision directory --node KEY0 --node KEY1 ... --authority AUTH -o directory.json``.
   Client id ``i`` is the ``i``-th node of the directory (not the Flower node id). Every
   SuperNode gets the file in its node config (``directory='directory.json'``), the
   ServerApp in its run config (``directory``, a path or the JSON text) and the authority
   service with ``--directory``.
3. At the start of a run that needs identities the ServerApp sends each SuperNode one
   ``identify`` message (a fresh challenge, the node id, the authority's signed public
   bundle for Paillier). The node looks up its own public key in *its own* directory
   file, checks the server uses the same directory and that the authority signed the
   bundle, and signs ``(challenge, node id, client id, directory digest, bundle
   fingerprint)``. The server checks every signature against the directory and maps client
   ids to Flower node ids from these replies.

Trust: the client-side trust anchors (peer keys, authority verify key) come from the
node's own files, never from the server: a server that ships another directory in the run
config only makes the ``identify`` stage fail. Whoever writes the directory controls who
counts as a client (Sybils): it must not be the aggregation server alone.

``provision_local`` does all of this for a loopback deployment
(:class:`~securefkm.flower.deploy.LocalDeployment`). This module does not import ``flwr``.

Layers (no import cycles): :mod:`.directory` (keys, directory) <- :mod:`._registry`,
:mod:`.authority_wire` <- :mod:`.authority_client`, :mod:`.authority_service` <- this module.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..exceptions import InputError
from ._registry import DirectoryRegistry
from .authority_client import BundleView
from .authority_service import init_authority_keys
from .directory import (  # noqa: F401  (re-exported: the provisioning API users import from here)
    DIRECTORY_FORMAT,
    Directory,
    create_node_key,
    directory_from_config,
    load_node_key,
    parse_public_key,
    public_key_of,
)

DOMAIN_IDENTIFY = b"securefkm/flower/identify/v1"
#: node config keys
NODE_IDENTITY_KEY = "identity-key"
NODE_DIRECTORY = "directory"
#: run config keys
RUN_DIRECTORY = "directory"
RUN_AUTHORITY_URL = "authority-url"
#: the stage name of the identification exchange (before the first round)
IDENTIFY_STAGE = "identify"


# ------------------------------------------------------------------ what a spec needs
@dataclass(frozen=True)
class Requirements:
    identity: bool = False   # node identity keys + directory (Paillier, masking sign_keys, validation)
    authority: bool = False  # the key authority service (Paillier's keys, or the validation Helper)
    helper: bool = False     # the validation Helper, hosted by the key authority service

    def __bool__(self) -> bool:
        return self.identity


def requirements(protection) -> Requirements:
    """What a list of layer specs (or a :class:`RunSpec`) needs provisioned in a deployment."""
    protection = getattr(protection, "protection", protection) or []
    identity = authority = helper = False
    for layer in protection:
        name = layer if isinstance(layer, str) else layer.get("name") if isinstance(layer, dict) else None
        if name == "paillier":
            identity = authority = True
        elif name == "validated":
            identity = authority = helper = True
        elif name == "masking" and isinstance(layer, dict) and layer.get("sign_keys"):
            identity = True
    return Requirements(identity, authority, helper)


# ------------------------------------------------------------------ identify stage
def identify_payload(challenge: bytes, node_id: int, client_id: int, directory_digest: bytes,
                     bundle_fingerprint: bytes = b"") -> bytes:
    """Canonical bytes a node signs in the ``identify`` stage (length-prefixed, domain-separated)."""
    return b"".join([
        DOMAIN_IDENTIFY,
        struct.pack(">H", len(challenge)), challenge,
        struct.pack(">Qq", int(node_id) & (2**64 - 1), int(client_id)),
        struct.pack(">H", len(directory_digest)), directory_digest,
        struct.pack(">H", len(bundle_fingerprint)), bundle_fingerprint,
    ])


def verify_identify(public: bytes, signature: bytes, payload: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, payload)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def new_challenge() -> bytes:
    return secrets.token_bytes(16)


# ------------------------------------------------------------------ applying to layers
def _layers_of(protection):
    from protocols.masking import PairwiseMasking
    from protocols.paillier import Paillier
    from protocols.validated import ValidatedAggregation

    for layer in protection:
        if isinstance(layer, PairwiseMasking) and layer.sign_keys:
            yield "masking", layer
        elif isinstance(layer, Paillier):
            yield "paillier", layer
        elif isinstance(layer, ValidatedAggregation):
            yield "validated", layer


class ServerProvisioning:
    """The ServerApp's view: the directory and the clients of the authority service (Paillier's
    keys; the validation Helper)."""

    def __init__(self, directory: Directory, authority=None, helper=None):
        self.directory = directory
        self.authority = authority
        self.helper = helper

    def key(self) -> tuple:
        return ("server", self.directory.digest, getattr(self.authority, "url", None),
                getattr(self.helper, "url", None))

    def apply(self, protection) -> None:
        for kind, layer in _layers_of(protection):
            if kind == "masking":
                layer.registry = DirectoryRegistry(self.directory)
            elif kind == "validated":
                if self.helper is None:
                    raise InputError(
                        "protection 'validated' over Flower needs the validation Helper, which the key authority "
                        f"service hosts: set the run config {RUN_AUTHORITY_URL!r} to its address "
                        "(`securefkm authority serve ...`)."
                    )
                layer.use_helper(self.helper)
            else:
                if self.authority is None:
                    raise InputError(
                        "protection 'paillier' over Flower needs the key authority service: set the run "
                        f"config {RUN_AUTHORITY_URL!r} to its address (`securefkm authority serve ...`)."
                    )
                bits = self.authority.key_size
                if bits != layer.key_size and not getattr(self.authority, "allow_weak_key", False):
                    raise InputError(
                        f"the spec asks for Paillier key_size={layer.key_size} but the key authority holds a "
                        f"{bits}-bit key; set key_size={bits} in the spec or re-create the authority keys."
                    )
                layer.use_authority(self.authority)


class NodeProvisioning:
    """A SuperNode's view: its own identity key, its own directory file, its client id."""

    def __init__(self, directory: Directory, private: bytes, *, source: str = "node"):
        self.directory = directory
        self.private = private
        self.public = public_key_of(private)
        cid = directory.client_id_of(self.public)
        if cid is None:
            raise InputError(
                f"this node's identity key (public {self.public.hex()[:16]}...) is not enrolled in its "
                f"directory ({source}); add it with `securefkm provision directory` and redistribute the file."
            )
        self.client_id = cid
        self.bundle = None

    @classmethod
    def from_node_config(cls, node_config) -> NodeProvisioning:
        key_path = str(node_config.get(NODE_IDENTITY_KEY, "") or "")
        dir_path = str(node_config.get(NODE_DIRECTORY, "") or "")
        missing = [k for k, v in ((NODE_IDENTITY_KEY, key_path), (NODE_DIRECTORY, dir_path)) if not v]
        if missing:
            raise InputError(
                f"this run needs node identities (Paillier or masking sign_keys) but the SuperNode has no "
                f"node config {' / '.join(repr(m) for m in missing)}: start it with --node-config "
                f"\"data-path='...' {NODE_IDENTITY_KEY}='/path/node.key' {NODE_DIRECTORY}='/path/directory.json'\" "
                "(docs/deployment.md, 'Paillier and signed-key masking')."
            )
        return cls(Directory.load(dir_path), load_node_key(key_path), source=dir_path)

    def key(self) -> tuple:
        return ("node", self.directory.digest, self.public, None if self.bundle is None else self.bundle.fingerprint)

    def sign_identify(self, challenge: bytes, node_id: int, bundle_fingerprint: bytes = b"") -> bytes:
        payload = identify_payload(challenge, node_id, self.client_id, self.directory.digest, bundle_fingerprint)
        return Ed25519PrivateKey.from_private_bytes(self.private).sign(payload)

    def apply(self, protection) -> None:
        for kind, layer in _layers_of(protection):
            if kind == "masking":
                layer.registry = DirectoryRegistry(self.directory, client_id=self.client_id, private=self.private)
            elif kind == "validated":
                if self.directory.authority_key is None:
                    raise InputError("this node's directory has no authority key, the key it trusts as the "
                                     "validation Helper's; add the authority's verify key to the directory file.")
                layer.trust_helper(self.directory.authority_key, self.private)
            else:
                if self.bundle is None:
                    raise InputError("no verified Paillier public bundle on this node: the server skipped the identify stage.")
                layer.use_authority(BundleView(self.bundle, self.directory), signing_key=self.private)


# ------------------------------------------------------------------ local (loopback) provisioning
@dataclass
class LocalPKI:
    """Paths of a loopback deployment's provisioning (all on one machine, for tests and demos)."""

    root: Path
    node_keys: list[Path]
    directory_path: Path
    authority_dir: Path

    @property
    def directory(self) -> Directory:
        return Directory.load(self.directory_path)

    def node_config(self, i: int) -> dict[str, str]:
        return {NODE_IDENTITY_KEY: str(self.node_keys[i]), NODE_DIRECTORY: str(self.directory_path)}

    def ensure_authority(self, key_size: int = 2048) -> bytes:
        """Create the authority's keys (once) and put its verify key into the directory."""
        verify = init_authority_keys(self.authority_dir, key_size=key_size, exist_ok=True)
        d = self.directory
        if d.authority_key != verify:
            d.with_authority(verify).save(self.directory_path)
        return verify


def provision_local(root, n_nodes: int, *, names: Sequence[str] | None = None) -> LocalPKI:
    """Node keys ``root/nodes/node_i.key`` and ``root/directory.json`` for ``n_nodes`` nodes.

    Stands in for the out-of-band steps on one machine: each key is what the node itself
    would create; the directory lists them in order (client ``i`` = ``node_i``). Keys that
    exist are kept. The authority's keys are created on demand (:meth:`LocalPKI.ensure_authority`).
    """
    root = Path(root)
    if n_nodes < 1:
        raise InputError("provision_local needs at least one node.")
    names = list(names) if names is not None else [f"node_{i}" for i in range(n_nodes)]
    paths = [root / "nodes" / f"node_{i}.key" for i in range(n_nodes)]
    publics = [create_node_key(p) for p in paths]
    directory_path = root / "directory.json"
    old = Directory.load(directory_path) if directory_path.is_file() else None
    Directory(tuple(publics), tuple(names), old.authority_key if old else None).save(directory_path)
    return LocalPKI(root, paths, directory_path, root / "authority")


# ------------------------------------------------------------------ CLI (securefkm provision ...)
def add_cli(sub) -> None:
    p = sub.add_parser("provision", help="node identity keys and the public directory (Paillier, signed-key masking)")
    ps = p.add_subparsers(dest="provision", required=True)
    k = ps.add_parser("node-key", help="create this node's Ed25519 identity key (run on the node); prints the public key")
    k.add_argument("path", help="file to write the private key to (the .pub beside it)")
    d = ps.add_parser("directory", help="write the public directory (client i = i-th --node)")
    d.add_argument("--node", action="append", required=True, metavar="KEY",
                   help="a node's public key: 64 hex digits or a .pub file (repeat, in client order)")
    d.add_argument("--name", action="append", default=None, help="a label per --node (optional)")
    d.add_argument("--authority", default=None, help="the key authority's verify key (hex or file; Paillier)")
    d.add_argument("--out", "-o", required=True, help="path of the directory JSON to write")
    loc = ps.add_parser("local", help="all node keys + directory on this machine (loopback tests)")
    loc.add_argument("--nodes", type=int, required=True, help="number of nodes (clients)")
    loc.add_argument("--out", "-o", required=True, help="directory to create")
    loc.add_argument("--authority", action="store_true", help="also create the key authority's keys")


def run_cli(args, out=print) -> None:
    if args.provision == "node-key":
        public = create_node_key(args.path)
        out(public.hex())
    elif args.provision == "directory":
        keys = [parse_public_key(k, f"--node {k}") for k in args.node]
        names = args.name or [f"node_{i}" for i in range(len(keys))]
        if len(names) != len(keys):
            raise InputError("give one --name per --node (or none).")
        auth = None if args.authority is None else parse_public_key(args.authority, "--authority")
        path = Directory(tuple(keys), tuple(names), auth).save(args.out)
        out(f"directory with {len(keys)} node(s) written to {path}")
    elif args.provision == "local":
        pki = provision_local(args.out, args.nodes)
        if args.authority:
            pki.ensure_authority()
        for i, p in enumerate(pki.node_keys):
            out(f"node {i}: identity-key='{p}'")
        out(f"directory='{pki.directory_path}'")
        if args.authority:
            out(f"authority keys: {pki.authority_dir}")
