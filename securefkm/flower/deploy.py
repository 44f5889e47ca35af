"""Start and stop a local Flower deployment (SuperLink + N SuperNodes on 127.0.0.1), run
securefkm on it and collect the result.

Used by the CLI (``securefkm deploy ...``), the tests and the deployment benchmark::

    from securefkm.flower.deploy import deploy
    result = deploy([X0, X1, X2], algorithm="dwf",
                    params={"n_clusters": 3, "init_bounds": (-10, 10), "max_rounds": 20},
                    protection=["masking"], random_state=0)
    result.centres, result.transcript, result.privacy_spent

Each SuperNode gets its own CSV through ``--node-config "data-path='...'"``; every process
is started in its own process group on loopback, with ``FLWR_HOME`` in the deployment's
work directory, and is stopped by PID (with every descendant it spawned) when the
deployment closes, also on errors and timeouts.

Provisioning (Paillier, masking ``sign_keys=True``): every SuperNode also gets an Ed25519
identity key and the public directory (``workdir/pki``, :func:`securefkm.flower.provision.provision_local`)
in its node config; a Paillier run additionally starts the key authority service
(``securefkm authority serve``) as its own process on loopback for the duration of that
run, stopped by PID like the others.

Secure by default (``secure=True``; ``securefkm deploy --insecure`` turns it off for
debugging): a run CA and certificates in ``workdir/tls`` (:func:`securefkm.flower.tls.create_run_pki`),
the SuperLink serves TLS and admits only SuperNodes whose P-384 authentication keys were
registered with it (``--enable-supernode-auth`` + ``flwr supernode register``), every
SuperNode verifies the SuperLink against the run CA, and the key authority serves HTTPS
admitting only the ServerApp's client certificate.
"""

from __future__ import annotations

import csv
import json
import os
import logging
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..validation import check_array
from ..exceptions import InputError, SecureFKMError
from .spec import RunSpec

log = logging.getLogger("securefkm.flower")

#: the Flower app directory shipped inside the package (only a pyproject.toml)
APP_DIR = Path(__file__).resolve().parent / "app"
HOST = "127.0.0.1"


class DeploymentError(SecureFKMError, RuntimeError):
    """The local deployment could not start, or the run failed (the message says where)."""


# ------------------------------------------------------------------ helpers
def free_port(host: str = HOST) -> int:
    """A TCP port that is free on ``host`` right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def write_client_csvs(clients: Sequence[np.ndarray], directory, *, prefix: str = "client") -> list[Path]:
    """Write one CSV per client (header ``x0,x1,...``, full float precision); return the paths.

    Values are written with ``repr`` precision so a deployment reads back bit-identical
    records (the in-process comparison relies on it).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    width = len(str(max(len(clients) - 1, 0)))
    for i, X in enumerate(clients):
        X = check_array(X, f"clients[{i}]")
        path = directory / f"{prefix}_{i:0{width}d}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow([f"x{j}" for j in range(X.shape[1])])
            for row in X:
                w.writerow([repr(float(v)) for v in row])
        paths.append(path)
    return paths


def proc_stats() -> dict[int, list[str]]:
    """Every live process's ``/proc/<pid>/stat`` fields from field 3 (state) on (Linux):
    ``[1]`` is the parent pid, ``[11:15]`` utime, stime, cutime, cstime in clock ticks."""
    out: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                stat = fh.read()
        except OSError:
            continue
        out[int(entry)] = stat[stat.rfind(")") + 2 :].split()
    return out


def _children_of(stats: dict[int, list[str]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        out.setdefault(int(fields[1]), []).append(pid)
    return out


def descendants(pid: int, stats: dict[int, list[str]] | None = None) -> list[int]:
    """All live descendants of ``pid`` (Linux /proc), including those in new sessions;
    ``stats`` (from :func:`proc_stats`) saves reading /proc again."""
    if not os.path.isdir("/proc"):
        return []
    children, out, todo = _children_of(proc_stats() if stats is None else stats), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop a process we started, its process group and every descendant, by PID."""
    if proc is None:
        return
    pids = [proc.pid] + descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the group we created with start_new_session
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if not any(_alive(p) for p in pids):
            break
        time.sleep(0.05)
    pids += [p for p in descendants(proc.pid) if p not in pids]
    for pid in pids:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _entry_point(name: str) -> str:
    """Flower's console script ``name``, preferring this interpreter's bin dir (no shims)."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"{name} is not on PATH; pip install 'securefkm[flower]'.")
    return found


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


@dataclass
class DeploymentResult:
    """What the ServerApp reported, plus where everything lives.

    ``client_paths[i]`` is the CSV of client ``i`` (the node with the i-th smallest id);
    ``errors`` maps client ids to the errors those clients reported about themselves.
    """

    centres: np.ndarray
    transcript: object
    privacy_spent: tuple[float, float] | None
    n_iter: int
    errors: dict[int, str]
    node_ids: list[int]
    client_paths: list[Path | None]
    timings: list[tuple]
    rounds_seconds: float
    total_seconds: float
    protection_report: dict = field(default_factory=dict)
    federated_score: float | None = None
    workdir: Path | None = None
    #: rounds a crashed ServerApp had completed before this run resumed them (None: fresh run)
    resumed_from: int | None = None

    @property
    def n_rounds(self) -> int:
        return len(self.transcript)

    def summary(self) -> str:
        lines = [
            f"centres ({self.centres.shape[0]} x {self.centres.shape[1]}):",
            np.array2string(self.centres, precision=4),
            f"rounds: {self.n_rounds} ({self.rounds_seconds:.2f} s, {self.rounds_seconds / max(self.n_rounds, 1):.3f} s/round)",
        ]
        if self.privacy_spent is not None:
            lines.append(f"privacy spent: epsilon={self.privacy_spent[0]:.4g}, delta={self.privacy_spent[1]:.3g}")
        for c, err in sorted(self.errors.items()):
            path = self.client_paths[c] if c < len(self.client_paths) else None
            lines.append(f"client {c} ({path.name if path else '?'}) failed: {err}")
        return "\n".join(lines)


# ------------------------------------------------------------------ deployment
class LocalDeployment:
    """A SuperLink and one SuperNode per CSV on 127.0.0.1; a context manager.

    ``with LocalDeployment(paths) as dep: result = dep.run(spec)`` starts every process,
    runs the spec (as many times as you like: each ``run`` is one ``flwr run``) and stops
    every process on exit. Processes run in their own process groups; logs go to
    ``workdir/logs``. ``kill_node(i)`` SIGKILLs the SuperNode holding ``csv_paths[i]``
    (fault injection in tests).

    ``fast_poll`` (default): SuperNodes start through :mod:`securefkm.flower._supernode`
    (idle sleeps capped at ``poll_interval`` instead of Flower's 3 s, warm ClientApp
    processes) and the SuperExecs poll every ``poll_interval``. ``poll_interval=None`` picks
    ``0.1 s x nodes / cores`` within [0.1, 2] s: every idle node polls its SuperLink and every
    SuperExec its SuperNode, and on one machine those polls are what the rounds compete with
    (measurements: docs/deployment.md, "Idle polling and the SuperLink's state").

    ``database=None`` (default) keeps the SuperLink's state in memory: a local deployment
    never restarts its SuperLink, messages (masked vectors, encrypted shares) never touch the
    disk, and Flower's SQLite state costs a write per poll. Give a file path (its folder must
    exist) to keep a file database.
    """

    def __init__(self, csv_paths: Sequence, *, workdir=None, startup_timeout: float = 60.0,
                 env: dict | None = None, fast_poll: bool = True, provision: bool = True,
                 poll_interval: float | None = None, database=None, secure: bool = True):
        if not csv_paths:
            raise InputError("csv_paths is empty; give one CSV per SuperNode.")
        self.csv_paths = [Path(p).resolve() for p in csv_paths]
        for p in self.csv_paths:
            if not p.is_file():
                raise InputError(f"csv_paths: {p} does not exist.")
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="securefkm-deploy-") if workdir is None else workdir).resolve()
        self.startup_timeout = float(startup_timeout)
        self.extra_env = dict(env or {})
        self.fast_poll = bool(fast_poll)
        if poll_interval is None:
            poll_interval = min(2.0, max(0.1, 0.1 * len(self.csv_paths) / (os.cpu_count() or 1)))
        elif not (isinstance(poll_interval, (int, float)) and 0 < poll_interval <= 60):
            raise InputError(f"poll_interval={poll_interval!r} must be a number of seconds in (0, 60], "
                             "or None to scale it with the number of nodes per core.")
        self.poll_interval = float(poll_interval)
        self.database = None if database is None else Path(database).resolve()
        if self.database is not None and not self.database.parent.is_dir():
            raise InputError(f"database={str(database)!r}: its folder does not exist; create it or pass "
                             "database=None to keep the SuperLink's state in memory.")
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen | None] = []
        self.node_ids: list[int | None] = []
        self.port: int | None = None
        self._runs = 0
        #: node identity keys + directory (``provision=True``); see securefkm.flower.provision
        self.provision = bool(provision)
        self.pki = None
        self.authority: subprocess.Popen | None = None
        self._last_node_ids: list[int] | None = None
        #: TLS + SuperNode authentication (the run CA and certificates: ``self.tls``)
        self.secure = bool(secure)
        self.tls = None

    # ---------------------------------------------------------------- env
    @property
    def flwr_home(self) -> Path:
        return self.workdir / "flwr_home"

    def environ(self) -> dict:
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(self.flwr_home),
            FLWR_DISABLE_UPDATE_CHECK="1",
            FLWR_TELEMETRY_ENABLED="0",
            PYTHONUNBUFFERED="1",
            # run Flower's entry points from this interpreter's bin dir, not through shims
            PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        )
        if self.fast_poll:
            # SuperExec (launches ClientApp/ServerApp processes) polls every 1 s by default;
            # the SuperNode launcher caps Flower's 3 s idle sleep (securefkm.flower._supernode)
            env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", f"{self.poll_interval:g}")
            env.setdefault("SECUREFKM_SUPERNODE_POLL", f"{self.poll_interval:g}")
        env.update(self.extra_env)
        return env

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        fh = open(logs / log_name, "ab")
        try:
            return subprocess.Popen(
                args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.environ(), cwd=self.workdir, start_new_session=True,
            )
        finally:
            fh.close()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> LocalDeployment:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        if self.secure:
            from .tls import create_run_pki

            self.tls = create_run_pki(self.workdir / "tls", hosts=(HOST, "localhost"))
            connection = f"root-certificates = {_toml_str(str(self.tls.ca.cert))}\n"
            link_tls = ["--ssl-certfile", str(self.tls.superlink.cert), "--ssl-keyfile", str(self.tls.superlink.key),
                        "--ssl-ca-certfile", str(self.tls.ca.cert), "--enable-supernode-auth"]
        else:
            connection, link_tls = "insecure = true\n", ["--insecure"]
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "local-deployment"\n\n'
            f'[superlink.local-deployment]\naddress = "{HOST}:{self.port}"\n{connection}'
        )
        exe = _entry_point("flower-superlink")
        database = [] if self.database is None else ["--database", str(self.database)]
        self.superlink = self._spawn(
            [exe, *link_tls, "--host", HOST, "--port", str(self.port), *database,
             "--disable-runtime-dependency-installation"],
            "superlink.log",
        )
        self._wait(lambda: _port_open(self.port), "the SuperLink to listen on "
                   f"{HOST}:{self.port}", self.superlink, "superlink.log")
        if self.secure:
            self._register_nodes()
        if self.provision:
            from .provision import provision_local

            self.pki = provision_local(self.workdir / "pki", len(self.csv_paths))
        for i in range(len(self.csv_paths)):
            self.supernodes.append(None)
            self.node_ids.append(None)
            self._start_node(i)
        for i in range(len(self.csv_paths)):
            self._wait(lambda i=i: self._read_node_id(i) is not None,
                       f"SuperNode {i} to register", self.supernodes[i], f"supernode_{i}.log")

    def _node_auth_key(self, i: int) -> Path:
        return self.workdir / "tls" / "supernodes" / f"supernode_{i}"

    def _register_nodes(self) -> None:
        """One P-384 authentication key per SuperNode, registered with the SuperLink (Flower's
        SuperNode authentication: an unregistered node cannot join)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        exe = _entry_point("flwr")
        for i in range(len(self.csv_paths)):
            path = self._node_auth_key(i)
            path.parent.mkdir(parents=True, exist_ok=True)
            key = ec.generate_private_key(ec.SECP384R1())
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
            pub = path.with_suffix(".pub")
            pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                          serialization.PublicFormat.OpenSSH))
            out = subprocess.run([exe, "supernode", "register", str(pub), "local-deployment"], env=self.environ(),
                                 cwd=self.workdir, capture_output=True, text=True, timeout=self.startup_timeout,
                                 stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                raise DeploymentError(f"registering SuperNode {i}'s authentication key failed: "
                                      f"{(out.stdout + out.stderr)[-2000:]}")

    def _start_node(self, i: int) -> None:
        exe = _entry_point("flower-supernode")
        path = str(self.csv_paths[i])
        if "'" in path:
            raise InputError(f"CSV path {path!r} contains a single quote; Flower's --node-config cannot carry it.")
        launcher = [sys.executable, "-m", "securefkm.flower._supernode"] if self.fast_poll else [exe]
        node_tls = (["--root-certificates", str(self.tls.ca.cert), "--auth-supernode-private-key",
                     str(self._node_auth_key(i))] if self.secure else ["--insecure"])
        self.supernodes[i] = self._spawn(
            [*launcher, *node_tls, "--superlink", f"{HOST}:{self.port}", "--host", HOST,
             "--port", str(free_port()), "--node-config", self._node_config(i)],
            f"supernode_{i}.log",
        )

    def _node_config(self, i: int) -> str:
        """The SuperNode's ``--node-config``: its CSV and, if provisioned, its identity key and the directory."""
        items = {"data-path": str(self.csv_paths[i])}
        if self.pki is not None:
            items.update(self.pki.node_config(i))
        for key, value in items.items():
            if "'" in value:
                raise InputError(f"{key} path {value!r} contains a single quote; Flower's --node-config cannot carry it.")
        return " ".join(f"{k}='{v}'" for k, v in items.items())

    # ---------------------------------------------------------------- key authority
    def start_authority(self, *, key_size: int = 2048, min_clients: int = 2) -> str:
        """Start the Paillier key authority service on loopback (keys created once); return its URL."""
        if self.pki is None:
            raise DeploymentError("the key authority needs provisioned node identities: LocalDeployment(provision=True).")
        self.stop_authority()
        self.pki.ensure_authority(key_size)
        port = free_port()
        if self.secure:
            tls = ["--cert", str(self.tls.authority.cert), "--key", str(self.tls.authority.key),
                   "--client-ca", str(self.tls.client_ca.cert)]
        else:
            tls = ["--insecure"]
        self.authority = self._spawn(
            [sys.executable, "-m", "securefkm.cli", "authority", "serve", "--keys", str(self.pki.authority_dir),
             "--directory", str(self.pki.directory_path), "--host", HOST, "--port", str(port),
             "--min-clients", str(int(min_clients)), "--key-size", str(int(key_size)), *tls],
            "authority.log",
        )
        self._wait(lambda: _port_open(port), f"the key authority to listen on {HOST}:{port}", self.authority, "authority.log")
        return f"{'https' if self.secure else 'http'}://{HOST}:{port}"

    def authority_run_config(self) -> dict:
        """The ServerApp's run config for reaching the authority over mutual TLS."""
        if not self.secure:
            return {}
        return {"authority-ca": str(self.tls.ca.cert), "authority-cert": str(self.tls.serverapp.cert),
                "authority-key": str(self.tls.serverapp.key)}

    def stop_authority(self) -> None:
        """Stop the key authority process (by PID), if running."""
        proc, self.authority = self.authority, None
        _stop_tree(proc, grace=2.0)

    def _read_node_id(self, i: int) -> int | None:
        if self.node_ids[i] is not None:
            return self.node_ids[i]
        log = self.workdir / "logs" / f"supernode_{i}.log"
        if log.exists():
            m = re.search(r"SuperNode ID:\s*(\d+)", log.read_text(errors="replace"))
            if m:
                self.node_ids[i] = int(m.group(1))
        return self.node_ids[i]

    def _wait(self, ready, what, proc, log_name):
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            if proc is not None and proc.poll() is not None:
                raise DeploymentError(f"{what}: the process exited ({proc.returncode}); see {self.log_tail(log_name)}")
            if time.monotonic() > deadline:
                raise DeploymentError(f"timed out after {self.startup_timeout:.0f} s waiting for {what}; {self.log_tail(log_name)}")
            time.sleep(0.1)

    def log_tail(self, log_name: str, n: int = 20) -> str:
        path = self.workdir / "logs" / log_name
        if not path.exists():
            return f"{path} (missing)"
        lines = path.read_text(errors="replace").splitlines()[-n:]
        return f"{path}:\n" + "\n".join(lines)

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and its ClientApp processes (a crashed data owner)."""
        proc = self.supernodes[i]
        if proc is None:
            return
        pids = [proc.pid] + descendants(proc.pid)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)

    def kill_serverapp(self) -> list[int]:
        """SIGKILL the running ServerApp process(es) (a crashed server; fault injection).

        The ServerApp runs in a process the SuperLink's SuperExec launched (``flwr-serverapp``
        in its command line); returns the PIDs killed."""
        killed = []
        for pid in descendants(self.superlink.pid) if self.superlink is not None else []:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"flwr-serverapp" in cmd:
                _signal(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def stop(self) -> None:
        """Stop every process this deployment started (SuperNodes first), by PID."""
        self.stop_authority()
        for proc in self.supernodes:
            _stop_tree(proc)
        _stop_tree(self.superlink)
        if self._own_workdir and os.environ.get("SECUREFKM_KEEP_DEPLOY_DIR") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---------------------------------------------------------------- mapping
    def client_paths(self, node_ids: Sequence[int]) -> list[Path | None]:
        """CSV of each client id, given the ServerApp's sorted node ids."""
        by_node = {self._read_node_id(i): p for i, p in enumerate(self.csv_paths)}
        return [by_node.get(n) for n in node_ids]

    def client_order(self) -> list[int]:
        """``order[c]`` = index in ``csv_paths`` of client ``c``: sorted node ids, or, after a
        run with provisioned identities, the directory order the last run reported."""
        ids = [self._read_node_id(i) for i in range(len(self.csv_paths))]
        if self._last_node_ids is not None and sorted(self._last_node_ids) == sorted(ids):
            return [ids.index(n) for n in self._last_node_ids]
        return sorted(range(len(ids)), key=lambda i: ids[i])

    # ---------------------------------------------------------------- runs
    def run(self, spec: RunSpec, *, n_features: int | None = None, num_nodes: int | None = None,
            stage_timeout: float = 60.0, suspect_timeout: float = 3.0, poll_interval: float = 0.05,
            timeout: float = 600.0, progress_path=None, on_progress=None, checkpoint_path=None,
            checkpoint_key=None) -> DeploymentResult:
        """One ``flwr run`` of ``spec`` on this deployment; returns the ServerApp's result.

        ``on_progress(event_dict)`` is called for each line of the progress log while the
        run is going on (the tests use it to kill a node in the middle of a round).
        ``checkpoint_path``: the ServerApp checkpoints every round there and, if the file
        exists (a previous run crashed), resumes from it (:mod:`securefkm.flower.checkpoint`);
        ``checkpoint_key``: the file of its HMAC key (default ``<checkpoint_path>.key``).
        """
        if not isinstance(spec, RunSpec):
            raise InputError("spec must be a securefkm.flower.spec.RunSpec.")
        spec = declare_records(spec, self.csv_paths)
        if self.superlink is None:
            raise DeploymentError("the deployment is not started; use `with LocalDeployment(...)` or .start().")
        if n_features is None:
            from .clientapp import read_client_csv

            n_features = read_client_csv(str(self.csv_paths[0])).shape[1]
        num_nodes = len(self.csv_paths) if num_nodes is None else num_nodes
        self._runs += 1
        run_dir = self.workdir / f"run_{self._runs}"
        run_dir.mkdir(parents=True, exist_ok=True)
        app_dir = run_dir / "app"
        shutil.copytree(APP_DIR, app_dir)
        result_path = run_dir / "result.bin"
        progress_path = Path(progress_path) if progress_path else run_dir / "progress.jsonl"
        from .run_config import RunConfig

        extra: dict = {}
        needs = spec.requirements()
        if needs.identity:
            if self.pki is None:
                raise DeploymentError("this spec needs node identities; start the deployment with provision=True.")
            extra["directory"] = str(self.pki.directory_path)
        if needs.authority:
            from ..specs import find_layer

            paillier = find_layer(spec.protection, "paillier") or {}
            validated = find_layer(spec.protection, "validated") or {}
            # the service's floor (the Helper's and the authority's min_clients) is the spec's largest
            floor = max(int(paillier.get("min_clients", 2)), int(validated.get("min_clients", 2)))
            extra["authority_url"] = self.start_authority(key_size=int(paillier.get("key_size", 2048)),
                                                          min_clients=floor)
            extra.update({k.replace("-", "_"): v for k, v in self.authority_run_config().items()})
        config = RunConfig(
            spec=spec.to_json(),
            num_nodes=int(num_nodes),
            n_features=int(n_features),
            stage_timeout=float(stage_timeout),
            suspect_timeout=float(suspect_timeout),
            node_wait_timeout=float(min(timeout, 120.0)),
            poll_interval=float(poll_interval),
            result_path=str(result_path),
            progress_path=str(progress_path),
            checkpoint_path="" if checkpoint_path is None else str(Path(checkpoint_path).resolve()),
            checkpoint_key="" if checkpoint_key is None else str(Path(checkpoint_key).resolve()),
            **extra,
        ).to_flower()
        cfg_path = run_dir / "run_config.toml"
        cfg_path.write_text("".join(
            f"{k} = {_toml_str(v) if isinstance(v, str) else repr(v)}\n" for k, v in config.items()
        ))
        exe = _entry_point("flwr")
        log_name = f"flwr_run_{self._runs}.log"
        proc = self._spawn([exe, "run", str(app_dir), "local-deployment", "--stream", "--run-config", str(cfg_path)], log_name)
        seen = 0
        deadline = time.monotonic() + timeout
        exited_at = None
        try:
            while True:
                if proc.poll() is not None:
                    # `flwr run --stream` returns when the run ends; give the result file a moment
                    exited_at = exited_at or time.monotonic()
                    if result_path.exists() or time.monotonic() - exited_at > 5.0:
                        break
                if on_progress is not None and progress_path.exists():
                    lines = progress_path.read_text().splitlines()
                    for line in lines[seen:]:
                        try:
                            on_progress(json.loads(line))
                        except json.JSONDecodeError:
                            break
                        seen += 1
                if result_path.exists():
                    break
                if time.monotonic() > deadline:
                    raise DeploymentError(f"the run did not finish within timeout={timeout:.0f} s; {self.log_tail(log_name)}")
                time.sleep(0.05)
        finally:
            _stop_tree(proc, grace=2.0)
            if needs.authority:
                self.stop_authority()
        if not result_path.exists():
            raise DeploymentError(f"the ServerApp wrote no result; {self.log_tail(log_name, 40)}\n{self.log_tail('superlink.log', 40)}")
        from .serverapp import read_result

        try:
            raw = read_result(result_path)  # a format that cannot run code
        except InputError as exc:
            raise DeploymentError(str(exc)) from None
        if not raw.get("ok"):
            raise DeploymentError(f"the ServerApp failed: {raw.get('error')}\n{raw.get('traceback', '')}")
        self._last_node_ids = [int(n) for n in raw["node_ids"]]
        return DeploymentResult(
            centres=raw["centres"],
            transcript=raw["transcript"],
            privacy_spent=raw["privacy_spent"],
            n_iter=raw["n_iter"],
            errors=raw["errors"],
            node_ids=raw["node_ids"],
            client_paths=self.client_paths(raw["node_ids"]),
            timings=raw["timings"],
            rounds_seconds=raw["rounds_seconds"],
            total_seconds=raw["total_seconds"],
            protection_report=raw["protection_report"],
            federated_score=raw["federated_score"],
            workdir=self.workdir,
            resumed_from=raw.get("resumed_from"),
        )


# ------------------------------------------------------------------ one call
def _clients_of(data) -> list[np.ndarray]:
    clients = getattr(data, "clients", data)
    if isinstance(clients, np.ndarray) or not isinstance(clients, Sequence) or not len(clients):
        raise InputError("data must be a FederatedDataset or a non-empty list of per-client 2-D arrays.")
    return [check_array(X, f"data client {i}") for i, X in enumerate(clients)]


def declare_records(spec: RunSpec, paths) -> RunSpec:
    """``spec`` with ``n_records`` declared on each ``GaussianDP`` that lacks it, counted from the
    local CSVs ``paths`` (a local deployment has them; its DP plan then equals the in-process
    fit's, which reads the same count). Unreadable CSVs count 0 (that node reports its error)."""
    from ..specs import layer_specs

    entries = layer_specs(spec.protection)
    missing = [i for i, p in enumerate(entries) if p.name == "dp" and p.get("n_records") is None]
    # ValidatedAggregation proves counts against each client's record bound: the largest CSV's
    uncapped = [i for i, p in enumerate(entries) if p.name == "validated" and p.get("max_records") is None]
    if not missing and not uncapped:
        return spec
    from .clientapp import read_client_csv

    sizes = []
    for path in paths:
        try:
            sizes.append(read_client_csv(str(path)).shape[0])
        except InputError:
            continue
    total = sum(sizes)
    if total == 0:
        return spec
    for i in missing:
        entries[i] = {**entries[i], "n_records": total}
        log.info("GaussianDP plans from n_records=%d, counted from the %d client CSVs (declared public)",
                 total, len(paths))
    for i in uncapped:
        entries[i] = {**entries[i], "max_records": max(sizes)}
        log.info("ValidatedAggregation bounds every client's counts by max_records=%d, the largest client CSV "
                 "(declared public)", max(sizes))
    return RunSpec(spec.algorithm, dict(spec.params), [dict(e) for e in entries], spec.random_state)


def _preflight(spec: RunSpec, data, paths) -> None:
    """Raise the spec's configuration errors here, before any process starts (the ServerApp
    would raise the same error after the deployment came up)."""
    if data is not None:
        n_features = _clients_of(data)[0].shape[1]
    else:
        from .clientapp import read_client_csv

        # the first readable CSV; a malformed one is that node's own error in the run
        # (it reports it and the others finish), not a reason to refuse the deployment
        n_features = None
        for path in paths:
            try:
                n_features = read_client_csv(str(path)).shape[1]
                break
            except InputError:
                continue
        if n_features is None:
            return
    from ..estimators.base import check_enough_clients
    from ..federation import clone_layers
    from ..layers import validate_stack

    est = spec.estimator()
    # the same checks the ServerApp's Federation makes: e.g. an aggregator on plain set-fields
    validate_stack(clone_layers(est.protection), est._make_algorithm(n_features, len(paths)))
    # and the estimators' refusal of a secure sum over too few clients (one SuperNode)
    check_enough_clients(clone_layers(est.protection), len(paths), n_features, est.clients_per_round)


def deploy(data=None, *, csv_dir=None, algorithm: str = "dwf", params: dict | None = None,
           protection=None, random_state: int | None = None, stage_timeout: float = 60.0,
           timeout: float = 900.0, workdir=None, verbose: bool = False, progress=None,
           secure: bool = True) -> DeploymentResult:
    """Run securefkm on a fresh local Flower deployment and return the result.

    Give either ``data`` (a FederatedDataset or a list of client arrays: one CSV per client
    is written to the work directory) or ``csv_dir`` (a directory of ``*.csv`` files, one
    per node, taken in sorted name order). Starts a SuperLink and one SuperNode per CSV on
    127.0.0.1, runs ``algorithm`` with ``params`` and the ``protection`` layer specs (names
    or dicts, as in :func:`securefkm.registry.make_protection`), collects the ServerApp's
    result and stops every process. ``random_state=None`` draws a seed (reported in the
    transcript meta). ``result.client_paths[i]`` says which CSV became client ``i``.
    ``progress``: a callable taking one message per step (files written, processes up, run
    finished), e.g. ``print``; the CLI prints them with the elapsed time. ``secure=False``
    starts every process without TLS and without SuperNode authentication (debugging only).
    """
    say = progress or (lambda message: None)
    if (data is None) == (csv_dir is None):
        raise InputError("deploy needs exactly one of data= (client arrays) or csv_dir= (a directory of CSVs).")
    if random_state is None:
        random_state = secrets.randbelow(2**31)
    spec = RunSpec(algorithm=algorithm, params=dict(params or {}), protection=list(protection or []), random_state=random_state)
    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="securefkm-deploy-") if own else workdir)
    try:
        if data is not None:
            paths = write_client_csvs(_clients_of(data), workdir / "data")
        else:
            paths = sorted(Path(csv_dir).glob("*.csv"))
            if not paths:
                raise InputError(f"csv_dir {str(csv_dir)!r} holds no *.csv files; put one CSV per client there.")
        _preflight(spec, data, paths)
        declared = declare_records(spec, paths)
        if declared is not spec:
            from ..specs import find_layer

            dp, validated = find_layer(declared.protection, "dp"), find_layer(declared.protection, "validated")
            if dp is not None and dp.get("n_records") is not None:
                say(f"DP plans its rounds from n_records={dp['n_records']}, counted from the client CSVs (declared "
                    "public, as an in-process fit declares it)")
            if validated is not None and validated.get("max_records") is not None:
                say(f"ValidatedAggregation proves every client's counts against max_records="
                    f"{validated['max_records']}, the largest client CSV (declared public)")
            spec = declared
        nodes = f"{len(paths)} SuperNode{'s' if len(paths) != 1 else ''}"
        say(f"starting a SuperLink and {nodes} on 127.0.0.1 (one per client CSV)")
        with LocalDeployment(paths, workdir=workdir / "flower", secure=secure) as dep:
            if dep.tls is not None:
                parties = ("SuperLink, SuperNodes and key authority" if spec.requirements().authority
                           else "SuperLink and SuperNodes")
                say(f"TLS on: run CA {dep.tls.ca.cert}, certificates and SuperNode authentication keys in "
                    f"{dep.tls.root} ({parties} authenticated)")
            else:
                say("INSECURE: no TLS, no SuperNode authentication (--insecure; debugging only)")
            say(f"deployment up; running {algorithm} with protection {spec.protection or 'none'} "
                f"(each round waits up to {stage_timeout:g} s per stage)")
            result = dep.run(spec, stage_timeout=stage_timeout, timeout=timeout)
            say(f"run finished: {result.n_rounds} rounds in {result.rounds_seconds:.1f} s; stopping processes")
        if verbose:
            print(result.summary(), file=sys.stderr)
        result.workdir = None if own else workdir
        return result
    finally:
        if own and os.environ.get("SECUREFKM_KEEP_DEPLOY_DIR") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
