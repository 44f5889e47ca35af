"""Flower's own SecAgg+ as a deployable Flower app (benchmark only).

``server:app`` runs ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares,
reconstruction_threshold))`` with ``FedAvg`` for ``num-rounds`` rounds and times each
``SecAggPlusWorkflow`` call (from its first message to the aggregated result);
``client:app`` is ``ClientApp(client_fn, mods=[secaggplus_mod])`` around a ``NumPyClient``
returning a fixed float32 vector of length ``length``. The app directory holds only
``pyproject.toml``; ``python -m benchmarks.deployment_secagg`` runs it with
``flwr run`` on a :class:`~securefkm.flower.deploy.LocalDeployment` next to securefkm's
own app.
"""
