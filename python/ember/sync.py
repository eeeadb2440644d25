"""A thin blocking wrapper over the asyncio client: it runs the client's event loop on a thread
of its own, so it works in scripts, notebooks and threads alike."""

import asyncio
import threading

from . import objects as _objects
from .client import DEFAULT_CLUSTER, DEFAULT_URL, Client


class _Loop:
    """An event loop on a daemon thread; `run` waits for a coroutine on it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=None):
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def stop(self):
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


def connect(url=DEFAULT_URL, *, cluster=DEFAULT_CLUSTER, **options):
    """A blocking `SyncClient`; takes the arguments of `Client.connect`."""
    return SyncClient(url, cluster=cluster, **options)


class SyncClient:
    """The blocking client: the methods of `Client`, each waiting for its answer."""

    def __init__(self, url=DEFAULT_URL, *, cluster=DEFAULT_CLUSTER, **options):
        self._loop = _Loop()
        try:
            self.client = self._loop.run(Client.connect(url, cluster=cluster, **options))
        except BaseException:
            self._loop.stop()
            raise

    def _run(self, coroutine, timeout=None):
        return self._loop.run(coroutine, timeout)

    def close(self):
        try:
            self._run(self.client.close())
        finally:
            self._loop.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def submit(self, fn, /, *args, **kwargs):
        return SyncFuture(self, self._run(self.client.submit(fn, *args, **kwargs)))

    def submit_with(self, fn, args=(), kwargs=None, **options):
        return SyncFuture(self, self._run(self.client.submit_with(fn, args, kwargs, **options)))

    def map(self, fn, iterable, **options):
        return SyncJob(self, self._run(self.client.map(fn, iterable, **options)))

    def put(self, value):
        return self._run(self.client.put(value))

    def put_bytes(self, data):
        return self._run(self.client.put_bytes(data))

    def get(self, ref):
        return self._run(self.client.get(ref))

    def get_bytes(self, ref):
        return self._run(self.client.get_bytes(ref))

    def submit_job(self, tasks, **options):
        return SyncJob(self, self._run(self.client.submit_job(tasks, **options)))

    def submit_commands(self, argv, **options):
        return SyncJob(self, self._run(self.client.submit_commands(argv, **options)))

    def submit_handler(self, name, arg=None, **options):
        return SyncJob(self, self._run(self.client.submit_handler(name, arg, **options)))

    def job(self, job_id):
        return SyncJob(self, self._run(self.client.job(job_id)))

    def jobs(self):
        return self._run(self.client.jobs())

    def executors(self):
        return self._run(self.client.executors())

    def request(self, message):
        return self._run(self.client.request(message))

    def events(self, kinds=None, *, since=None):
        """A blocking iterator of events (see `Client.events`)."""
        iterator = self.client.events(kinds, since=since).__aiter__()
        try:
            while True:
                try:
                    yield self._run(iterator.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(iterator.aclose())


class SyncJob(_objects.Upstream):
    """A submitted job, blocking (see `ember.Job`); in the arguments of `submit` or `map`, its
    results."""

    def __init__(self, owner, job):
        self._owner = owner
        self.job = job

    def _ember_result(self):
        return self.job._ember_result()

    def __repr__(self):
        return repr(self.job)

    @property
    def job_id(self):
        return self.job.job_id

    def summary(self):
        return self._owner._run(self.job.summary())

    def wait(self, timeout=None, *, progress=None):
        return self._owner._run(self.job.wait(timeout, progress=progress))

    def results(self, timeout=None):
        return self._owner._run(self.job.results(timeout))

    def outcomes(self):
        return self._owner._run(self.job.outcomes())

    def kill(self):
        return self._owner._run(self.job.kill())


class SyncFuture(_objects.Upstream):
    """The result of one `submit`, blocking: `future.result()`; in the arguments of `submit`
    or `map`, its value."""

    def __init__(self, owner, future):
        self._owner = owner
        self.future = future

    def _ember_result(self):
        return self.future._ember_result()

    @property
    def job(self):
        return SyncJob(self._owner, self.future.job)

    def result(self, timeout=None):
        return self._owner._run(self.future.result(timeout))

    def done(self):
        return self._owner._run(self.future.done())

    def cancel(self):
        return self._owner._run(self.future.cancel())
