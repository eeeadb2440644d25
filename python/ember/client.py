"""The asyncio client: jobs of Python functions, commands and handlers on an Ember cluster.

It speaks the wire of docs/protocol.md: JSON requests on `ember.<cluster>.driver.api`, the
driver's JobEnd events on `ember.<cluster>.events.job.end` to learn when a job has ended, and
python tasks (`{"kind": "python", "function": <b64 pickle>, "args": <b64 pickle>}`) that the
executors' warm Python workers run.
"""

import asyncio
import base64
import collections
import datetime
import json
import math
import re
import sys
import time
import uuid

import cloudpickle
import nats
import nats.errors

from . import objects as _objects
from .objects import ObjectRef
from .errors import (
    DriverError,
    EmberError,
    NoAnswer,
    NoDriver,
    RemoteError,
    RemoteTraceback,
    RequestTooLarge,
    ResultGone,
    TaskError,
    Unavailable,
    UpstreamError,
)

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_CLUSTER = "default"
# As the Rust client: how long one api request waits for its answer, in seconds.
REQUEST_TIMEOUT = 10.0

# How long a submission is sent again while no driver can take it (a standby taking over, or
# `Unavailable`), as the Rust client does.
FAILOVER_PATIENCE = 30.0
# What Ember keeps free under the server's max_payload for framing.
PAYLOAD_HEADROOM = 4096
# What a driver with a journal keeps free besides, for a job's record (driver/core/jobs.rs): a
# map laid out to fit is taken by any driver.
JOURNAL_ROOM = 1024
# How often a wait asks for the job's progress when no JobEnd event has come, in seconds.
POLL_INTERVAL = 1.0
# The states of a job that has not ended: it runs, or waits for the jobs it runs after.
_OPEN = ("RUNNING", "WAITING")
# How often the progress bar is brought up to date, in seconds.
PROGRESS_INTERVAL = 0.2
# How many ended jobs' JobEnd events are remembered for waits that start late.
ENDED_KEPT = 100_000
# With no chunksize given, a map makes about this many tasks per core of the cluster.
TASKS_PER_CORE = 4
# The driver's default max_failures, for command and handler jobs.
DEFAULT_MAX_FAILURES = 4

_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _encode(message):
    return json.dumps(message, separators=(",", ":")).encode()


def _pickle(value):
    return _b64(cloudpickle.dumps(value))


def _timeout_ms(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    ms = int(round(float(timeout) * 1000))
    if ms <= 0:
        raise ValueError(f"timeout must be positive; got {timeout!r}")
    return ms


def retry_backoff(initial, *, multiplier=2.0, max=None, jitter=0.2):
    """A job's `retry_backoff`: a failed task waits `initial` seconds (or a `timedelta`)
    before its first retry, `multiplier` times longer before each later one, at most `max`
    (by default 100 times `initial`), less up to `jitter` (0 to 1) of each wait at random."""
    backoff = {"initial_ms": _timeout_ms(initial), "multiplier": float(multiplier),
               "jitter": float(jitter)}
    if max is not None:
        backoff["max_ms"] = _timeout_ms(max)
    return backoff


def python_task(fn, args=(), kwargs=None, *, timeout=None):
    """The spec of one python task that calls `fn(*args, **kwargs)`."""
    if not callable(fn):
        raise TypeError(f"{fn!r} is not callable")
    spec = {
        "kind": "python",
        "function": _pickle(fn),
        "args": _pickle((tuple(args), dict(kwargs or {}))),
    }
    ms = _timeout_ms(timeout)
    if ms is not None:
        spec["timeout_ms"] = ms
    return spec


def command_task(argv, *, env=None, cwd=None, timeout=None, inputs=None, outputs=None):
    """The spec of one command task (`argv` runs without a shell). `inputs` maps paths in
    its directory to objects (ObjectRefs, or their hex) it finds there, read-only; `outputs`
    lists patterns of the files it leaves that go into the store, named in its result."""
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings, e.g. ['echo', 'hi']")
    spec = {"kind": "command", "argv": list(argv), "env": dict(env or {})}
    if cwd is not None:
        spec["cwd"] = str(cwd)
    if inputs:
        spec["inputs"] = {str(name): str(ref) for name, ref in inputs.items()}
    if outputs:
        spec["outputs"] = [str(pattern) for pattern in outputs]
    ms = _timeout_ms(timeout)
    if ms is not None:
        spec["timeout_ms"] = ms
    return spec


def handler_task(name, arg=None):
    """The spec of one handler task (`noop`, `sleep`, `echo`, `fail`, or a registered one)."""
    return {"kind": "handler", "name": str(name), "arg": arg}


def _read_creds(creds, user, cluster):
    """Connection options for `creds`: a NATS JWT credentials file, a (user, password) pair,
    or a password file that `ember creds --password-file` wrote (the line of `user`, by
    default `<cluster>.client`)."""
    if isinstance(creds, (tuple, list)):
        if len(creds) != 2:
            raise ValueError("creds as a pair is (user, password)")
        return {"user": str(creds[0]), "password": str(creds[1])}
    path = str(creds)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise EmberError(f"could not read the credentials file {path}: {error}") from None
    if "BEGIN NATS USER JWT" in text:
        return {"user_credentials": path}
    user = user or f"{cluster}.client"
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0] == user:
            return {"user": user, "password": parts[1].strip()}
    raise EmberError(
        f"{path} is neither a NATS credentials file nor a password file with a line for "
        f"user {user!r} (as `ember creds --password-file` writes)"
    )


class Client:
    """A connection to one Ember cluster. Make one with `await Client.connect(...)`."""

    def __init__(self, nc, cluster=DEFAULT_CLUSTER, *, owns_connection=True):
        if not _CLUSTER_NAME.match(cluster or ""):
            raise ValueError(
                f"cluster name {cluster!r} must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'"
            )
        self.nc = nc
        self.cluster = cluster
        self.prefix = f"ember.{cluster}"
        self._owns = owns_connection
        self._newest_epoch = 0
        self._ended = collections.OrderedDict()
        self._waiters = collections.defaultdict(list)
        self._watch = None
        self._watch_lock = asyncio.Lock()
        self._store = None
        # Whether a driver has answered this client: once one has, finding none is a failover.
        self._driver_seen = False

    @classmethod
    async def connect(
        cls,
        url=DEFAULT_URL,
        *,
        cluster=DEFAULT_CLUSTER,
        creds=None,
        user=None,
        password=None,
        token=None,
        **options,
    ):
        """Connects to the NATS server at `url` (a string or a list of them) for cluster
        `cluster`. `creds` is a NATS JWT credentials file, a `(user, password)` pair, or a
        password file written by `ember creds --password-file` (its `<cluster>.client` line,
        or the line of `user`). Other keyword arguments go to `nats.connect`."""
        if not _CLUSTER_NAME.match(cluster or ""):
            raise ValueError(
                f"cluster name {cluster!r} must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'"
            )
        auth = {}
        if creds is not None:
            auth = _read_creds(creds, user, cluster)
        elif user is not None:
            auth = {"user": user, "password": password or ""}
        if token is not None:
            auth["token"] = token
        servers = [url] if isinstance(url, str) else list(url)
        options.setdefault("connect_timeout", 5)
        options.setdefault("max_reconnect_attempts", 10)
        # As every Ember connection: a server that has not answered three pings 0.6 s apart is
        # left for another (nats-py's own default waits minutes on a node cut off silently).
        options.setdefault("ping_interval", 0.6)
        options.setdefault("max_outstanding_pings", 2)
        errors = []
        given_error_cb = options.pop("error_cb", None)

        async def error_cb(error):
            errors.append(error)
            if given_error_cb is not None:
                await given_error_cb(error)

        # nats-py may go on retrying a refused first connection: the whole of it is bounded.
        limit = options["connect_timeout"] * (len(servers) + 1)
        try:
            nc = await asyncio.wait_for(
                nats.connect(servers=servers, error_cb=error_cb, **auth, **options), limit
            )
        except Exception as error:  # nats-py raises a few kinds; all mean the same here
            why = errors[-1] if errors else error
            if isinstance(error, asyncio.TimeoutError) and not errors:
                why = f"no connection within {limit}s"
            raise EmberError(f"could not connect to NATS at {url}: {why!s}") from None
        return cls(nc, cluster)

    async def close(self):
        """Closes the connection (if this client made it)."""
        if self._watch is not None:
            try:
                await self._watch.unsubscribe()
            except Exception:
                pass
            self._watch = None
        if self._owns and not self.nc.is_closed:
            await self.nc.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # --- requests -------------------------------------------------------------------------

    async def request(self, message, *, timeout=REQUEST_TIMEOUT):
        """Sends one api request (a dict with "type") and returns the driver's answer; an
        `Error` answer raises `DriverError` with the driver's message."""
        subject = f"{self.prefix}.driver.api"
        payload = _encode(message)
        limit = self.nc.max_payload - PAYLOAD_HEADROOM
        if len(payload) > limit:
            raise RequestTooLarge(
                f"the request is {len(payload)} bytes, over the server's limit of {limit} "
                f"bytes; raise max_payload in nats.conf or send fewer, smaller tasks (a "
                f"larger chunksize for map)"
            )
        try:
            reply = await self.nc.request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise NoDriver(
                f"no driver answers on {subject} (is ember-driver running on this cluster?)"
            ) from None
        except nats.errors.TimeoutError:
            raise NoAnswer(f"the driver did not answer within {timeout}s") from None
        self._driver_seen = True
        try:
            answer = json.loads(reply.data)
        except ValueError as error:
            raise EmberError(f"unexpected answer from the driver: {error}") from None
        if not isinstance(answer, dict):
            raise EmberError(f"unexpected answer from the driver: {answer!r}")
        # Said by a standby, which has no epoch: it did nothing, whoever leads.
        if answer.get("type") == "Unavailable":
            raise Unavailable(answer.get("message", ""))
        epoch = self._epoch(reply)
        if epoch < self._newest_epoch:
            raise NoAnswer(f"answered by a driver of epoch {epoch}, which no longer leads")
        self._newest_epoch = epoch
        if answer.get("type") == "Error":
            raise DriverError(answer.get("message", ""))
        return answer

    @staticmethod
    def _epoch(msg):
        try:
            return int((msg.headers or {}).get("Ember-Epoch", 0))
        except (TypeError, ValueError):
            return 0

    async def _expect(self, message, answer_type):
        answer = await self.request(message)
        if answer.get("type") != answer_type:
            raise EmberError(f"unexpected answer from the driver: {answer}")
        return answer

    async def executors(self):
        """The registry and its totals (`Executors`), every page of it."""
        snapshot = await self._expect({"type": "ListExecutors"}, "Executors")
        offset = snapshot.pop("next_offset", None)
        while offset is not None:
            page = await self._expect({"type": "ListExecutors", "offset": offset}, "Executors")
            snapshot["executors"].extend(page["executors"])
            following = page.get("next_offset")
            offset = following if following is not None and following > offset else None
        return snapshot

    async def jobs(self):
        """Every job the driver holds, in submission order (`JobSummary` dicts)."""
        jobs, from_job = [], 0
        while True:
            request = {"type": "ListJobs"}
            if from_job:
                request["from_job"] = from_job
            page = await self._expect(request, "Jobs")
            jobs.extend(page["jobs"])
            following = page.get("next_job")
            if following is None or following <= from_job:
                return jobs
            from_job = following

    # --- concurrency keys ---------------------------------------------------------------------

    async def set_limits(self, key, *, max_concurrent=None, rate=None):
        """Sets the limits of concurrency key `key`, which the driver journals: at most
        `max_concurrent` of the running tasks of all jobs that name the key at once, and at
        most `rate` starts, written `"10/s"`, `"600/min"`, `"3/500ms"` or as `(count,
        seconds)`. A limit not given is lifted. Returns the key as `limits()` shows it."""
        if max_concurrent is None and rate is None:
            raise ValueError(
                "give max_concurrent, rate or both (clear_limits lifts a key's limits)"
            )
        return await self._set_limits(key, max_concurrent, rate)

    async def clear_limits(self, key):
        """Lifts every limit of concurrency key `key`: its jobs run unlimited."""
        return await self._set_limits(key, None, None)

    async def _set_limits(self, key, max_concurrent, rate):
        request = {"type": "SetKeyLimits", "key": key}
        if max_concurrent is not None:
            request["max_concurrent"] = max_concurrent
        if rate is not None:
            request["rate"] = _rate(rate)
        answer = await self._expect(request, "Keys")
        return answer["keys"][0]

    async def limits(self):
        """Every concurrency key with limits or with an open job that names it: dicts of
        `key`, `max_concurrent` and `rate` (when set), `running`, `jobs` and, under a rate,
        `started_in_window`."""
        return (await self._expect({"type": "ListKeys"}, "Keys"))["keys"]

    async def job(self, job_id):
        """A handle on job `job_id` (of any kind: its results come back as JSON)."""
        await self._expect({"type": "GetJob", "job_id": job_id}, "Job")
        return Job(self, job_id)

    # --- submitting ---------------------------------------------------------------------------

    async def submit_job(
        self,
        tasks,
        *,
        repeat=1,
        name="",
        max_failures=DEFAULT_MAX_FAILURES,
        cpus_per_task=1,
        resources=None,
        submission_id=None,
        after=(),
        after_any=(),
        retry_backoff=None,
        queue_timeout=None,
        attempt_timeout=None,
        deadline=None,
        concurrency_key=None,
        gang=False,
    ):
        """Submits a job of task specs (see `command_task`, `handler_task`, `python_task`),
        repeated `repeat` times, and returns its `Job` (whose `results` are the calls' values
        when every spec is a `python_task`). `resources` asks for custom resources
        per task, by name: `{"gpu": 1}`, as `ember submit --resource gpu=1`.

        `after` names jobs (`Job`s or ids) this one runs after: it waits (`WAITING`) until all
        have succeeded, and ends FAILED without running anything if one fails or is killed.
        `after_any` names jobs it runs after however they end. Only jobs the driver keeps.

        `retry_backoff` makes a failed task wait before it runs again, holding no cores: the
        first wait in seconds (or a `timedelta`), doubling for each later retry, or
        `ember.retry_backoff(...)` for the multiplier, the cap and the jitter.

        Three timeouts, in seconds or `timedelta`s, none by default: `queue_timeout` fails the
        job when a task has not started that long after it could run; `attempt_timeout` stops
        an attempt of any kind that runs longer (it fails, and runs again within
        `max_failures`; a task's own `timeout` takes its place); `deadline` fails the job if it
        has not ended that long after its submission, stopping its running tasks.

        `concurrency_key` counts the job's running tasks under a key: the tasks of all jobs
        that name it stay within the limits `set_limits` gives it (none set: unlimited).
        `gang=True` starts all the job's tasks together or not at all, and runs them again
        together when one fails (docs/protocol.md, Gangs).

        The submission carries `submission_id` (a new one unless given), so it is safe to send
        again: while the driver answers `Unavailable`, or no driver answers after one did, it is
        sent again for up to 30 s, and a driver that took it already answers with its job."""
        await self._ensure_watch()
        tasks = list(tasks)
        request = _job_request(
            tasks,
            repeat=repeat,
            name=name,
            max_failures=max_failures,
            cpus_per_task=cpus_per_task,
            resources=resources,
            submission_id=submission_id,
            after=after,
            after_any=after_any,
            retry_backoff=retry_backoff,
            queue_timeout=queue_timeout,
            attempt_timeout=attempt_timeout,
            deadline=deadline,
            concurrency_key=concurrency_key,
            gang=gang,
        )
        answer = await self._through_failover(lambda: self._expect(request, "JobAccepted"))
        # A job of python calls alone gives their values back, as `submit` does.
        calls = tasks and all(
            isinstance(t, dict) and t.get("kind") == "python" and not t.get("map") for t in tasks
        )
        return Job(self, answer["job_id"], python="call" if calls else None)

    def _task_room(self, **job):
        """The bytes a SubmitJob with `job`'s options leaves for its task list: the server's
        max_payload less PAYLOAD_HEADROOM and JOURNAL_ROOM, less the rest of the request."""
        rest = len(_encode(_job_request([], **job))) - len("[]")
        return self.nc.max_payload - PAYLOAD_HEADROOM - JOURNAL_ROOM - rest

    async def _through_failover(self, attempt):
        """Awaits `attempt()` again every 0.2 s for up to 30 s while the driver answers
        `Unavailable`, or no driver answers after one did (finding none at all on the first
        try, from a client no driver has answered yet, is final: the cluster may have none).
        For requests that are safe to send again."""
        deadline = time.monotonic() + FAILOVER_PATIENCE
        first = True
        while True:
            try:
                return await attempt()
            except (Unavailable, NoDriver, NoAnswer) as error:
                never = first and isinstance(error, NoDriver) and not self._driver_seen
                if never or time.monotonic() >= deadline:
                    raise
            first = False
            await asyncio.sleep(0.2)

    async def submit_commands(
        self, argv, *, tasks=1, timeout=None, env=None, cwd=None, inputs=None, outputs=None,
        **job,
    ):
        """A job of `tasks` runs of one command, as `ember submit --tasks N -- argv...` does;
        $EMBER_TASK_INDEX tells them apart. `inputs` and `outputs` as for `command_task`."""
        spec = command_task(
            argv, env=env, cwd=cwd, timeout=timeout, inputs=inputs, outputs=outputs
        )
        job.setdefault("name", argv[0])
        return await self.submit_job([spec], repeat=tasks, **job)

    async def submit_handler(self, name, arg=None, *, tasks=1, **job):
        """A job of `tasks` runs of handler `name`, as `ember submit --kind NAME` does."""
        job.setdefault("name", name)
        return await self.submit_job([handler_task(name, arg)], repeat=tasks, **job)

    # --- objects -----------------------------------------------------------------------------

    def _objects(self):
        if self._store is None:
            self._store = _objects.Store(self.nc.jetstream(), self.cluster)
        return self._store

    async def put(self, value):
        """Pickles `value` into the cluster's object store (unless the same pickle is there
        already) and returns its `ObjectRef`: pass it to `submit` or `map`, alone or inside a
        list, tuple or dict, and the task gets the value, fetched once per executor and loaded
        once per worker. Treat such values as read-only: later calls share them."""
        data, refs = _objects.dumps(value)
        if refs:
            raise TypeError(
                "a value put into the object store may not itself hold ObjectRefs or futures"
            )
        return await self._objects().put_bytes(data)

    async def put_bytes(self, data):
        """Stores raw bytes (a command task's input, say) and returns their `ObjectRef`."""
        return await self._objects().put_bytes(data)

    async def get(self, ref):
        """The value `put` stored under `ref` (an `ObjectRef` or its hex)."""
        return cloudpickle.loads(await self._objects().get_bytes(ref))

    async def get_bytes(self, ref):
        """The bytes of an object, checked against its reference."""
        return await self._objects().get_bytes(ref)

    async def _pickled(self, spec, field, pickled):
        """Sets a python task's `field` ("function" or "args") to `pickled` (a pickle and the
        references it holds, from `objects.dumps`): inline, or when it is over
        BY_REFERENCE_BYTES, as an object the task names in `<field>_object`; the references
        join the task's `objects`, the jobs whose results it reads its `upstream`."""
        data, refs = pickled
        if len(data) > _objects.BY_REFERENCE_BYTES:
            spec[field + "_object"] = (await self._objects().put_bytes(data)).ref
        else:
            spec[field] = _b64(data)
        return _objects.name_refs(spec, refs)

    async def submit(self, fn, /, *args, **kwargs):
        """Runs `fn(*args, **kwargs)` on the cluster as a job of one python task; returns a
        `TaskFuture` (await it, or its `result()`). For a timeout or a name, see
        `submit_with`."""
        return await self.submit_with(fn, args, kwargs)

    async def submit_with(
        self, fn, args=(), kwargs=None, *, timeout=None, name=None, max_failures=1,
        resources=None, retry_backoff=None, retry_on=(), no_retry_on=(), queue_timeout=None,
        deadline=None, concurrency_key=None,
    ):
        """`submit` with options: `timeout` (seconds, or a timedelta) stops the call's worker
        when it runs longer; `max_failures` is how many attempts it gets; `resources` what
        custom resources the call holds (`{"gpu": 1}`: it reads the address in
        `os.environ["EMBER_RESOURCE_GPU"]`); `retry_backoff` how a failed attempt waits
        before the next, and `queue_timeout`, `deadline` and `concurrency_key` as in
        `submit_job`.

        `retry_on` and `no_retry_on` are exception classes (or their names, `"ValueError"`,
        `"mymodule.MyError"`): a call that raises one `no_retry_on` names, or, when
        `retry_on` is given, one it does not name, fails at once without its other attempts.
        Subclasses match."""
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")
        spec = {"kind": "python"}
        ms = _timeout_ms(timeout)
        if ms is not None:
            spec["timeout_ms"] = ms
        spec.update(_retry_policy(retry_on, no_retry_on))
        await self._pickled(spec, "function", _objects.dumps(fn))
        await self._pickled(spec, "args", _objects.dumps((tuple(args), dict(kwargs or {}))))
        job = await self._submit(
            [spec],
            name=name or _name_of(fn),
            max_failures=max_failures,
            resources=resources,
            retry_backoff=retry_backoff,
            queue_timeout=queue_timeout,
            deadline=deadline,
            concurrency_key=concurrency_key,
            python="call",
        )
        return TaskFuture(job)

    async def map(
        self, fn, iterable, *, chunksize=None, timeout=None, name=None, max_failures=1,
        resources=None, retry_backoff=None, retry_on=(), no_retry_on=(), queue_timeout=None,
        deadline=None, concurrency_key=None,
    ):
        """Runs `fn` on each item of `iterable` as one job, `chunksize` items per task (by
        default about four tasks per core of the cluster); returns its `Job`, whose
        `results()` are the values in the order of the items. `timeout` bounds each task;
        `resources`, `retry_on`, `no_retry_on`, `queue_timeout`, `deadline` and
        `concurrency_key` are as in `submit_with`.

        A task's items travel inline in the request, or in the object store when their pickle
        is over 64 KiB, or, when inline they would make the request pass the server's
        max_payload, in the store in groups (`objects.MapTasks`). A map of more tasks than
        one request can name even so raises `RequestTooLarge` with the chunksize to use."""
        items = list(iterable)
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")
        if chunksize is None:
            cores = await self._total_cores()
            chunksize = max(1, math.ceil(len(items) / (TASKS_PER_CORE * max(cores, 1))))
        if not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be a positive integer; got {chunksize!r}")
        base = {"kind": "python", "map": True}
        ms = _timeout_ms(timeout)
        if ms is not None:
            base["timeout_ms"] = ms
        base.update(_retry_policy(retry_on, no_retry_on))
        # The function's pickle, inline or as an object, is made once for every task.
        pickled = _objects.dumps(fn)
        function = await self._pickled({}, "function", pickled)
        if not items:
            return Job(self, None, python="map")
        job = {"name": name or _name_of(fn), "max_failures": max_failures, "resources": resources,
               "retry_backoff": retry_backoff, "queue_timeout": queue_timeout,
               "deadline": deadline, "concurrency_key": concurrency_key}
        tasks = _objects.MapTasks(
            self._objects(), base, function, pickled[0], self._task_room(**job)
        )
        specs = await tasks.specs(items, chunksize)
        return await self._submit(specs, python="map", **job)

    async def _total_cores(self):
        answer = await self._expect({"type": "ListExecutors", "limit": 0}, "Executors")
        return int(answer.get("total_cores", 0))

    async def _submit(self, tasks, *, python, **job):
        """`submit_job`, for a job of Python functions (`python` is "call" or "map"). The
        jobs whose results the tasks read (futures in their arguments) are jobs it runs
        after."""
        upstream = []
        for spec in tasks:
            upstream += [j for j in spec.get("upstream", ()) if j not in upstream]
        submitted = await self.submit_job(tasks, after=upstream, **job)
        submitted.python = python
        submitted.upstream = upstream
        return submitted

    # --- job ends -----------------------------------------------------------------------------

    async def _ensure_watch(self):
        """Subscribes to JobEnd events once, before the first submission, so no end is
        missed."""
        if self._watch is not None:
            return
        async with self._watch_lock:
            if self._watch is None:
                self._watch = await self.nc.subscribe(
                    f"{self.prefix}.events.job.end", cb=self._on_job_end
                )
                await self.nc.flush()

    async def _on_job_end(self, msg):
        if self._epoch(msg) < self._newest_epoch:
            return
        try:
            event = json.loads(msg.data)
            job_id = event["job_id"]
        except (ValueError, KeyError, TypeError):
            return
        self._ended[job_id] = event
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        for waiter in self._waiters.pop(job_id, []):
            if not waiter.done():
                waiter.set_result(event)

    async def _end_of(self, job_id, timeout=None):
        """Waits for job `job_id` to end; its JobEnd event, or a summary of the same shape."""
        await self._ensure_watch()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if job_id in self._ended:
                return self._ended[job_id]
            waiter = loop.create_future()
            self._waiters[job_id].append(waiter)
            wait = POLL_INTERVAL
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    raise asyncio.TimeoutError(f"job {job_id} has not ended within {timeout}s")
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), wait)
            except asyncio.TimeoutError:
                pass
            finally:
                waiters = self._waiters.get(job_id)
                if waiters and waiter in waiters:
                    waiters.remove(waiter)
                    if not waiters:
                        del self._waiters[job_id]
            # No event yet: ask (an event may have been lost, or a driver took over), through a
            # failover as any safe request.
            request = {"type": "GetJob", "job_id": job_id}
            answer = await self._through_failover(lambda: self._expect(request, "Job"))
            summary = answer["job"]
            if summary["state"] not in _OPEN:
                return summary

    # --- events ---------------------------------------------------------------------------------

    async def events(self, kinds=None, *, since=None):
        """The driver's events as dicts, as they come: every kind, or those of `kinds`
        (subject suffixes such as "job.end", "task.start"). With `since` (a datetime, a
        timedelta before now, or seconds since the epoch) they come from the event history
        first, from that time on, then live: this needs a driver with a journal."""
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if since is not None:
            async for event in self._history(kinds, since):
                yield event
            return
        queue = asyncio.Queue()
        subjects = [f"{self.prefix}.events.{kind}" for kind in kinds] if kinds else [
            f"{self.prefix}.events.>"
        ]
        subscriptions = []
        try:
            for subject in subjects:
                subscriptions.append(await self.nc.subscribe(subject))
            await self.nc.flush()

            async def pump(subscription):
                async for msg in subscription.messages:
                    if self._epoch(msg) >= self._newest_epoch:
                        await queue.put(msg)

            pumps = [asyncio.ensure_future(pump(s)) for s in subscriptions]
            try:
                while True:
                    msg = await queue.get()
                    try:
                        yield json.loads(msg.data)
                    except ValueError:
                        continue
            finally:
                for task in pumps:
                    task.cancel()
        finally:
            for subscription in subscriptions:
                try:
                    await subscription.unsubscribe()
                except Exception:
                    pass

    async def _history(self, kinds, since):
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        if isinstance(since, datetime.timedelta):
            since = datetime.datetime.now(datetime.timezone.utc) - since
        elif isinstance(since, (int, float)):
            since = datetime.datetime.fromtimestamp(since, datetime.timezone.utc)
        if since.tzinfo is None:
            since = since.replace(tzinfo=datetime.timezone.utc)
        start = since.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        stream = f"EMBER_{self.cluster}_EVENTS"
        subject = f"{self.prefix}.events.>"
        wanted = None if not kinds else {f"{self.prefix}.events.{kind}" for kind in kinds}
        js = self.nc.jetstream()
        try:
            subscription = await js.pull_subscribe(
                subject,
                stream=stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_TIME,
                    opt_start_time=start,
                    ack_policy=AckPolicy.NONE,
                ),
            )
        except Exception as error:
            raise EmberError(
                f"could not read the event history (stream {stream}): {error!r}; it is kept "
                f"only by a driver with a journal"
            ) from None
        try:
            while True:
                try:
                    messages = await subscription.fetch(256, timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                for msg in messages:
                    if wanted is not None and msg.subject not in wanted:
                        continue
                    try:
                        yield json.loads(msg.data)
                    except ValueError:
                        continue
        finally:
            try:
                await subscription.unsubscribe()
            except Exception:
                pass


# The reason of a job the driver failed because a job it runs after did not succeed.
_UPSTREAM_FAILED = re.compile(r"^job (\d+), which this job runs after, ([A-Z]+)")


def _job_request(
    tasks,
    *,
    repeat=1,
    name="",
    max_failures=DEFAULT_MAX_FAILURES,
    cpus_per_task=1,
    resources=None,
    submission_id=None,
    after=(),
    after_any=(),
    retry_backoff=None,
    queue_timeout=None,
    attempt_timeout=None,
    deadline=None,
    concurrency_key=None,
    gang=False,
):
    """A SubmitJob request (docs/protocol.md)."""
    request = {
        "type": "SubmitJob",
        "name": name or "",
        "tasks": list(tasks),
        "repeat": repeat,
        "max_failures": max_failures,
        "cpus_per_task": cpus_per_task,
        "submission_id": submission_id or uuid.uuid4().hex,
    }
    if resources:
        request["resources"] = dict(resources)
    if retry_backoff is not None:
        request["retry_backoff"] = (
            dict(retry_backoff) if isinstance(retry_backoff, dict)
            else {"initial_ms": _timeout_ms(retry_backoff)}
        )
    timeouts = (("queue_timeout_ms", queue_timeout), ("attempt_timeout_ms", attempt_timeout),
                ("deadline_ms", deadline))
    for key, value in timeouts:
        if value is not None:
            request[key] = _timeout_ms(value)
    if concurrency_key is not None:
        request["concurrency_key"] = concurrency_key
    if gang:
        request["gang"] = True
    for key, jobs in (("after", after), ("after_any", after_any)):
        if jobs:
            request[key] = [_job_id(job) for job in jobs]
    return request


_RATE_UNITS = {"ms": 1, "s": 1000, "sec": 1000, "second": 1000, "m": 60_000, "min": 60_000,
               "minute": 60_000, "h": 3_600_000, "hour": 3_600_000, "d": 86_400_000,
               "day": 86_400_000}


def _rate(rate):
    """A key's rate on the wire, `{"count": N, "per_ms": MS}`, from `"10/s"`, `"3/500ms"`
    or `(count, seconds)` (seconds may be a timedelta). The driver checks the bounds."""
    if isinstance(rate, str):
        count, slash, per = rate.partition("/")
        per = per.strip()
        number = per.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = per[len(number):]
        try:
            if not slash or unit not in _RATE_UNITS:
                raise ValueError
            per_ms = round(float(number or 1) * _RATE_UNITS[unit])
            return {"count": int(count), "per_ms": per_ms}
        except ValueError:
            raise ValueError(
                f"{rate!r} is not a rate: write e.g. '10/s', '600/min' or '3/500ms'"
            ) from None
    try:
        count, period = rate
    except (TypeError, ValueError):
        raise TypeError(f"a rate is 'COUNT/PERIOD' or (count, seconds); got {rate!r}") from None
    return {"count": int(count), "per_ms": _timeout_ms(period)}


def _exception_names(classes, what):
    """The names a python task's spec gives exception classes: `module.Class` (`ValueError`
    for a built-in), from classes or names, one or a sequence of them."""
    if isinstance(classes, (type, str)):
        classes = (classes,)
    names = []
    for cls in classes:
        if isinstance(cls, str) and cls:
            names.append(cls)
        elif isinstance(cls, type) and issubclass(cls, BaseException):
            module = cls.__module__
            names.append(cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}")
        else:
            raise TypeError(f"{what} takes exception classes or their names; got {cls!r}")
    return names


def _retry_policy(retry_on, no_retry_on):
    """A python task spec's `retry_on` and `no_retry_on`, those given."""
    policy = {}
    for key, classes in (("retry_on", retry_on), ("no_retry_on", no_retry_on)):
        names = _exception_names(classes or (), key)
        if names:
            policy[key] = names
    return policy


def _job_id(job):
    """The id of `job`: a `Job`, or an id."""
    job_id = getattr(job, "job_id", job)
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 0:
        raise TypeError(f"a job to run after is a Job or a job id; got {job!r}")
    return job_id


def _name_of(fn):
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "python"


class Job(_objects.Upstream):
    """A submitted job. `python` is "call" or "map" for jobs of Python functions, whose
    results are unpickled; other jobs' results are the tasks' JSON results. In the arguments
    of `submit` or `map` a job stands for its results, in order (as `results()` gives them):
    the task runs after the job, and fails with `UpstreamError` if the job does not succeed.
    `upstream` are the jobs whose results its own tasks read."""

    def __init__(self, client, job_id, *, python=None):
        self.client = client
        self.job_id = job_id
        self.python = python
        self.upstream = []

    def _ember_result(self):
        return self.job_id, self.python or "json"

    def __repr__(self):
        return f"<ember.Job {self.job_id}>"

    async def summary(self):
        """The job's `JobSummary` now."""
        if self.job_id is None:
            return _empty_summary()
        answer = await self.client._expect({"type": "GetJob", "job_id": self.job_id}, "Job")
        return answer["job"]

    async def wait(self, timeout=None, *, progress=None):
        """Waits for the job to end and returns its `JobSummary` (whatever its state). With a
        terminal on stderr, in a Jupyter notebook (a widget there), or with `progress=True`, a
        tqdm bar shows the tasks done."""
        if self.job_id is None:
            return _empty_summary()
        if progress is None:
            progress = _shows_progress()
        if progress:
            await self._wait_with_bar(timeout)
        else:
            await self.client._end_of(self.job_id, timeout)
        return await self.summary()

    async def _wait_with_bar(self, timeout):
        tqdm = _tqdm()

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        summary = await self.summary()
        with tqdm(total=summary["tasks"], desc=f"job {self.job_id}", unit="task") as bar:
            while True:
                done = summary["succeeded"] + summary["failed"] + summary["killed"]
                bar.update(done - bar.n)
                if summary["state"] not in _OPEN:
                    return
                wait = PROGRESS_INTERVAL
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        raise asyncio.TimeoutError(
                            f"job {self.job_id} has not ended within {timeout}s"
                        )
                try:
                    await self.client._end_of(self.job_id, wait)
                except asyncio.TimeoutError:
                    pass
                summary = await self.summary()

    async def kill(self):
        """Kills the job: waiting tasks are dropped and running ones stopped. A killed job
        answers a kill as the kill did, so it is sent again through a failover as
        `submit_job` is."""
        if self.job_id is not None:
            request = {"type": "KillJob", "job_id": self.job_id}
            await self.client._through_failover(lambda: self.client._expect(request, "JobKilled"))

    async def outcomes(self):
        """Every task's `TaskOutcome` now, in index order; a result too large for one message
        is read from the object store into its "result"."""
        if self.job_id is None:
            return []
        outcomes, offset = [], 0
        while offset is not None:
            page = await self.client._expect(
                {"type": "GetResults", "job_id": self.job_id, "offset": offset, "limit": 1000},
                "Results",
            )
            for outcome in page["results"]:
                if outcome.get("result_object"):
                    outcome["result"] = await self._result_object(outcome)
                outcomes.append(outcome)
            following = page.get("next_offset")
            offset = following if following is not None and following > offset else None
        return outcomes

    async def _result_object(self, outcome):
        ref = outcome["result_object"]["object"]
        return json.loads(await self.client._objects().get_bytes(ref))

    async def results(self, timeout=None):
        """Waits for the job's end and returns its results in task order: for a map, one
        value per item, in the order of the items. A failed task raises: its Python exception
        (with the remote traceback as its `__cause__`), or `TaskError`."""
        if self.job_id is None:
            return []
        end = await self.client._end_of(self.job_id, timeout)
        await self._raise_upstream_failure(end)
        outcomes = await self.outcomes()
        unfinished = [o for o in outcomes if o["state"] != "FINISHED"]
        if unfinished:
            # The task that failed the job, rather than the ones dropped because it did.
            failed = [o for o in unfinished if o["state"] == "FAILED"]
            raise self._failure((failed or unfinished)[0], end)
        results = []
        for outcome in outcomes:
            value = outcome.get("result")
            if value is None and self.python is not None and outcome.get("error"):
                # Finished, but its result is no longer kept (the results bucket's limits).
                raise ResultGone(
                    f"task {outcome['index']} of job {self.job_id} finished, but its result "
                    f"is gone: {outcome['error']}"
                )
            if self.python is None:
                results.append(value)
            elif self.python == "map":
                results.extend(_unpickle_result(value))
            else:
                results.append(_unpickle_result(value))
        return results

    async def _raise_upstream_failure(self, end):
        """Raises `UpstreamError` if the job ended FAILED because a job it runs after did
        not succeed (the driver then fails it without running it, and says so in its reason),
        with that job's own error as its cause: the remote exception, or that job's own
        `UpstreamError` further up."""
        if not isinstance(end, dict) or end.get("state") != "FAILED":
            return
        found = _UPSTREAM_FAILED.match(end.get("reason") or "")
        if found is None:
            return
        job_id = int(found.group(1))
        # The error of a job of any kind: a Python task's carries its traceback.
        upstream = Job(self.client, job_id, python="call")
        try:
            await upstream.results()
            cause = TaskError(f"job {job_id} did not succeed", job_id=job_id)
        except Exception as error:  # its exception, unpickled, or an EmberError
            cause = error
        what = "reads" if job_id in self.upstream else "runs after"
        raise UpstreamError(
            f"job {self.job_id} did not run: job {job_id}, whose results it {what}, "
            f"ended {found.group(2)}",
            job_id=self.job_id,
            upstream=job_id,
            state="FAILED",
        ) from cause

    def _failure(self, outcome, end):
        where = {"job_id": self.job_id, "index": outcome["index"], "state": outcome["state"]}
        error = outcome.get("error")
        detail = outcome.get("result")
        if self.python is not None and isinstance(detail, dict) and "traceback" in detail:
            remote = detail.get("traceback") or ""
            pickled = detail.get("exception")
            if pickled and not detail.get("unimportable"):
                try:
                    exception = cloudpickle.loads(base64.b64decode(pickled))
                except Exception:
                    exception = None
                if isinstance(exception, BaseException):
                    exception.__cause__ = RemoteTraceback(remote)
                    try:
                        exception.remote_traceback = remote
                    except Exception:
                        pass
                    return exception
            return RemoteError(
                detail.get("error") or error or "the task failed",
                type_name=detail.get("type") or "Exception",
                remote_traceback=remote,
                **where,
            )
        if error is None:
            end = end if isinstance(end, dict) else {}
            error = (
                f"task {outcome['index']} of job {self.job_id} did not finish "
                f"({outcome['state']}): the job ended {end.get('state', 'early')}"
            )
            if end.get("reason"):
                error += f" ({end['reason']})"
        return TaskError(error, **where)


def _shows_progress():
    """Whether a wait shows a bar unless told: with a terminal on stderr, or in a notebook's
    kernel."""
    try:
        if sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False
    return "ipykernel" in sys.modules


def _tqdm():
    """tqdm's bar for where it shows: a widget in Jupyter (text there without ipywidgets), text
    in a terminal. tqdm's warnings on the choice (experimental; no ipywidgets) are not shown."""
    import warnings

    try:
        from tqdm import TqdmWarning  # TqdmExperimentalWarning is one

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=TqdmWarning)
            from tqdm.auto import tqdm
    except ImportError:  # a tqdm older than tqdm.auto
        from tqdm import tqdm
    return tqdm


def _unpickle_result(value):
    if not isinstance(value, dict) or "pickle" not in value:
        raise EmberError(f"a python task's result should be {{'pickle': ...}}; got {value!r}")
    return cloudpickle.loads(base64.b64decode(value["pickle"]))


def _empty_summary():
    return {
        "job_id": None,
        "name": "",
        "state": "SUCCEEDED",
        "tasks": 0,
        "succeeded": 0,
        "failed": 0,
        "killed": 0,
        "running": 0,
        "submitted_at_ms": 0,
        "ended_at_ms": None,
        "reason": None,
    }


class TaskFuture(_objects.Upstream):
    """The result of one `submit`: `await future` or `await future.result()`. In the
    arguments of another `submit` or `map` it stands for its value: that task runs once this
    one has succeeded, on the value read from the cluster (never through the client), and
    fails with `UpstreamError` if this one fails."""

    def __init__(self, job):
        self.job = job

    def _ember_result(self):
        return self.job.job_id, "value"

    def __repr__(self):
        return f"<ember.TaskFuture of job {self.job.job_id}>"

    @property
    def job_id(self):
        return self.job.job_id

    async def result(self, timeout=None):
        """The function's return value; its exception (with the remote traceback) if it
        raised; `TaskError` if the task failed otherwise (a timeout, a dead worker, a kill)."""
        (value,) = await self.job.results(timeout)
        return value

    async def done(self):
        """Whether the call has ended."""
        return (await self.job.summary())["state"] not in _OPEN

    async def cancel(self):
        """Kills the call's job."""
        await self.job.kill()

    def __await__(self):
        return self.result().__await__()
