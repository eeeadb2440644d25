"""Objects from Python: values put once and passed by reference, large closures and map items
sent as objects rather than inside the request (see conftest.py for the cluster)."""

import base64
import io
import pickle
import re
import urllib.request

import cloudpickle
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


def first_word(item):
    return int.from_bytes(item[:8], "little")


def numbered(count, size):
    """`count` items of `size` bytes, each its index and then zeros: no two alike, so that no
    pickle shares one."""
    filler = bytes(size - 8)
    return (i.to_bytes(8, "little") + filler for i in range(count))


def test_a_map_of_a_million_items_of_1_kib_runs(client):
    # A GiB of items: with the cluster's 4 cores, 16 tasks of some 64 MB, each an object.
    count = 1_000_000
    results = client.map(first_word, numbered(count, 1024)).results(timeout=120)
    assert len(results) == count
    assert sum(results) == count * (count - 1) // 2
    assert [results[i] for i in (0, 1, 62_499, 62_500, 999_999)] == [0, 1, 62_499, 62_500, 999_999]


def test_a_map_of_items_too_many_for_one_request_inline_runs_with_them_in_groups(client):
    # 3,000 tasks of 10 KB each: 40 MB inline, past the server's 1 MiB max_payload, though
    # each task's items are under 64 KiB.
    count = 3_000
    assert count * 10_000 > client.client.nc.max_payload
    results = client.map(first_word, numbered(count, 10_000), chunksize=1).results(timeout=120)
    assert results == list(range(count))


def test_a_map_of_more_tasks_than_a_request_can_name_says_which_chunksize_fits(client):
    count = 200_000
    with pytest.raises(ember.RequestTooLarge, match="chunksize") as refused:
        client.map(first_word, numbered(count, 16), chunksize=1)
    needed = int(re.search(r"chunksize of at least (\d+)", str(refused.value)).group(1))
    assert 20 < needed < 200, str(refused.value)
    results = client.map(first_word, numbered(count, 16), chunksize=needed).results(timeout=60)
    assert results == list(range(count))


class _Naming(pickle.Pickler):
    """Pickles itself as the persistent id it is given, whatever its shape."""

    def __init__(self, file, pid):
        super().__init__(file)
        self.pid = pid

    def persistent_id(self, obj):
        return self.pid if obj is self else None


def map_task_of(pid, objects=()):
    """A map task of `len` whose args are nothing but persistent id `pid`."""
    buffer = io.BytesIO()
    pickler = _Naming(buffer, pid)
    pickler.dump(pickler)
    spec = {
        "kind": "python",
        "map": True,
        "function": base64.b64encode(cloudpickle.dumps(len)).decode(),
        "args": base64.b64encode(buffer.getvalue()).decode(),
    }
    if objects:
        spec["objects"] = list(objects)
    return spec


def test_an_item_id_malformed_or_not_named_by_the_task_fails_it_saying_so(client):
    ref = client.put([1, 2]).ref
    cases = [
        (("ember-item", ref), (), "malformed persistent id"),
        (("ember-item", ref, -1), (ref,), "malformed persistent id"),
        (("ember-item", ref, "0"), (ref,), "malformed persistent id"),
        (("ember-item", ref, 0), (), f"object {ref} is not among the objects the task names"),
        (("ember-item", ref, 9), (ref,), "no group of map items with a position 9"),
        (("ember-item", ref, 0), (ref,), "element 0 is of type int, not a pickle"),
    ]
    for pid, objects, said in cases:
        job = client.submit_job([map_task_of(pid, objects)], max_failures=1)
        job.wait(timeout=30)
        (outcome,) = job.outcomes()
        assert outcome["state"] == "FAILED"
        assert said in outcome["result"]["error"], (pid, outcome)


def metric(url, name):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"no {name} in {text}"
    return float(found.group(1))


def map_over_50_mib(*executor_args):
    """Maps a closure over 50 MiB as 64 tasks on two executors started with `executor_args`;
    the metrics endpoint of each."""
    cluster = Cluster()
    try:
        cluster.driver()
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            cluster.executor(
                f"exec-{i + 1}", "--metrics-addr", f"127.0.0.1:{port}", *executor_args
            )
        cluster.wait_for_executors(2)
        big = bytes(range(256)) * (50 * 4096)  # 50 MiB
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            results = client.map(lambda i: len(big) + i, range(64), chunksize=1).results(
                timeout=300
            )
        assert results == [len(big) + i for i in range(64)]
        return [
            {
                name: metric(f"http://127.0.0.1:{port}/metrics", f"ember_executor_object_{name}")
                for name in ["fetches_total", "fetched_bytes_total", "host_takes_total"]
            }
            for port in ports
        ]
    finally:
        cluster.stop()


def test_a_closure_over_50_mib_is_fetched_once_per_executor():
    # Executors that do not share the client's host fetch from the store.
    for counts in map_over_50_mib("--host-objects", "off"):
        assert counts["fetches_total"] == 1, counts
        assert counts["fetched_bytes_total"] > 50 * 2**20, counts
        assert counts["host_takes_total"] == 0, counts


def test_executors_on_the_clients_host_take_what_it_put_from_there():
    for counts in map_over_50_mib():
        assert counts["fetches_total"] == 0, counts
        assert counts["host_takes_total"] == 1, counts


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
