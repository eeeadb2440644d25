"""A real cluster for the tests: nats-server from $EMBER_NATS_SERVER or the PATH (with
JetStream, in a store of its own), and ember-driver and ember-executor from $EMBER_BIN_DIR, else
the ones installed beside this interpreter or on the PATH (the wheel's), else the release build
(target/release), each on a cluster name of its own. The executors' Python workers run this
interpreter, so they unpickle with the cloudpickle the tests pickle with."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# Functions defined in the test modules travel by value: the executors cannot import them.
sys.path.insert(0, str(HERE))


def pytest_collection_modifyitems(session, config, items):
    for module in {item.module for item in items}:
        cloudpickle.register_pickle_by_value(module)


def binary(name):
    from ember.cluster import binary as installed

    if "EMBER_BIN_DIR" not in os.environ:
        try:
            return installed(name)
        except Exception:
            pass
    directory = Path(os.environ.get("EMBER_BIN_DIR", REPO / "target" / "release"))
    path = directory / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build it first (cargo build --release)")
    return str(path)


def nats_server_binary():
    path = os.environ.get("EMBER_NATS_SERVER") or shutil.which("nats-server")
    if not path:
        pytest.fail("no nats-server: set EMBER_NATS_SERVER (scripts/install-nats-server)")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, process, what, limit=20):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {limit}s")


class Cluster:
    """A nats-server and the Ember processes started on it, stopped by `stop`."""

    def __init__(self, config=None):
        self.name = "py-" + uuid.uuid4().hex[:8]
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store = tempfile.mkdtemp(prefix="ember-pytest-")
        self.processes = []
        args = [nats_server_binary()]
        if config is not None:
            args += ["-c", str(config)]
        args += ["-js", "-sd", self.store, "-a", "127.0.0.1", "-p", str(self.port)]
        server = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.processes.append(server)
        wait_listening(self.port, server, "nats-server")

    def start(self, name, *args, auth=None):
        env = dict(os.environ, RUST_LOG="warn")
        for key in ("EMBER_USER", "EMBER_PASSWORD", "PYTHONPATH"):
            env.pop(key, None)
        if auth is not None:
            env["EMBER_USER"], env["EMBER_PASSWORD"] = auth
        process = subprocess.Popen(
            [binary(name), "--nats-url", self.url, "--cluster", self.name, *args],
            env=env,
            cwd=self.store,
            stdin=subprocess.DEVNULL,
        )
        self.processes.append(process)
        return process

    def driver(self, *args, auth=None):
        return self.start("ember-driver", *args, auth=auth)

    def executor(self, executor_id, *args, cores=2, auth=None):
        return self.start(
            "ember-executor",
            "--executor-id",
            executor_id,
            "--cores",
            str(cores),
            "--heartbeat-interval",
            "500ms",
            "--python",
            sys.executable,
            "--data-dir",
            os.path.join(self.store, "data-" + executor_id),
            *args,
            auth=auth,
        )

    def wait_for_executors(self, count, auth=None, limit=30):
        import ember

        kwargs = {} if auth is None else {"creds": auth}
        deadline = time.monotonic() + limit
        with ember.connect(self.url, cluster=self.name, **kwargs) as client:
            while time.monotonic() < deadline:
                try:
                    if client.executors()["registered_executors"] >= count:
                        return
                except ember.NoDriver:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"{count} executors did not register within {limit}s")

    def stop(self):
        # Executors first, then the driver, then the server: each leaves before what it needs.
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.store, ignore_errors=True)
        # The objects its client and executors shared on this host (their default place).
        tmp = os.environ.get("TMPDIR") or "/tmp"
        shutil.rmtree(os.path.join(tmp, f"ember-{self.name}-objects"), ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    """A driver (journal on) and two executors of two cores each."""
    cluster = Cluster()
    try:
        cluster.driver()
        cluster.executor("exec-1")
        cluster.executor("exec-2")
        cluster.wait_for_executors(2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def client(cluster):
    import ember

    with ember.connect(cluster.url, cluster=cluster.name) as client:
        yield client


@pytest.fixture
async def aclient(cluster):
    import ember

    client = await ember.Client.connect(cluster.url, cluster=cluster.name)
    try:
        yield client
    finally:
        await client.close()
