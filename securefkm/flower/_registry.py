"""Pairwise masking's identity registry backed by the provisioned directory (deployment PKI)."""

from __future__ import annotations

from protocols.masking.keys import IdentityRegistry

from ..exceptions import InputError
from .directory import Directory


class DirectoryRegistry(IdentityRegistry):
    """A pairwise-masking identity registry backed by the provisioned directory.

    Same interface as :class:`protocols.masking.keys.IdentityRegistry` (``public``,
    ``private(c)``, ``provision(ids)``), but it never creates keys: ``public`` is the
    directory, and only this node's own private key (client ``client_id``) is available.
    """

    def __init__(self, directory: Directory, *, client_id: int | None = None, private: bytes | None = None):
        super().__init__()
        self.public = directory.as_dict()
        if private is not None:
            self._private[int(client_id)] = private

    def provision(self, client_ids) -> None:
        missing = [int(c) for c in client_ids if int(c) not in self.public]
        if missing:
            raise InputError(
                f"the directory enrolls {len(self.public)} node key(s) but the run has client(s) "
                f"{missing[:5]}: enroll one key per SuperNode (`securefkm provision directory`)."
            )

    def private(self, client: int) -> bytes:
        if int(client) not in self._private:
            raise InputError(f"this node holds no identity key for client {client}.")
        return self._private[int(client)]
