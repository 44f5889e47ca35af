"""Paillier aggregation: packed additively homomorphic encryption with a separate key authority.

Public API: :class:`Paillier` (the aggregator layer), :class:`KeyAuthority` (private-key
holder), :class:`SlotLayout` (packing) and the signed protocol messages. See
``docs/protocols/paillier.md``.
"""

from .authority import (
    KEY_SIZES,
    AuthorityRefusal,
    DecryptedAggregate,
    EncryptedContribution,
    EncryptRequest,
    KeyAuthority,
    PublicBundle,
    RoundTicket,
    homomorphic_sum,
    sign_contribution,
    verify_contribution,
)
from .ideal import IdealPaillier  # also registers it as Paillier's ideal functionality
from .layer import Paillier, PaillierClientSession, value_bits_for_codec
from .packing import SlotLayout, headroom_bits, layout_for_key

__all__ = [
    "KEY_SIZES",
    "AuthorityRefusal",
    "DecryptedAggregate",
    "EncryptRequest",
    "EncryptedContribution",
    "IdealPaillier",
    "KeyAuthority",
    "Paillier",
    "PaillierClientSession",
    "PublicBundle",
    "RoundTicket",
    "SlotLayout",
    "headroom_bits",
    "homomorphic_sum",
    "layout_for_key",
    "sign_contribution",
    "value_bits_for_codec",
    "verify_contribution",
]
