"""`ember.Executor` is a `concurrent.futures.Executor`: one program runs on a ProcessPoolExecutor
and on the cluster with only its constructor changed; and the notebook summaries."""

import concurrent.futures
import functools
import pickle
import subprocess
import sys
import time
from concurrent.futures import FIRST_EXCEPTION, as_completed, wait

import cloudpickle
import pytest

import ember
from ember.sync import _star


def square(x):
    return x * x


def add(a, b=0):
    return a + b


def fail(message):
    raise ValueError(message)


def fail_on_seven(x):
    if x == 7:
        raise KeyError(f"no {x}")
    return x


def run(make_executor):
    """A program written for ProcessPoolExecutor; `make_executor()` is its executor."""
    with make_executor() as executor:
        assert executor.submit(add, 2, b=3).result(timeout=60) == 5

        values = executor.map(square, range(100), chunksize=8, timeout=60)
        assert list(values) == [x * x for x in range(100)]
        assert list(executor.map(add, range(5), range(10, 15), timeout=60)) == [
            10, 12, 14, 16, 18
        ]

        futures = {executor.submit(square, n): n for n in range(10)}
        squares = {futures[f]: f.result() for f in as_completed(futures, timeout=60)}
        assert squares == {n: n * n for n in range(10)}

        failing = executor.submit(fail, "on purpose")
        with pytest.raises(ValueError, match="^on purpose$"):
            failing.result(timeout=60)
        assert isinstance(failing.exception(), ValueError)

        # The failure ends the wait while the slow calls still run.
        first = executor.submit(fail, "first")
        slow = [executor.submit(time.sleep, 5) for _ in range(2)]
        done, not_done = wait([first, *slow], timeout=60, return_when=FIRST_EXCEPTION)
        assert first in done and set(slow) == not_done
        assert str(first.exception()) == "first"

        # The map raises at the item whose call raised; the values before it come first.
        seen = []
        with pytest.raises(KeyError, match="no 7"):
            for value in executor.map(fail_on_seven, range(20), timeout=60):
                seen.append(value)
        assert seen == list(range(len(seen))) and len(seen) <= 7

        # More calls than the executor runs at once: the last one has not started.
        blockers = [executor.submit(time.sleep, 1) for _ in range(8)]
        last = blockers[-1]
        assert last.cancel() is True
        assert last.cancelled() and last.done()
        with pytest.raises(concurrent.futures.CancelledError):
            last.result()
        assert set(as_completed(blockers, timeout=60)) == set(blockers)
        assert [f.result() for f in blockers[:-1]] == [None] * 7

        at_exit = executor.submit(time.sleep, 0.5)
    # The with block's end waited for the outstanding call and shut the executor down.
    assert at_exit.done() and at_exit.result() is None
    with pytest.raises(RuntimeError):
        executor.submit(square, 2)


def test_the_program_on_a_process_pool():
    run(lambda: concurrent.futures.ProcessPoolExecutor(2))


def test_the_same_program_on_the_cluster(cluster):
    run(lambda: ember.Executor(cluster.url, cluster=cluster.name))


def newest_job(client, name):
    return max((j for j in client.jobs() if j["name"] == name), key=lambda j: j["job_id"])


def eventually(check, limit=30):
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, "not within the limit"
        time.sleep(0.1)


def test_a_map_past_its_timeout_raises_and_is_killed(client):
    executor = ember.Executor(client=client)
    started = time.monotonic()
    results = executor.map(time.sleep, [30] * 4, timeout=0.5)
    with pytest.raises(concurrent.futures.TimeoutError):
        next(results)
    assert time.monotonic() - started < 10
    job_id = newest_job(client, "sleep")["job_id"]
    eventually(lambda: client.job(job_id).summary()["state"] == "KILLED")
    executor.shutdown()
    # A client the executor was given stays open.
    assert client.submit(square, 4).result(60) == 16


def test_a_cancelled_call_has_its_job_killed(client):
    with ember.Executor(client=client) as executor:
        blockers = [executor.submit(time.sleep, 30) for _ in range(4)]
        try:
            waiting = executor.submit(time.sleep, 30)
            assert waiting.cancel()
            eventually(lambda: waiting.job.summary()["state"] == "KILLED")
        finally:
            executor.shutdown(cancel_futures=True)
        assert all(f.cancelled() for f in blockers)
        for future in blockers:
            eventually(lambda: future.job.summary()["state"] == "KILLED")


def test_shutdown_cancelling_futures_kills_a_running_map(client):
    executor = ember.Executor(client=client)
    results = executor.map(time.sleep, [30] * 2)
    job_id = newest_job(client, "sleep")["job_id"]
    executor.shutdown(cancel_futures=True)
    with pytest.raises(concurrent.futures.CancelledError):
        next(results)
    eventually(lambda: client.job(job_id).summary()["state"] == "KILLED")


def test_futures_of_the_blocking_client_are_standard_futures(client):
    a = client.submit(add, 1, 2)
    assert isinstance(a, ember.Future) and isinstance(a, concurrent.futures.Future)
    # As an argument, a future is its value, read on the cluster.
    b = client.submit_with(add, (a, 10))
    assert b.result(60) == 13
    assert b.job.job.upstream == [a.job_id]
    assert "state=finished" in repr(b)
    # Callbacks may call the client.
    submitted = []
    c = client.submit(square, 5)
    c.add_done_callback(lambda f: submitted.append(client.submit(square, f.result())))
    assert c.result(60) == 25
    eventually(lambda: submitted)
    assert submitted[0].result(60) == 625


def test_closing_the_client_fails_what_is_pending(cluster, client):
    other = ember.connect(cluster.url, cluster=cluster.name)
    future = other.submit(time.sleep, 30)
    other.close()
    with pytest.raises(ember.EmberError, match="closed before job"):
        future.result(10)
    other.close()  # again: nothing happens
    assert "closed" in repr(other)
    client.job(future.job_id).kill()


def test_the_star_helper_needs_no_ember_on_the_executor():
    # What a map over several iterables sends: loaded where `ember` cannot be imported.
    data = cloudpickle.dumps(functools.partial(_star, pow))
    script = (
        "import pickle, sys; sys.modules['ember'] = None; "
        "f = pickle.loads(sys.stdin.buffer.read()); print(f((2, 5)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], input=data, capture_output=True, check=True
    )
    assert out.stdout.decode().strip() == "32"
    assert pickle.loads(data)((3, 2)) == 9


def test_html_summaries(client):
    client.web_url = "http://127.0.0.1:4040/"
    page = client._repr_html_()
    assert "cluster" in page and client.cluster in page
    assert "<th style=\"text-align:left\">executors</th><td style=\"text-align:left\">2<" in page
    assert "<th style=\"text-align:left\">cores</th><td style=\"text-align:left\">4<" in page
    assert '<a href="http://127.0.0.1:4040/"' in page

    job = client.map(square, range(6), chunksize=2)
    job.wait(60)
    page = job._repr_html_()
    assert f">{job.job_id}<" in page and ">SUCCEEDED<" in page and ">square<" in page
    assert "succeeded</th><td style=\"text-align:left\">3<" in page

    future = client.submit(fail, "<b>bold</b>")
    concurrent.futures.wait([future], timeout=60)
    page = future._repr_html_()
    assert "error: ValueError: &lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold" not in page
    assert f">{future.job_id}<" in page

    client.web_url = None
    slow = client.submit(time.sleep, 30)
    page = slow._repr_html_()
    states = [f'state</th><td style="text-align:left">{s}<' for s in ("pending", "running")]
    assert any(state in page for state in states)
    slow.cancel()
    page = slow._repr_html_()
    assert "cancelled" in page and "web page" not in page


def test_html_summary_of_a_closed_client_says_so(cluster):
    client = ember.connect(
        "nats://someone:secret@127.0.0.1:" + cluster.url.rsplit(":", 1)[1], cluster=cluster.name
    )
    client.close()
    page = client._repr_html_()
    assert "the client is closed" in page and "secret" not in page


def test_a_progress_bar_shows_in_a_terminal(client, capsys):
    job = client.map(square, range(8), chunksize=1)
    job.wait(60, progress=True)
    err = capsys.readouterr().err
    assert f"job {job.job_id}" in err and "8/8" in err
