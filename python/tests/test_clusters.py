"""Clusters of their own: credentials from `ember creds`, and executors that refuse python."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

import ember
from conftest import Cluster, binary, free_port, nats_server_binary, wait_listening


def square(x):
    return x * x


def test_credentials_from_ember_creds(tmp_path):
    passwords = tmp_path / "ember-passwords"
    config = tmp_path / "nats-secure.conf"
    probe = Cluster()  # only for a cluster name
    probe.stop()
    name = probe.name
    text = subprocess.run(
        [binary("ember"), "--cluster", name, "creds", "--executors", "1",
         "--password-file", str(passwords), "--full"],
        check=True, capture_output=True, text=True,
    ).stdout
    config.write_text(text)
    users = dict(line.split(None, 1) for line in passwords.read_text().splitlines()
                 if line and not line.startswith("#"))
    cluster = Cluster(config)
    cluster.name = name
    try:
        # Every user name carries the cluster's.
        assert sorted(users) == sorted(f"{name}.{role}" for role in
                                       ("driver", "exec-1", "client", "listener"))
        driver, executor, client_user = (f"{name}.{role}" for role in ("driver", "exec-1", "client"))
        cluster.driver("--journal", "off", auth=(driver, users[driver].strip()))
        cluster.executor("exec-1", auth=(executor, users[executor].strip()))
        cluster.wait_for_executors(1, auth=str(passwords))
        with ember.connect(cluster.url, cluster=name, creds=str(passwords)) as client:
            assert client.map(square, range(6)).results() == [0, 1, 4, 9, 16, 25]
            assert client.submit(square, 4).result() == 16
        with ember.connect(cluster.url, cluster=name, creds=(client_user, users[client_user].strip())) as api:
            assert api.submit(square, 5).result() == 25
        # The server refuses the password; nats-py reads either its -ERR or the reset that
        # follows it first.
        with pytest.raises(ember.EmberError,
                           match="could not connect.*([Aa]uthorization|reset by peer)"):
            ember.connect(cluster.url, cluster=name, creds=(client_user, "wrong"),
                          connect_timeout=1)
    finally:
        cluster.stop()


def test_an_executor_with_no_python_refuses_python_tasks():
    cluster = Cluster()
    try:
        cluster.driver()
        cluster.executor("exec-1", "--no-python")
        cluster.wait_for_executors(1)
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            with pytest.raises(ember.TaskError, match="runs no python tasks .*--no-python"):
                client.submit(square, 2).result()
            assert client.submit_handler("echo", {"value": 1}).results() == [1]
    finally:
        cluster.stop()


def test_ember_up_gives_its_executors_the_python_it_is_told(tmp_path):
    # The first python3 on the PATH cannot run anything: only --python makes the map work.
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "python3").write_text("#!/bin/sh\nexit 3\n")
    (broken / "python3").chmod(0o755)
    port = free_port()
    env = dict(os.environ, PATH=f"{broken}:{os.environ['PATH']}",
               EMBER_NATS_SERVER=nats_server_binary(), RUST_LOG="warn")
    name = "py-up-" + uuid.uuid4().hex[:6]
    up = subprocess.Popen(
        [binary("ember"), "--cluster", name, "up", "--executors", "1", "--port", str(port),
         "--http", "off", "--python", sys.executable],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_listening(port, up, "ember up")
        with ember.connect(f"nats://127.0.0.1:{port}", cluster=name) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.executors()["registered_executors"] == 1:
                        break
                except ember.NoDriver:
                    pass
                assert time.monotonic() < deadline, "the executor did not register"
                time.sleep(0.1)
            assert client.map(square, range(4)).results() == [0, 1, 4, 9]
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            up.kill()


def resources_seen(_=None):
    return os.environ.get("EMBER_RESOURCE_GPU"), os.environ.get("EMBER_TASK_RESOURCES")


def test_a_function_reads_the_addresses_of_its_resources():
    cluster = Cluster()
    try:
        cluster.driver()
        cluster.executor("exec-1", "--resource", "gpu=2", cores=2)
        cluster.wait_for_executors(1)
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            both = client.submit_with(resources_seen, resources={"gpu": 2}).result(timeout=30)
            assert both == ("0,1", '{"gpu":["0","1"]}')
            # Each task of a map holds one GPU, and sees which.
            seen = client.map(resources_seen, range(4), chunksize=1, resources={"gpu": 1})
            seen = seen.results(timeout=30)
            assert len(seen) == 4
            for gpu, all_of_them in seen:
                assert gpu in ("0", "1"), seen
                assert all_of_them == f'{{"gpu":["{gpu}"]}}'
            # A call without resources, on a worker that ran one with, sees none of them.
            for _ in range(4):
                assert client.submit(resources_seen).result(timeout=30) == (None, None)
    finally:
        cluster.stop()
