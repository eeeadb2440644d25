"""Futures as arguments: a task that reads other tasks' results runs after them, on values
the executor reads from the cluster, and fails with `UpstreamError` when one of them fails."""

import pytest

import ember


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def square(x):
    return x * x


def double(x):
    return 2 * x


def total(values):
    return sum(values)


def from_dict(d):
    return d["x"][0] + d["y"] + sum(d["z"])


def broken(x):
    raise ValueError(f"broken on {x}")


def size(data):
    return len(data)


def payload(n):
    return b"x" * n


def test_a_future_in_the_arguments_is_its_value(client):
    a = client.submit(inc, 1)
    b = client.submit(add, a, 10)
    # Nested in a dict, a list and a tuple, beside plain values.
    c = client.submit(from_dict, {"x": [a], "y": b, "z": (a, 100)})
    assert c.result(60) == 2 + 12 + 2 + 100
    assert b.result(60) == 12
    # The dependent ran after what it reads, which it names as jobs it runs after.
    assert b.job.job.upstream == [a.job.job_id]
    assert sorted(c.job.job.upstream) == sorted([a.job.job_id, b.job.job_id])


def test_a_job_in_the_arguments_is_its_results_and_a_map_takes_futures(client):
    squares = client.map(square, range(10), chunksize=3)
    assert client.submit(total, squares).result(60) == sum(x * x for x in range(10))
    futures = [client.submit(inc, i) for i in range(4)]
    assert client.map(double, futures, chunksize=1).results(60) == [2, 4, 6, 8]
    # A job of handler tasks stands for its JSON results.
    echoed = client.submit_handler("echo", {"value": 5}, tasks=3)
    assert client.submit(total, echoed).result(60) == 15


def test_an_upstream_failure_fails_its_dependents_without_running_them(client):
    a = client.submit(broken, 7)
    b = client.submit(inc, a)
    c = client.submit(add, b, 1)
    with pytest.raises(ember.UpstreamError) as raised:
        c.result(60)
    error = raised.value
    assert error.upstream == b.job.job_id
    assert f"job {b.job.job_id}" in str(error)
    # Down the chain: b's own UpstreamError, then a's exception with its remote traceback.
    middle = error.__cause__
    assert isinstance(middle, ember.UpstreamError), repr(middle)
    assert middle.upstream == a.job.job_id
    original = middle.__cause__
    assert isinstance(original, ValueError), repr(original)
    assert "broken on 7" in str(original)
    assert "in broken" in str(original.__cause__)
    # Neither dependent ran: no attempt of theirs was spent.
    for dependent in (b, c):
        summary = dependent.job.summary()
        assert summary["state"] == "FAILED"
        assert [o["attempts"] for o in dependent.job.outcomes()] == [0]


def test_a_result_too_large_for_one_message_reaches_its_dependent(client):
    big = 3 * 2**20
    made = client.submit(payload, big)
    assert client.submit(size, made).result(120) == big


async def test_futures_of_the_asyncio_client(aclient):
    a = await aclient.submit(inc, 41)
    b = await aclient.submit(add, a, a)
    assert await b == 84


def test_a_value_put_into_the_store_may_not_hold_a_future(client):
    a = client.submit(inc, 1)
    with pytest.raises(TypeError, match="futures"):
        client.put([a])


def test_a_job_read_by_a_queued_one_outlives_retention(tmp_path):
    """A driver keeping 2 finished jobs: the upstream of a queued reader is kept while 5 later
    jobs end, and the reader runs on its result."""
    from conftest import Cluster

    cluster = Cluster()
    try:
        cluster.driver("--retain-jobs", "2")
        cluster.executor("exec-1", cores=1)
        cluster.wait_for_executors(1)
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            upstream = client.submit(inc, 1)
            assert upstream.result(60) == 2
            blocker = client.submit_handler("sleep", {"ms": 1500})
            reader = client.submit(add, upstream, 10)
            # Five jobs end (killed while queued) while the reader waits for the core.
            for _ in range(5):
                client.submit_handler("noop").kill()
            assert upstream.job.summary()["state"] == "SUCCEEDED"
            assert reader.result(60) == 12
            assert blocker.wait(60)["state"] == "SUCCEEDED"
            # Its reader ended: the upstream, past the limit, is forgotten.
            client.submit_handler("noop").wait(60)
            with pytest.raises(ember.DriverError, match="forgotten"):
                upstream.job.summary()
    finally:
        cluster.stop()


def wait_for_file(path):
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def size_once_released(data, released):
    return len(data) if released else -1


def test_what_a_waiting_task_reads_stays_while_the_bucket_drops_older_results(tmp_path):
    """A results bucket of 300 kB, filled four times over while a reader waits: a result no
    task reads is dropped, the one the reader reads is pinned and reaches it."""
    from conftest import Cluster

    cluster = Cluster()
    flag = str(tmp_path / "released")
    try:
        cluster.driver("--results-max-bytes", "300000")
        cluster.executor("exec-1", cores=2)
        cluster.wait_for_executors(1)
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            unread = client.submit(payload, 50_000)
            upstream = client.submit(payload, 50_000)
            assert len(unread.result(60)) == len(upstream.result(60)) == 50_000
            # The reader waits, holding no core, for a task that holds one until released.
            gate = client.submit(wait_for_file, flag)
            reader = client.submit(size_once_released, upstream, gate)
            flood = client.map(payload, [50_000] * 24, chunksize=1)
            assert flood.wait(120)["state"] == "SUCCEEDED"
            # (The job, read again: a future keeps the value it had.)
            for read in (unread.job.results, flood.results):
                with pytest.raises(ember.ResultGone, match="no longer in the results bucket"):
                    read(60)
            open(flag, "w").close()
            assert reader.result(60) == 50_000
            assert len(upstream.result(60)) == 50_000
    finally:
        cluster.stop()


def test_a_reader_waiting_through_a_driver_sigkill_reads_its_pinned_upstream(tmp_path):
    """The driver is killed with SIGKILL while a reader waits, and a new one fills the bucket
    over before the reader runs: the restored driver pins again what the reader reads."""
    from conftest import Cluster

    cluster = Cluster()
    flag = str(tmp_path / "released")
    args = ("--results-max-bytes", "300000")
    try:
        driver = cluster.driver(*args)
        cluster.executor("exec-1", cores=2)
        cluster.wait_for_executors(1)
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            upstream = client.submit(payload, 50_000)
            assert len(upstream.result(60)) == 50_000
            gate = client.submit(wait_for_file, flag)
            reader = client.submit(size_once_released, upstream, gate)
            driver.kill()
            driver.wait(10)
            cluster.driver(*args)
            flood = client.map(payload, [50_000] * 24, chunksize=1)
            assert flood.wait(120)["state"] == "SUCCEEDED"
            with pytest.raises(ember.ResultGone):
                flood.results(60)
            open(flag, "w").close()
            assert reader.result(60) == 50_000
            assert gate.result(60) is True
    finally:
        cluster.stop()
