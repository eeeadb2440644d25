"""Cancellation that stops: a killed call is interrupted (KeyboardInterrupt in its worker), a
worker that does not stop within the grace is killed, and the attempt's core is free only once
the call has stopped."""

import hashlib
import os
import tempfile
import time
from pathlib import Path

import pytest

# The executor's grace between the interrupt and killing the worker (KILL_GRACE).
GRACE = 5.0


def sleep_long(path):
    Path(path).write_text(str(os.getpid()))
    time.sleep(1000)


def spin_in_c(path):
    Path(path).write_text(str(os.getpid()))
    # Hours of work in one C call that never looks at signals.
    hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 2**31 - 1)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def started_pid(path, limit=30):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        text = Path(path).read_text() if Path(path).exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    pytest.fail(f"the call did not start within {limit}s")


def kill_and_time_the_stop(client, fn):
    """Submits `fn`, kills its job once it runs, and returns (seconds from the kill until the
    driver counts no attempt running, the worker's pid, whether it was alive then)."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "pid")
        future = client.submit_with(fn, (path,))
        pid = started_pid(path)
        killed = time.monotonic()
        future.job.kill()
        while True:
            summary = future.job.summary()
            if summary["running"] == 0:
                return time.monotonic() - killed, pid, alive(pid), summary
            assert time.monotonic() - killed < 60, summary
            time.sleep(0.05)


def test_a_killed_call_is_interrupted_and_its_worker_kept(client):
    elapsed, pid, worker_alive, summary = kill_and_time_the_stop(client, sleep_long)
    assert summary["state"] == "KILLED"
    assert elapsed < 1.0 + 1.0, f"the call stopped {elapsed:.2f}s after the kill"
    # KeyboardInterrupt ended the call; the worker goes on and takes the next one.
    assert worker_alive
    assert client.submit(os.getpid).result(timeout=60) > 0


def test_a_call_that_ignores_the_interrupt_is_killed_after_the_grace_and_only_then_freed(client):
    elapsed, pid, worker_alive, summary = kill_and_time_the_stop(client, spin_in_c)
    assert summary["state"] == "KILLED"
    assert GRACE - 0.5 <= elapsed < GRACE + 1.0 + 1.0, f"stopped {elapsed:.2f}s after the kill"
    # Its core was given back only once the worker was gone.
    assert not worker_alive
    # A new worker takes its place.
    assert client.submit(os.getpid).result(timeout=60) not in (0, pid)
