"""Federated datasets: the container, splitters, the papers' generators and a registry."""

from .federated import FederatedDataset, as_federated
from .generators import (
    GARST_EXTREME_CLUSTERS,
    digits,
    dwf_blobs,
    g2,
    garst_centres,
    garst_extreme_split,
    garst_federated,
    garst_grid,
    stallmann_motivational,
    triebe_1d,
)
from .population import ClientPopulation, blob_population
from .registry import DATASETS, load_dataset
from .splitters import (
    SPLITTERS,
    split_column,
    split_dirichlet,
    split_distance,
    split_half_iid,
    split_iid,
    split_indices,
    split_non_iid,
)

__all__ = [
    "FederatedDataset",
    "ClientPopulation",
    "blob_population",
    "as_federated",
    "load_dataset",
    "DATASETS",
    "SPLITTERS",
    "split_indices",
    "split_iid",
    "split_half_iid",
    "split_non_iid",
    "split_dirichlet",
    "split_distance",
    "split_column",
    "triebe_1d",
    "garst_centres",
    "garst_grid",
    "garst_federated",
    "garst_extreme_split",
    "GARST_EXTREME_CLUSTERS",
    "stallmann_motivational",
    "g2",
    "dwf_blobs",
    "digits",
]
