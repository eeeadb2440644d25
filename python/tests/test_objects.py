"""Objects from Python: values put once and passed by reference, large closures and map items
sent as objects rather than inside the request (see conftest.py for the cluster)."""

import re
import urllib.request

import pytest

import ember
from conftest import Cluster, free_port


def total(d):
    return sum(d["xs"]) + len(d["note"])


def test_a_value_put_reads_back_and_the_same_value_is_one_object(client):
    value = {"weights": list(range(1000)), "name": "model"}
    ref = client.put(value)
    assert isinstance(ref, ember.ObjectRef)
    assert client.get(ref) == value
    assert client.put(value) == ref
    assert client.get(ref.ref) == value


def test_an_object_ref_inside_a_dict_is_the_value_on_the_executor(client):
    xs = client.put(list(range(10_000)))
    future = client.submit(total, {"xs": xs, "note": "abc"})
    assert future.result(timeout=60) == sum(range(10_000)) + 3


def test_a_map_of_items_too_large_for_one_request_runs(client):
    # 100 items of 200 KB: 20 MB, far past the server's 1 MB max_payload in one request.
    items = [bytes([i]) * 200_000 for i in range(100)]
    results = client.map(len, items).results(timeout=120)
    assert results == [200_000] * 100


def metric(url, name):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"no {name} in {text}"
    return float(found.group(1))


def test_a_closure_over_50_mib_is_fetched_once_per_executor():
    cluster = Cluster()
    try:
        cluster.driver()
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            cluster.executor(f"exec-{i + 1}", "--metrics-addr", f"127.0.0.1:{port}")
        cluster.wait_for_executors(2)
        big = bytes(range(256)) * (50 * 4096)  # 50 MiB
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            results = client.map(lambda i: len(big) + i, range(64), chunksize=1).results(
                timeout=300
            )
        assert results == [len(big) + i for i in range(64)]
        for port in ports:
            url = f"http://127.0.0.1:{port}/metrics"
            assert metric(url, "ember_executor_object_fetches_total") == 1
            assert metric(url, "ember_executor_object_fetched_bytes_total") > 50 * 2**20
    finally:
        cluster.stop()


def test_a_command_reads_an_input_put_from_python_and_its_output_comes_back(client):
    words = client.put_bytes(b"b\na\nc\n")
    job = client.submit_commands(
        ["sh", "-c", "sort words.txt > sorted.txt"],
        tasks=2,
        inputs={"words.txt": words},
        outputs=["sorted.txt"],
    )
    for result in job.results(timeout=60):
        assert client.get_bytes(result["outputs"]["sorted.txt"]) == b"a\nb\nc\n"
