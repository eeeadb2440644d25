"""A thin blocking wrapper over the asyncio client: it runs the client's event loop on a thread
of its own, so it works in scripts, notebooks and threads alike. `Executor` is the same client
behind the standard `concurrent.futures.Executor` interface."""

from __future__ import annotations

import asyncio
import concurrent.futures as _cf
import functools
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from . import _html
from . import objects as _objects
from .client import (
    Client,
    Job,
    TaskFuture,
    _name_of,
    _unpickle_result,
)
from .cluster import default_target
from .errors import DriverError, EmberError, ResultGone
from .objects import ObjectRef

_log = logging.getLogger("ember")

# How long closing a client waits for the kills it still has to send, in seconds.
KILL_PATIENCE = 5.0


class _Loop:
    """An event loop on a daemon thread; `run` waits for a coroutine on it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=None):
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                "a blocking ember call on the client's own event loop thread would never return"
            )
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


def connect(
    url: str | list[str] | None = None, *, cluster: str | None = None, **options: Any
) -> SyncClient:
    """A blocking `SyncClient`; takes the arguments of `Client.connect` (and `web_url`, see
    `SyncClient`). With no `url`, the `LocalCluster` open in this process, else
    $EMBER_NATS_URL, else DEFAULT_URL; with no `cluster`, that LocalCluster's, else
    $EMBER_CLUSTER, else DEFAULT_CLUSTER."""
    return SyncClient(url, cluster=cluster, **options)


class SyncClient:
    """The blocking client: the methods of `Client`, each waiting for its answer. `submit`
    returns an `ember.Future`. `url` and `cluster` None are as for `connect`; `web_url` is the
    driver's web page, when known, linked from the notebook summaries."""

    def __init__(
        self,
        url: str | list[str] | None = None,
        *,
        cluster: str | None = None,
        web_url: str | None = None,
        **options: Any,
    ):
        self.url, cluster, local_web_url = default_target(url, cluster)
        self.web_url = web_url or local_web_url
        # Tasks on the loop that wait for a job's end for a future (stopped by `close`), and
        # kills sent in the background (waited for by `close`).
        self._watchers: set[asyncio.Task] = set()
        self._chores: set[_cf.Future] = set()
        self._loop = _Loop()
        try:
            self.client = self._loop.run(Client.connect(self.url, cluster=cluster, **options))
        except BaseException:
            self._loop.stop()
            raise
        # Futures are settled on a thread of their own, so their callbacks may call the client.
        self._settles: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._settle_forever, name="ember-futures", daemon=True).start()

    def _run(self, coroutine, timeout=None):
        return self._loop.run(coroutine, timeout)

    @property
    def cluster(self) -> str:
        """The cluster's name."""
        return self.client.cluster

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._loop.loop.is_closed()

    def close(self) -> None:
        """Closes the connection. Calls still pending then fail with `EmberError`."""
        if self.closed:
            return
        try:
            _cf.wait(list(self._chores), timeout=KILL_PATIENCE)
            self._run(self._close())
        finally:
            self._loop.stop()
            self._settles.put(None)

    async def _close(self):
        watchers = list(self._watchers)
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await self.client.close()
        # What a stopped watcher left running (nats-py's tasks of a read it was in, say).
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=1)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"<ember.SyncClient {_html.safe_url(self.url)} cluster={self.cluster}{state}>"

    def _repr_html_(self) -> str:
        return _html.guarded(_html.client, self)

    # --- futures --------------------------------------------------------------------------

    def _background(self, coroutine) -> _cf.Future:
        """Runs `coroutine` on the loop until it returns or `close` stops it; its outcome."""

        async def tracked():
            task = asyncio.current_task()
            self._watchers.add(task)
            try:
                return await coroutine
            finally:
                self._watchers.discard(task)

        return asyncio.run_coroutine_threadsafe(tracked(), self._loop.loop)

    def _kill_soon(self, job: Job) -> None:
        """Sends a kill of `job` from the loop, without waiting for it; errors are logged."""

        async def kill():
            try:
                await job.kill()
            except DriverError as error:
                # Most often the job ended first: nothing is left to kill.
                _log.debug("kill of job %s: %s", job.job_id, error)
            except Exception as error:
                _log.warning("could not kill job %s: %s", job.job_id, error)

        try:
            chore = asyncio.run_coroutine_threadsafe(kill(), self._loop.loop)
        except RuntimeError:  # the client is closed
            _log.warning("could not kill job %s: the client is closed", job.job_id)
            return
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)

    def _settle_forever(self):
        while True:
            step = self._settles.get()
            if step is None:
                return
            try:
                step()
            except Exception:
                _log.exception("settling an ember future failed")

    def _future(self, submitting) -> Future:
        future = Future(self, self._run(submitting))
        future._watcher = self._background(future._watch())
        return future

    # --- the client's methods ---------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Runs `fn(*args, **kwargs)` on the cluster (see `Client.submit`); its `Future`."""
        return self._future(self.client.submit(fn, *args, **kwargs))

    def submit_with(
        self,
        fn: Callable[..., Any],
        args: Iterable[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Future:
        """`submit` with the options of `Client.submit_with`; its `Future`."""
        return self._future(self.client.submit_with(fn, args, kwargs, **options))

    def map(self, fn: Callable[[Any], Any], iterable: Iterable[Any], **options: Any) -> SyncJob:
        """Runs `fn` on each item as one job (see `Client.map`); its `SyncJob`."""
        return SyncJob(self, self._run(self.client.map(fn, iterable, **options)))

    def put(self, value: Any) -> ObjectRef:
        return self._run(self.client.put(value))

    def put_bytes(self, data: bytes) -> ObjectRef:
        return self._run(self.client.put_bytes(data))

    def get(self, ref: ObjectRef | str) -> Any:
        return self._run(self.client.get(ref))

    def get_bytes(self, ref: ObjectRef | str) -> bytes:
        return self._run(self.client.get_bytes(ref))

    def submit_job(self, tasks: Iterable[dict], **options: Any) -> SyncJob:
        return SyncJob(self, self._run(self.client.submit_job(tasks, **options)))

    def submit_commands(self, argv: list[str], **options: Any) -> SyncJob:
        return SyncJob(self, self._run(self.client.submit_commands(argv, **options)))

    def submit_handler(self, name: str, arg: Any = None, **options: Any) -> SyncJob:
        return SyncJob(self, self._run(self.client.submit_handler(name, arg, **options)))

    def job(self, job_id: int) -> SyncJob:
        return SyncJob(self, self._run(self.client.job(job_id)))

    def jobs(self) -> list[dict]:
        return self._run(self.client.jobs())

    def set_limits(self, key: str, **limits: Any) -> dict:
        """See `Client.set_limits`."""
        return self._run(self.client.set_limits(key, **limits))

    def clear_limits(self, key: str) -> dict:
        """See `Client.clear_limits`."""
        return self._run(self.client.clear_limits(key))

    def limits(self) -> list[dict]:
        """See `Client.limits`."""
        return self._run(self.client.limits())

    def executors(self) -> dict:
        return self._run(self.client.executors())

    def request(self, message: dict) -> dict:
        return self._run(self.client.request(message))

    def events(self, kinds=None, *, since=None) -> Iterator[dict]:
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

    def __init__(self, owner: SyncClient, job: Job):
        self._owner = owner
        self.job = job

    def _ember_result(self):
        return self.job._ember_result()

    def __repr__(self) -> str:
        return repr(self.job)

    def _repr_html_(self) -> str:
        return _html.guarded(_html.job, self)

    @property
    def job_id(self) -> int | None:
        return self.job.job_id

    def summary(self) -> dict:
        return self._owner._run(self.job.summary())

    def wait(self, timeout: float | None = None, *, progress: bool | None = None) -> dict:
        return self._owner._run(self.job.wait(timeout, progress=progress))

    def results(self, timeout: float | None = None) -> list:
        return self._owner._run(self.job.results(timeout))

    def outcomes(self) -> list[dict]:
        return self._owner._run(self.job.outcomes())

    def kill(self) -> None:
        return self._owner._run(self.job.kill())


class Future(_cf.Future, _objects.Upstream):
    """The result of one call on the cluster (`Executor.submit`, `SyncClient.submit`): a
    `concurrent.futures.Future`, so `as_completed` and `wait` take it. It stays pending until
    the call ends, then holds the function's value, or its exception (with the remote traceback
    as `__cause__`), or `TaskError` if the task failed otherwise. In the arguments of another
    `submit` or `map` it stands for its value, read on the cluster. `job` is the call's
    `SyncJob`."""

    def __init__(self, owner: SyncClient, task_future: TaskFuture):
        super().__init__()
        self._owner = owner
        self._task_future = task_future
        self.job = SyncJob(owner, task_future.job)
        self._watcher: _cf.Future | None = None
        # Whether set_running_or_notify_cancel was called; only the settling thread calls it.
        self._claimed = False

    def _ember_result(self):
        return self.job_id, "value"

    @property
    def job_id(self) -> int:
        """The id of the call's job."""
        return self._task_future.job_id

    def __repr__(self) -> str:
        if self.cancelled():
            state = "cancelled"
        elif self.done():
            error = self.exception()
            state = "finished" if error is None else f"finished raised {type(error).__name__}"
        else:
            state = "pending"
        return f"<ember.Future of job {self.job_id} state={state}>"

    def _repr_html_(self) -> str:
        return _html.guarded(_html.future, self)

    def cancel(self) -> bool:
        """Cancels the call unless it has ended: the future is cancelled (its callbacks run,
        `wait` and `as_completed` see it) and the call's job is killed. False once the call
        has ended."""
        already = self.cancelled()
        if not super().cancel():
            return False
        if not already:
            self._owner._settles.put(self._claim)
            if self._watcher is not None:
                self._watcher.cancel()
            self._owner._kill_soon(self.job.job)
        return True

    def _claim(self) -> bool:
        """Moves the future on from PENDING, once: True when it is to be settled, False when
        it was cancelled (then `wait` and `as_completed` are told). On the settling thread."""
        if self._claimed:
            return False
        self._claimed = True
        return self.set_running_or_notify_cancel()

    def _settle(self, value=None, error=None):
        if self._claim():
            if error is None:
                self.set_result(value)
            else:
                self.set_exception(error)

    async def _watch(self):
        """Waits on the loop for the call's end and hands its outcome to the settling
        thread."""
        try:
            value = await self._task_future.result()
        except asyncio.CancelledError:
            error = EmberError(f"the client was closed before job {self.job_id} ended")
            self._owner._settles.put(functools.partial(self._settle, error=error))
            raise
        except BaseException as error:  # the task's own exception may be any
            self._owner._settles.put(functools.partial(self._settle, error=error))
        else:
            self._owner._settles.put(functools.partial(self._settle, value))


def _make_star():
    def star(fn, args):
        return fn(*args)

    return star


# `fn(*args)`, for a map over several iterables. Made inside a function, it travels by value
# (cloudpickle cannot find it by name), so the executors' Python needs no `ember`.
_star = _make_star()


class Executor(_cf.Executor):
    """A `concurrent.futures.Executor` that runs calls on an Ember cluster: a program written
    for `ProcessPoolExecutor` runs on the cluster by changing its constructor alone.

    It connects a `SyncClient` of its own (`ember.connect(url, cluster=..., **connect_options)`)
    and closes it on `shutdown`, or uses `client` and leaves it open. Each call gets
    `max_failures` attempts."""

    def __init__(
        self,
        url: str | list[str] | None = None,
        *,
        cluster: str | None = None,
        client: SyncClient | None = None,
        max_failures: int = 1,
        **connect_options: Any,
    ):
        if client is None:
            client = connect(url, cluster=cluster, **connect_options)
            self._owns_client = True
        else:
            if url is not None or connect_options:
                raise TypeError("give either a client or what to connect to, not both")
            self._owns_client = False
        self.client = client
        self.max_failures = max_failures
        # Held while a call is submitted, so that none is submitted once `shutdown` began.
        self._shutdown_lock = threading.Lock()
        self._shutdown = False
        self._closing = False
        # What has not ended yet, which `shutdown` waits for: the futures of `submit` (to
        # None), and for each `map`, what waits for its job's end (to the job).
        self._pending: dict[_cf.Future, Job | None] = {}
        self._pending_lock = threading.Lock()

    def __repr__(self) -> str:
        state = ", shut down" if self._shutdown else ""
        return f"<ember.Executor on {self.client!r}{state}>"

    def _repr_html_(self) -> str:
        return _html.guarded(_html.client, self.client)

    def _track(self, future: _cf.Future, job: Job | None = None) -> None:
        with self._pending_lock:
            self._pending[future] = job
        future.add_done_callback(self._forget)

    def _forget(self, future: _cf.Future) -> None:
        with self._pending_lock:
            self._pending.pop(future, None)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Runs `fn(*args, **kwargs)` on the cluster as a job of one task; its `Future`."""
        with self._shutdown_lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future = self.client.submit_with(fn, args, kwargs, max_failures=self.max_failures)
            self._track(future)
        return future

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """`fn` over the items of `iterables` (zipped, as `map` does), as one job of tasks of
        `chunksize` items; an iterator of the values in order, as `ProcessPoolExecutor.map`.
        Reaching an item whose call raised raises its exception; a value not there within
        `timeout` seconds of this call raises `TimeoutError` and kills the job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if len(iterables) == 1:
            function, items = fn, list(iterables[0])
        else:
            function, items = functools.partial(_star, fn), list(zip(*iterables))
        with self._shutdown_lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            job = self.client.map(
                function,
                items,
                chunksize=chunksize,
                name=_name_of(fn),
                max_failures=self.max_failures,
            ).job
            ended = self.client._background(_end_and_outcomes(job))
            self._track(ended, job)
        return self._values(job, ended, deadline)

    def _values(self, job: Job, ended: _cf.Future, deadline: float | None) -> Iterator[Any]:
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                end, outcomes = ended.result(timeout)
            except _cf.CancelledError:
                if self.client.closed:
                    raise EmberError(
                        f"the client was closed before job {job.job_id} ended"
                    ) from None
                raise
            yield from _map_values(job, end, outcomes)
        finally:
            if ended.cancel():
                self.client._kill_soon(job)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls may be submitted. `cancel_futures` cancels the calls that have not
        ended (killing their jobs; a map's iterator then raises `CancelledError`); `wait` waits
        for the rest to end. A client this executor connected is closed then (at once with
        `wait`, else once they have ended)."""
        with self._shutdown_lock:
            self._shutdown = True
            close, self._closing = self._owns_client and not self._closing, True
        with self._pending_lock:
            pending = dict(self._pending)
        if cancel_futures:
            for future, job in pending.items():
                if future.cancel() and job is not None:
                    self.client._kill_soon(job)
        if wait:
            _cf.wait(pending)
            if close:
                self.client.close()
        elif close:

            def close_when_done():
                _cf.wait(pending)
                self.client.close()

            closer = threading.Thread(target=close_when_done, name="ember-close", daemon=True)
            closer.start()


async def _end_and_outcomes(job: Job):
    """Job `job`'s end and its tasks' outcomes, once it has ended; raises `UpstreamError` if it
    did not run because a job it reads did not succeed."""
    if job.job_id is None:
        return None, []
    end = await job.client._end_of(job.job_id)
    await job._raise_upstream_failure(end)
    return end, await job.outcomes()


def _map_values(job: Job, end, outcomes: list[dict]) -> Iterator[Any]:
    """The values of a map job's tasks in order, up to the first task that has none; there,
    the job's failure (the task that failed it, rather than those killed because it did)."""
    unfinished = [o for o in outcomes if o["state"] != "FINISHED"]
    failed = [o for o in unfinished if o["state"] == "FAILED"]
    for outcome in outcomes:
        if outcome["state"] != "FINISHED":
            raise job._failure((failed or unfinished)[0], end)
        value = outcome.get("result")
        if value is None and outcome.get("error"):
            raise ResultGone(
                f"task {outcome['index']} of job {job.job_id} finished, but its result is "
                f"gone: {outcome['error']}"
            )
        yield from _unpickle_result(value)
