"""`LocalCluster`: a whole Ember cluster on this machine, started from Python and stopped with it.

    with ember.LocalCluster(executors=2) as cluster:
        client = cluster.client()
        print(client.submit(pow, 2, 10).result())

It runs `ember up` (a nats-server, a driver and the executors) as a child in a directory of its
own. That child watches a pipe from this process: when the pipe ends, because the cluster is
closed or because this process ended however it did (`kill -9` included), it stops everything it
started; and each process `ember up` starts is told by the kernel when `ember up` dies.
"""

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional

from .client import DEFAULT_CLUSTER, DEFAULT_URL
from .errors import EmberError

# How long `close` waits for `ember up` to stop what it started before killing it.
STOP_TIMEOUT = 15.0

_open: List["LocalCluster"] = []
_open_lock = threading.Lock()


def binary(name: str) -> str:
    """The path of Ember's binary `name`: in `$EMBER_BIN_DIR`, else the one pip installed beside
    this interpreter (the wheel's), else on the PATH."""
    directory = os.environ.get("EMBER_BIN_DIR")
    if directory:
        path = Path(directory) / name
        if not path.is_file():
            raise EmberError(f"EMBER_BIN_DIR={directory} holds no {name}")
        return str(path)
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = Path(directory) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found is None:
        raise EmberError(
            f"no {name} binary: install Ember's wheel (pip install ember-*.whl, made by "
            "scripts/build-wheel), or put Ember's binaries on the PATH or in EMBER_BIN_DIR"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class LocalCluster:
    """A cluster on this machine: a nats-server, a driver and `executors` executors of `cores`
    cores each (by default this machine's), started by `ember up` in a directory of its own.
    Their Python workers run this interpreter, so they unpickle with this process's
    cloudpickle.

    A context manager: everything it started stops when the `with` block ends, on an exception
    or Ctrl-C too; outside one, on `close()` or when this process exits, even by `kill -9`.
    `client()` is a blocking client connected to it; `ember.connect()` with no URL connects to
    the LocalCluster open in this process. `timeout` bounds the wait for every executor to
    register; `web=False` serves no web page."""

    def __init__(
        self,
        executors: int = 2,
        cores: Optional[int] = None,
        *,
        web: bool = True,
        timeout: float = 60.0,
        python: Optional[str] = None,
    ):
        if not isinstance(executors, int) or executors < 1:
            raise ValueError(f"executors must be a positive integer; got {executors!r}")
        if cores is not None and (not isinstance(cores, int) or cores < 1):
            raise ValueError(f"cores must be a positive integer or None; got {cores!r}")
        self.executors = executors
        self.name = "local-" + uuid.uuid4().hex[:8]
        self.port = _free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.web_url = None
        self.directory = tempfile.mkdtemp(prefix="ember-local-")
        self._client = None
        self._process = None
        self._log = open(os.path.join(self.directory, "cluster.log"), "wb")
        args = [
            binary("ember"),
            "up",
            "--cluster", self.name,
            "--port", str(self.port),
            "--executors", str(executors),
            "--python", python or sys.executable,
            "--exit-with-stdin",
        ]
        if cores is not None:
            args += ["--cores", str(cores)]
        if web:
            http = f"127.0.0.1:{_free_port()}"
            args += ["--http", http]
            self.web_url = f"http://{http}/"
        else:
            args += ["--http", "off"]
        env = dict(os.environ, TMPDIR=self.directory)
        env.setdefault("RUST_LOG", "warn")
        # Its own: a cluster of this name, on this port, whatever the environment says.
        for key in ("EMBER_NATS_URL", "EMBER_CONTEXT", "EMBER_CLUSTER", "EMBER_USER",
                    "EMBER_PASSWORD", "EMBER_CREDS", "EMBER_UP_CONFIG", "EMBER_UP_STORE_DIR"):
            env.pop(key, None)
        # A session of its own: Ctrl-C in a terminal or a notebook's interrupt, sent to this
        # process's group, reaches this process alone, which stops the cluster if it is done.
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
            env=env,
            start_new_session=True,
        )
        with _open_lock:
            _open.append(self)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            self._check_running()
            if time.monotonic() > deadline:
                raise EmberError(f"nats-server did not listen on {self.port} within {timeout}s")
            time.sleep(0.02)
        client = self.client()
        while True:
            self._check_running()
            try:
                if client.executors()["registered_executors"] >= self.executors:
                    return
            except EmberError:
                pass  # no driver yet
            if time.monotonic() > deadline:
                raise EmberError(
                    f"the local cluster's {self.executors} executors did not register within "
                    f"{timeout}s; its log: {self.log_path}"
                )
            time.sleep(0.05)

    def _check_running(self) -> None:
        if self._process.poll() is not None:
            raise EmberError(
                f"ember up exited with {self._process.returncode}:\n{self.log_tail()}"
            )

    @property
    def log_path(self) -> str:
        """The file `ember up` writes its events and logs to."""
        return os.path.join(self.directory, "cluster.log")

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as log:
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def pid(self) -> Optional[int]:
        """The process id of the `ember up` that runs the cluster."""
        return None if self._process is None else self._process.pid

    def client(self):
        """A blocking client (`ember.SyncClient`) connected to the cluster, the same one each
        time; closed with the cluster."""
        if self._client is None:
            from .sync import SyncClient

            self._client = SyncClient(self.url, cluster=self.name, web_url=self.web_url)
        return self._client

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def close(self) -> None:
        """Stops everything the cluster started and removes its directory. Safe to call again."""
        with _open_lock:
            if self in _open:
                _open.remove(self)
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
        process = self._process
        if process is not None and process.poll() is None:
            # The end of its stdin stops it, as Ctrl-C does.
            try:
                process.stdin.close()
            except OSError:
                pass
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except OSError:
                    pass
                process.wait()
        elif process is not None and process.stdin is not None:
            process.stdin.close()
        if not self._log.closed:
            self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "closed"
        return f"<ember.LocalCluster {self.name} at {self.url}, {self.executors} executors, {state}>"

    def _repr_html_(self) -> str:
        import html

        link = ""
        if self.web_url:
            link = f' &middot; <a href="{html.escape(self.web_url)}" target="_blank">web page</a>'
        state = "running" if self.running else "closed"
        return (
            f"<b>ember.LocalCluster</b> {html.escape(self.name)} at "
            f"<code>{html.escape(self.url)}</code>: {self.executors} executors, {state}{link}"
        )


def current() -> Optional[LocalCluster]:
    """The LocalCluster opened last in this process and not closed, if any."""
    with _open_lock:
        return _open[-1] if _open else None


def default_target(url: Optional[str], cluster: Optional[str]):
    """What a client given `url` and `cluster` (either None) connects to, as (url, cluster,
    web page or None): the LocalCluster open in this process, else `$EMBER_NATS_URL` and
    `$EMBER_CLUSTER`, else the defaults."""
    local = current() if url is None else None
    if local is not None:
        return local.url, cluster or local.name, local.web_url
    url = url or os.environ.get("EMBER_NATS_URL") or DEFAULT_URL
    return url, cluster or os.environ.get("EMBER_CLUSTER") or DEFAULT_CLUSTER, None


@atexit.register
def _close_all() -> None:
    for cluster in list(_open):
        cluster.close()
