"""ClientApp of the SecAgg+ benchmark app: Flower's ``secaggplus_mod`` around a fixed-vector client."""

from __future__ import annotations

from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp

from benchmarks.protocols_secaggplus import fixed_vector_client


def client_fn(context):
    return fixed_vector_client(int(context.run_config["length"]))


app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
