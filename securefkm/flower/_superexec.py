"""``python -m securefkm.flower._superexec [flower-superexec args]``: warm ClientApp processes.

Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process (each message of a
multi-stage protocol round included). On a 2-core machine with 10 nodes that process start
(Python + Flower + numpy + cryptography + securefkm imports, ~1.3 s of CPU each) dominates
a deployment round (docs/deployment.md measured 278x the in-process round).

This launcher runs Flower's own SuperExec unchanged except for its executor: instead of
``subprocess.Popen(["flwr-clientapp", ...])`` it starts the ClientApp process from the
standard library's *forkserver* (:mod:`multiprocessing`), whose server process has imported
Flower's ClientApp runtime and ``securefkm.flower.clientapp`` once. Each message still gets
its own process (same isolation from the SuperNode and from other messages; the process
exits after one message; secrets still live in Flower's ``context.state``), it just no
longer pays the imports. The child runs Flower's own ``flwr-clientapp`` entry point with
exactly the arguments Flower's ``SubprocessExecutor`` would pass, so Flower's argument
handling (TLS root certificates, parent-PID monitor, token) is reused, not copied.

:mod:`securefkm.flower._supernode` (used by :class:`~securefkm.flower.deploy.LocalDeployment`)
starts this launcher in place of ``flower-superexec``; set ``SECUREFKM_WARM_CLIENTS=0`` to
get Flower's cold per-message processes back. It relies on Flower internals (the executor
factory ``get_executor`` imported by ``flwr.supercore.superexec.run_superexec``), checked
against flwr 1.41; when they are missing it falls back to Flower's own executor.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys

log = logging.getLogger("securefkm")

#: modules the fork server imports once; every ClientApp process starts with them loaded.
#: Beyond Flower's runtime and the ClientApp, the estimators (scikit-learn's base classes
#: and scipy behind them: seconds of imports per message otherwise), the runtime and the
#: protection layers a client runs. Not opacus/torch: clients read the server's DP
#: calibration from the on-disk cache and never import them.
PRELOAD = (
    "flwr.supernode.cli",
    "flwr.supernode.runtime.run_clientapp",
    "securefkm.flower.clientapp",
    "securefkm.flower.spec",
    "securefkm.flower.provision",
    "securefkm.flower._registry",
    "securefkm.registry",
    "securefkm.federation",
    "securefkm.estimators.dwf",
    "securefkm.estimators.minibatch",
    "securefkm.estimators.aligning",
    "securefkm.estimators.oneshot",
    "securefkm.estimators.fuzzy",
    "protocols.masking.layer",
    "cryptography.hazmat.backends.openssl.backend",  # imported lazily by the masking keys
    "protocols.paillier.layer",
    "phe.paillier",
    "protocols.dp.layer",
    "protocols.rounding",
    "protocols.participation",
    "protocols.min_cluster",
)


def _run_clientapp(argv: list[str]) -> None:
    """Child body: Flower's ``flwr-clientapp`` entry point with the cold-start argv."""
    from flwr.supernode.cli import flwr_clientapp

    sys.argv = list(argv)
    flwr_clientapp()


def clientapp_argv(spec) -> list[str]:
    """The ``flwr-clientapp`` command line Flower's ``SubprocessExecutor`` builds for ``spec``."""
    argv = ["flwr-clientapp", "--runtime-api-address", spec.runtime_api_address, "--token", spec.token]
    if spec.insecure:
        argv.append("--insecure")
    elif spec.root_certificates_path is not None:
        argv += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        argv += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        argv.append("--allow-runtime-dependency-installation")
    return argv


def make_warm_executor_class():
    """Build the executor class lazily (it subclasses a Flower internal)."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
    from flwr.supercore.superexec.executor.types import LaunchResult

    class WarmClientAppExecutor(SubprocessExecutor):
        """Flower's ``SubprocessExecutor`` with ClientApp processes forked from a warm server."""

        def __init__(self) -> None:
            self._ctx = multiprocessing.get_context("forkserver")
            self._ctx.set_forkserver_preload(list(PRELOAD))
            self._children: list = []
            # start (and warm) the fork server now, not on the first message
            self._launch_noop()

        def _launch_noop(self) -> None:
            p = self._ctx.Process(target=_noop, daemon=False)
            p.start()
            p.join()

        def launch(self, spec):
            if spec.task_type != TaskType.CLIENT_APP:
                return super().launch(spec)
            argv = clientapp_argv(spec)
            try:
                proc = self._ctx.Process(target=_run_clientapp, args=(argv,), daemon=False)
                proc.start()
            except Exception as exc:  # noqa: BLE001 - report to Flower, it retries or fails the task
                log.warning("warm ClientApp launch failed (%s); starting a cold process", exc)
                return super().launch(spec)
            self._children.append(proc)
            return LaunchResult.accepted()

        def reconcile(self) -> None:
            # reap finished ClientApp processes (is_alive() waits on exited children)
            self._children = [p for p in self._children if p.is_alive()]

        def close(self) -> None:
            for p in self._children:
                if p.is_alive():
                    p.terminate()
            self._children = []

    return WarmClientAppExecutor


def _noop() -> None:
    return None


def main() -> int:
    from flwr.supercore.cli import flower_superexec
    from flwr.supercore.constant import ExecutorType

    try:
        import flwr.supercore.superexec.run_superexec as rs

        original = rs.get_executor
        warm_cls = make_warm_executor_class()

        def get_executor(executor_type, executor_config=None, **kwargs):
            if executor_type == ExecutorType.SUBPROCESS:
                return warm_cls()
            return original(executor_type, executor_config=executor_config, **kwargs)

        rs.get_executor = get_executor
    except (ImportError, AttributeError) as exc:  # a Flower version without these internals
        log.warning("warm ClientApp executor unavailable (%s); using Flower's own", exc)
    sys.argv[0] = "flower-superexec"
    return flower_superexec()


if __name__ == "__main__":
    sys.exit(main())
