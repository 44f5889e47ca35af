"""securefkm: privacy-hardened federated clustering."""

__version__ = "0.1.0"
