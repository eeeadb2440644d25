"""The Python client against a real cluster (see conftest.py)."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import ember


def square(x):
    return x * x


def nested_failure(value):
    def inner():
        raise ValueError(f"bad value {value}")

    return inner()


class Unpicklable(Exception):
    """An exception that cannot be rebuilt from its pickle (its __init__ takes two args)."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def raise_unpicklable():
    raise Unpicklable(1, 2)


def test_submit_returns_the_value(client):
    offset = 5
    assert client.submit(pow, 2, 10).result() == 1024
    assert client.submit(lambda x, y=0: x + y + offset, 1, y=2).result() == 8
    assert client.submit(square, 12).result(timeout=30) == 144


def test_map_gives_results_in_order(client):
    assert client.map(square, range(100), chunksize=7).results() == [x * x for x in range(100)]
    # By default about four tasks per core: 4 cores here, so 16 tasks of 4 items.
    job = client.map(lambda x: -x, range(64))
    assert job.results() == [-x for x in range(64)]
    assert job.summary()["tasks"] == 16
    assert client.map(square, []).results() == []


def test_a_remote_exception_carries_its_traceback(client):
    with pytest.raises(ValueError, match="bad value 7") as raised:
        client.submit(nested_failure, 7).result()
    cause = raised.value.__cause__
    assert isinstance(cause, ember.RemoteTraceback)
    assert "in nested_failure" in cause.text and "in inner" in cause.text
    assert "ValueError: bad value 7" in cause.text
    assert raised.value.remote_traceback == cause.text
    # One that cannot be unpickled here comes back as RemoteError, with the same.
    with pytest.raises(ember.RemoteError) as raised:
        client.submit(raise_unpicklable).result()
    assert raised.value.type_name == "Unpicklable"
    assert "in raise_unpicklable" in raised.value.remote_traceback
    assert "Remote traceback" in str(raised.value)


def test_a_result_past_the_jobs_limit_fails_its_task_naming_the_limit(client):
    # 100 MiB of result against the driver's default --max-job-result-bytes of 64 MiB: the
    # task fails for good (one attempt), rather than succeed without its value.
    future = client.submit(bytes, 100 << 20)
    with pytest.raises(ember.TaskError, match=r"over job \d+'s limit.*--max-job-result-bytes"):
        future.result(timeout=120)
    outcomes = future.job.outcomes()
    assert [o["state"] for o in outcomes] == ["FAILED"]


def test_a_module_the_executor_cannot_import_is_named(client):
    sys.path.insert(0, str(Path(__file__).parent / "unimportable"))
    try:
        import ember_test_helper
    finally:
        sys.path.pop(0)
    with pytest.raises(ember.RemoteError) as raised:
        client.submit(ember_test_helper.triple, 2).result()
    message = str(raised.value)
    assert "needs module 'ember_test_helper', which is not importable on this executor" in message


def test_a_killed_worker_fails_its_task_and_is_replaced(client):
    pid = client.submit(os.getpid).result()
    with pytest.raises(ember.TaskError, match="exited .*SIGKILL.*a new worker takes its place"):
        client.submit(lambda: os.kill(os.getpid(), signal.SIGKILL)).result()
    # Every worker still answers, the replaced one included.
    pids = client.map(lambda _: os.getpid(), range(40), chunksize=1).results()
    assert all(isinstance(p, int) for p in pids)
    assert pid > 0


def test_a_timeout_stops_the_call(client):
    started = time.monotonic()
    with pytest.raises(ember.TaskError, match="timed out after 1s; its python worker was stopped"):
        client.submit_with(time.sleep, (60,), timeout=1).result()
    assert time.monotonic() - started < 15
    assert client.submit(square, 3).result() == 9


def always_fails():
    raise RuntimeError("not yet")


def test_a_failed_call_waits_out_its_backoff_before_it_runs_again(client):
    started = time.monotonic()
    future = client.submit_with(
        always_fails, max_failures=3, retry_backoff=ember.retry_backoff(0.3, jitter=0)
    )
    with pytest.raises(RuntimeError, match="not yet"):
        future.result(timeout=60)
    # Three attempts: 0.3 s and then 0.6 s of waiting between them.
    assert time.monotonic() - started >= 0.9
    assert future.job.outcomes()[0]["attempts"] == 3


def test_a_backoff_is_written_as_the_driver_reads_it():
    from ember.client import _job_request

    assert _job_request([], retry_backoff=1.5)["retry_backoff"] == {"initial_ms": 1500}
    assert ember.retry_backoff(1, multiplier=3, max=60, jitter=0.1) == {
        "initial_ms": 1000, "multiplier": 3.0, "max_ms": 60000, "jitter": 0.1
    }
    assert "retry_backoff" not in _job_request([])


class Throttled(ConnectionError):
    """A failure worth another attempt: a subclass of one `retry_on` names."""


def raises(kind):
    raise {"value": ValueError, "throttled": Throttled, "key": KeyError}[kind](kind)


@pytest.mark.parametrize("kind, options, attempts", [
    # no_retry_on names it: one attempt, whatever max_failures allows.
    ("value", {"no_retry_on": ValueError}, 1),
    # retry_on names its base class: every attempt.
    ("throttled", {"retry_on": [ConnectionError]}, 3),
    # retry_on does not name it: one attempt.
    ("key", {"retry_on": "ConnectionError"}, 1),
    # no_retry_on wins over retry_on.
    ("throttled", {"retry_on": ConnectionError, "no_retry_on": Throttled}, 1),
])
def test_retry_on_and_no_retry_on_decide_which_failures_run_again(client, kind, options, attempts):
    future = client.submit_with(raises, (kind,), max_failures=3, **options)
    # The call's own exception is raised here, as in a local call.
    with pytest.raises((ValueError, KeyError, ConnectionError), match=kind):
        future.result(timeout=60)
    outcome = future.job.outcomes()[0]
    assert outcome["attempts"] == attempts
    assert ("(not retried: " in outcome["error"]) == (attempts == 1), outcome["error"]


def test_a_map_takes_a_retry_policy(client):
    job = client.map(raises, ["value"], max_failures=3, no_retry_on=[ValueError])
    with pytest.raises(ValueError):
        job.results(timeout=60)
    outcome = job.outcomes()[0]
    assert outcome["attempts"] == 1
    assert "(not retried: no_retry_on names ValueError)" in outcome["error"]


def test_a_retry_policy_is_written_as_the_executor_reads_it():
    from ember.client import _retry_policy

    assert _retry_policy((), None) == {}
    assert _retry_policy([ValueError, Throttled], "KeyError") == {
        "retry_on": ["ValueError", f"{__name__}.Throttled"],
        "no_retry_on": ["KeyError"],
    }
    with pytest.raises(TypeError, match="exception classes or their names"):
        _retry_policy([int], ())


def test_a_job_past_its_deadline_fails(client):
    job = client.map(time.sleep, [60] * 2, chunksize=1, deadline=0.5)
    summary = job.wait(timeout=30)
    assert summary["state"] == "FAILED"
    assert summary["reason"].startswith("the job passed its deadline (500ms")


def timed_sleep(seconds):
    start = time.time()
    time.sleep(seconds)
    return (start, time.time())


def test_a_concurrency_key_limits_the_tasks_of_every_job_that_names_it(client):
    key = f"py-api-{os.getpid()}"
    shown = client.set_limits(key, max_concurrent=1, rate="100/s")
    assert shown["max_concurrent"] == 1
    assert shown["rate"] == {"count": 100, "per_ms": 1000}
    # Two jobs of two tasks on four cores: one task at a time, all jobs together.
    jobs = [
        client.map(timed_sleep, [0.3, 0.3], chunksize=1, concurrency_key=key) for _ in range(2)
    ]
    assert jobs[1].summary()["concurrency_key"] == key
    spans = sorted(span for job in jobs for span in job.results())
    assert len(spans) == 4
    for before, after in zip(spans, spans[1:]):
        assert after[0] >= before[1], f"two tasks of key {key} ran at once: {spans}"
    assert any(k["key"] == key for k in client.limits())
    cleared = client.clear_limits(key)
    assert "max_concurrent" not in cleared and "rate" not in cleared
    assert all(k["key"] != key for k in client.limits())
    with pytest.raises(ValueError, match="not a rate"):
        client.set_limits(key, rate="ten/s")
    with pytest.raises(ValueError, match="give max_concurrent, rate or both"):
        client.set_limits(key)
    with pytest.raises(ember.DriverError, match="max_concurrent must be between 1"):
        client.set_limits(key, max_concurrent=0)
    assert ember.client._rate("3/500ms") == {"count": 3, "per_ms": 500}
    assert ember.client._rate((5, 60)) == {"count": 5, "per_ms": 60_000}


def test_a_gang_runs_whole_and_one_too_large_is_refused(client):
    job = client.submit_job([ember.handler_task("sleep", {"ms": 50})], repeat=3, gang=True)
    assert job.wait(timeout=30)["state"] == "SUCCEEDED"
    with pytest.raises(ember.DriverError, match="needs them all at once"):
        client.submit_job([ember.handler_task("noop")], repeat=100, gang=True)


def _gang_seat():
    import os

    peers = os.environ["EMBER_GANG_PEERS"].split(",")
    return int(os.environ["EMBER_GANG_RANK"]), int(os.environ["EMBER_GANG_PORT"]), peers


def _gang_variables():
    import os

    return sorted(name for name in os.environ if name.startswith("EMBER_GANG_"))


def test_a_gang_s_python_tasks_see_their_peers_and_ports_and_later_calls_do_not(client):
    job = client.submit_job([ember.python_task(_gang_seat)], repeat=3, gang=True)
    seats = job.results()
    peers = seats[0][2]
    assert len(peers) == 3 and len(set(peers)) == 3, peers
    for index, (rank, port, seen) in enumerate(seats):
        assert rank == index and seen == peers, seats
        assert peers[index].endswith(f":{port}"), seats
    # The variables are set for a gang's call only: the workers' next calls see none.
    later = client.map(lambda _: _gang_variables(), range(8), chunksize=1).results()
    assert later == [[]] * 8


def test_kill_a_job(client):
    job = client.map(time.sleep, [60] * 4, chunksize=1)
    time.sleep(0.5)
    job.kill()
    summary = job.wait(timeout=30)
    assert summary["state"] == "KILLED"
    assert summary["reason"] == "killed by request"
    # Sent again, as after a lost answer, the kill is answered the same and changes nothing.
    # (Its counts may still move as the killed tasks' workers stop: what the kill decided may not.)
    job.kill()
    again = job.wait(timeout=30)
    for field in ("job_id", "state", "reason", "ended_at_ms", "tasks", "succeeded", "failed"):
        assert again[field] == summary[field], field
    with pytest.raises(ember.TaskError, match="KILLED"):
        job.results()


def test_commands_and_handlers(client):
    job = client.submit_commands(["sh", "-c", "echo task $EMBER_TASK_INDEX"], tasks=3)
    assert [r["stdout"] for r in job.results()] == ["task 0\n", "task 1\n", "task 2\n"]
    assert client.submit_handler("echo", {"value": [1, 2]}, tasks=2).results() == [[1, 2], [1, 2]]
    failing = client.submit_handler("fail", {"message": "on purpose"}, max_failures=1)
    with pytest.raises(ember.TaskError, match="on purpose"):
        failing.results()
    assert failing.wait(progress=True)["state"] == "FAILED"


def test_a_job_after_another_waits_for_it_and_fails_with_it(client):
    first = client.submit_handler("sleep", {"ms": 500})
    second = client.submit_handler("echo", {"value": 2}, after=[first])
    waiting = second.summary()
    assert waiting["state"] == "WAITING", waiting
    assert waiting["waits_for"] == [first.job_id]
    # Waiting is not ended: results() waits for the run.
    assert second.results() == [2]
    assert first.summary()["state"] == "SUCCEEDED"
    broken = client.submit_handler("fail", {"message": "upstream broke"}, max_failures=1)
    after_it = client.submit_handler("noop", after=[broken.job_id])
    cleanup = client.submit_handler("noop", after_any=[broken])
    ended = after_it.wait()
    assert ended["state"] == "FAILED"
    assert f"job {broken.job_id}, which this job runs after, FAILED" in ended["reason"]
    assert "upstream broke" in ended["reason"]
    assert cleanup.wait()["state"] == "SUCCEEDED"
    with pytest.raises(ember.DriverError, match="does not exist"):
        client.submit_handler("noop", after=[987654])
    with pytest.raises(TypeError, match="a Job or a job id"):
        client.submit_handler("noop", after=["first"])


def test_a_submission_sent_again_makes_one_job(client):
    first = client.submit_handler("noop", tasks=2, submission_id="py-once")
    again = client.submit_handler("noop", tasks=2, submission_id="py-once")
    assert again.job_id == first.job_id
    assert [j["job_id"] for j in client.jobs()].count(first.job_id) == 1
    with pytest.raises(ember.DriverError, match="submitted with other settings"):
        client.submit_handler("noop", tasks=3, submission_id="py-once")


def test_jobs_executors_and_driver_errors(client):
    job = client.submit_handler("noop", tasks=5)
    assert job.wait()["succeeded"] == 5
    assert job.job_id in [j["job_id"] for j in client.jobs()]
    snapshot = client.executors()
    assert sorted(e["executor_id"] for e in snapshot["executors"]) == ["exec-1", "exec-2"]
    assert snapshot["total_cores"] == 4
    with pytest.raises(ember.DriverError, match="no job with id 987654") as raised:
        client.job(987654)
    assert raised.value.message == "no job with id 987654"


def test_a_cluster_without_a_driver(cluster):
    with ember.connect(cluster.url, cluster="nobody-here") as lonely:
        with pytest.raises(ember.NoDriver, match="no driver answers on ember.nobody-here"):
            lonely.executors()
    with pytest.raises(ValueError, match="cluster name"):
        ember.connect(cluster.url, cluster="a.b")


async def test_an_unavailable_answer_raises_unavailable(cluster):
    # A standing-by driver's answer while no driver can lead, given by hand: it carries no
    # epoch, and is taken from any driver.
    import nats

    said = "no driver of cluster standby-only can lead: nothing was done"
    nc = await nats.connect(cluster.url)
    try:
        async def answer(msg):
            await msg.respond(b'{"type":"Unavailable","message":"%s"}' % said.encode())

        await nc.subscribe("ember.standby-only.driver.api", cb=answer)
        await nc.flush()
        async with await ember.Client.connect(cluster.url, cluster="standby-only") as client:
            with pytest.raises(ember.Unavailable, match="nothing was done"):
                await client.executors()
    finally:
        await nc.close()


async def test_async_submit_map_and_events(aclient):
    events = []
    seen_end = asyncio.Event()
    job_ids = set()

    async def listen():
        async for event in aclient.events():
            events.append(event)
            if event["type"] == "JobEnd" and event["job_id"] in job_ids:
                seen_end.set()
                return

    listener = asyncio.ensure_future(listen())
    await asyncio.sleep(0.2)
    future = await aclient.submit(square, 9)
    job_ids.add(future.job_id)
    assert await future == 81
    job = await aclient.map(square, range(10), chunksize=3)
    assert await job.results() == [x * x for x in range(10)]
    await asyncio.wait_for(seen_end.wait(), 10)
    await listener
    kinds = {e["type"] for e in events if e.get("job_id") == future.job_id}
    assert {"JobStart", "TaskStart", "TaskEnd", "JobEnd"} <= kinds
    # Many calls at once.
    futures = [await aclient.submit(square, n) for n in range(20)]
    assert await asyncio.gather(*futures) == [n * n for n in range(20)]


async def test_event_history_since(aclient):
    started = time.time()
    job = await aclient.submit_handler("noop", tasks=2)
    await job.wait()
    seen = []
    async def read():
        async for event in aclient.events("job.end", since=started - 1):
            seen.append(event)
            if event["job_id"] == job.job_id:
                return
    await asyncio.wait_for(read(), 20)
    assert seen[-1]["type"] == "JobEnd" and seen[-1]["state"] == "SUCCEEDED"
