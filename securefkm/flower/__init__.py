"""securefkm as a Flower app (Message API): ServerApp, ClientApp, transport, local deployment.

This is the only part of securefkm that imports ``flwr`` (install ``securefkm[flower]``).

* :mod:`securefkm.flower.serverapp` -- the ServerApp: the federation runtime over Flower.
* :mod:`securefkm.flower.clientapp` -- the ClientApp: one data owner, data from its CSV.
* :mod:`securefkm.flower.transport` -- :class:`FlowerTransport`, one message per (client, stage).
* :mod:`securefkm.flower.spec` -- :class:`RunSpec`, the JSON run spec both sides build from.
* :mod:`securefkm.flower.deploy` -- start/stop a local SuperLink + SuperNodes, run, collect.
* :mod:`securefkm.flower.directory` -- node identity keys and the public directory (bottom layer).
* :mod:`securefkm.flower.provision` -- the ``identify`` stage and applying identities to the
  layers (Paillier, masking ``sign_keys=True``).
* :mod:`securefkm.flower.authority_service` -- the Paillier key authority as its own
  long-lived HTTPS service (client certificates, one keypair per run).
* :mod:`securefkm.flower.authority_client` -- the ServerApp's and the nodes' views of it.
* :mod:`securefkm.flower.tls` -- run CA and certificates, ``ssl`` contexts.
* :mod:`securefkm.flower.checkpoint` -- the crash-safe ServerApp's checkpoint and resume.

Imports are layered (no cycles): ``directory`` <- ``_registry``, ``tls``, ``authority_wire``
<- ``authority_client``, ``authority_service`` <- ``provision`` <- ``serverapp`` / ``clientapp``.

See ``docs/deployment.md``.
"""

from __future__ import annotations

from securefkm.lazy import lazy_exports

_EXPORTS = {
    "RunSpec": "securefkm.flower.spec",
    "build_federation": "securefkm.flower.spec",
    "FlowerTransport": "securefkm.flower.transport",
    "LocalDeployment": "securefkm.flower.deploy",
    "DeploymentResult": "securefkm.flower.deploy",
    "write_client_csvs": "securefkm.flower.deploy",
    "read_client_csv": "securefkm.flower.clientapp",
    "APP_DIR": "securefkm.flower.deploy",
    "Directory": "securefkm.flower.provision",
    "provision_local": "securefkm.flower.provision",
    "create_node_key": "securefkm.flower.provision",
    "RemoteAuthority": "securefkm.flower.authority_client",
    "AuthorityService": "securefkm.flower.authority_service",
    "read_result": "securefkm.flower.serverapp",
}

__getattr__, __dir__, __all__ = lazy_exports("securefkm.flower", _EXPORTS)
