"""The warm ClientApp executor (securefkm.flower._superexec) starts exactly Flower's ClientApp.

The real-process deployment tests in tests/test_flower.py run through it (it is the default
of LocalDeployment); these fast checks pin its contract to Flower's own executor.
"""

import pytest

pytest.importorskip("flwr")

from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec.executor import subprocess_executor  # noqa: E402
from flwr.supercore.superexec.executor.types import ExecutionSpec  # noqa: E402

from securefkm.flower import _superexec, _supernode  # noqa: E402


def _spec(**kw):
    base = dict(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:9999", token="tok",
                insecure=True, root_certificates_path=None, runtime_dependency_install=False,
                parent_pid=None, suppress_output=False, task_id=1)
    base.update(kw)
    return ExecutionSpec(**base)


@pytest.mark.parametrize("kw", [
    {},
    {"parent_pid": 4242},
    {"insecure": False, "root_certificates_path": "/etc/ca.pem"},
    {"runtime_dependency_install": True, "parent_pid": 7},
])
def test_warm_argv_equals_flowers_own(monkeypatch, kw):
    seen = []
    monkeypatch.setattr(subprocess_executor.subprocess, "Popen", lambda args, **_: seen.append(list(args)))
    spec = _spec(**kw)
    subprocess_executor.SubprocessExecutor().launch(spec)
    assert seen, "Flower's executor did not start a process"
    assert _superexec.clientapp_argv(spec) == seen[0]


def test_supernode_launcher_swaps_only_superexec(monkeypatch):
    calls = []

    class FakeSubprocess:
        def Popen(self, args, *a, **kw):  # noqa: N802
            calls.append(list(args))

        DEVNULL = -3

    wrapped = _supernode._WarmSuperExecSubprocess(FakeSubprocess())
    wrapped.Popen(["flower-superexec", "--insecure", "--runtime-api-address", "x"])
    wrapped.Popen(["flwr-clientapp", "--token", "t"])
    assert calls[0][1:3] == ["-m", "securefkm.flower._superexec"]
    assert calls[0][3:] == ["--insecure", "--runtime-api-address", "x"]
    assert calls[1] == ["flwr-clientapp", "--token", "t"]
    assert wrapped.DEVNULL == -3


def test_preloaded_modules_exist_and_skip_torch():
    import importlib
    import subprocess
    import sys

    for name in _superexec.PRELOAD:
        assert importlib.util.find_spec(name) is not None, name
    code = ("import importlib, sys\nfrom securefkm.flower._superexec import PRELOAD\n"
            "[importlib.import_module(m) for m in PRELOAD]\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "the fork server must not import torch (clients never need it)"
