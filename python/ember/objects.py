"""The cluster's object store from Python: values put once and passed to tasks by reference.

An object is named by the SHA-256 of its bytes (docs/protocol.md, "Objects"). `Client.put(value)`
pickles a value into the store and returns an `ObjectRef`; passed to `submit` or `map` (at the
top level or inside lists, tuples and dicts), the reference travels in the task's pickle as a
persistent id, the executor fetches the object once, and the worker loads it once and hands the
value to every call that names it. Such values are shared: treat them as read-only, as Spark's
broadcast values are.
"""

import asyncio
import base64
import datetime
import hashlib
import io
import json
import math
import os
import pickle
import re
import stat
import uuid

import cloudpickle
import nats.js.errors

from .errors import EmberError, RequestTooLarge

# The size of an object's chunks, as the Object Store's own default.
CHUNK_BYTES = 128 * 1024
# How many chunks a put has sent whose acknowledgements it has not read yet.
CHUNKS_IN_FLIGHT = 32
# A function or arguments whose pickle is larger than this go into the store, and the task
# carries a reference instead.
BY_REFERENCE_BYTES = 64 * 1024
# A map's chunks that go into the store together, because inline they would make the request
# pass max_payload, make objects of up to about this size (`MapTasks`). Each executor fetches
# every group that holds one of its tasks, and each worker keeps a few groups loaded: a few MiB
# keeps both small, while the cost of an object (a lookup by the driver at submit, a fetch by
# each executor) is paid once for some 64 chunks or more, each being at most 64 KiB.
ITEM_GROUP_BYTES = 4 * 2**20
# JetStream's error code for a publish whose expected last sequence did not hold.
_WRONG_LAST_SEQUENCE = 10071
# ... and for a stream that does not exist.
_STREAM_NOT_FOUND = 10059

_HEX = re.compile(r"^[0-9a-f]{64}$")


class ObjectRef:
    """A reference to an object in the cluster's store: the SHA-256 of its bytes. In a task's
    arguments it stands for the value it holds."""

    __slots__ = ("ref", "size")

    def __init__(self, ref, size=None):
        ref = str(ref).strip().lower()
        if not _HEX.match(ref):
            raise ValueError(f"{ref!r} is not an object reference (64 hex digits)")
        self.ref = ref
        self.size = size

    def __repr__(self):
        size = "" if self.size is None else f", {self.size} bytes"
        return f"ObjectRef({self.ref[:12]}…{size})"

    def __str__(self):
        return self.ref

    def __eq__(self, other):
        return isinstance(other, ObjectRef) and other.ref == self.ref

    def __hash__(self):
        return hash(self.ref)


class Upstream:
    """What stands in a task's arguments for the results of another job (a `TaskFuture`, a
    `Job`): `_ember_result()` says which job, and what value its results make ("value": the
    one result of a call; "call" or "map": the unpickled results, a map's flattened; "json":
    the JSON results of a job of other tasks)."""

    __slots__ = ()

    def _ember_result(self):
        raise NotImplementedError


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with every ObjectRef and Upstream written as a persistent id that the
    worker resolves, and what it wrote counted: an object's reference (hex), or an upstream
    job's id."""

    def __init__(self, file):
        super().__init__(file)
        self.refs = []

    def persistent_id(self, obj):
        if not isinstance(obj, (ObjectRef, Upstream)):
            return None
        if isinstance(obj, ObjectRef):
            named, pid = obj.ref, ("ember-object", obj.ref)
        else:
            job_id, shape = obj._ember_result()
            if job_id is None:  # an empty map: its results are an empty list
                return ("ember-result", None, "map")
            named, pid = job_id, ("ember-result", job_id, shape)
        if named not in self.refs:
            self.refs.append(named)
        return pid


def name_refs(spec, refs):
    """Adds `refs` (from `dumps`) to a python task's spec: objects to its `objects`, upstream
    jobs to its `upstream`."""
    for key, kind in (("objects", str), ("upstream", int)):
        named = list(spec.get(key, ()))
        named += [ref for ref in refs if isinstance(ref, kind) and ref not in named]
        if named:
            spec[key] = named
        else:
            spec.pop(key, None)
    return spec


def dumps(value):
    """The pickle of `value`, and what it names: the references of the ObjectRefs in it
    (hex strings) and the ids of the jobs whose results it reads (ints)."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer)
    pickler.dump(value)
    return buffer.getvalue(), pickler.refs


class _Item:
    """Stands for one chunk of a group of a map's items in the pickle that names it."""

    __slots__ = ("group", "position")

    def __init__(self, group, position):
        self.group = group
        self.position = position


class _ItemPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Item):
            return ("ember-item", obj.group, obj.position)
        return None


def item_pickle(group, position):
    """A task's arguments that are the `position`-th chunk of the group object `group` (its
    hex): nothing but the persistent id ("ember-item", group, position), some 100 bytes."""
    buffer = io.BytesIO()
    _ItemPickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(_Item(group, position))
    return buffer.getvalue()


# How many bytes the host's shared objects keep before the oldest go, as the executors' own.
HOST_BYTES = 4 * 2**30


def _host_dir(cluster):
    """Where the processes of this host share the cluster's objects (EMBER_HOST_OBJECTS, `off`
    for nowhere; by default <temp dir>/ember-<cluster>-objects, as the executors'), or None."""
    setting = os.environ.get("EMBER_HOST_OBJECTS")
    if setting is not None and setting.strip() in ("off", ""):
        return None
    return setting or os.path.join(os.environ.get("TMPDIR") or "/tmp", f"ember-{cluster}-objects")


def _leave_on_host(host, ref, data):
    """Leaves `data`, whose SHA-256 is `ref`, for the executors of this host (see the
    executor's --host-objects) in `host`, made if missing, and used only if it is a directory of
    this user's that only it may write: written beside, then renamed into place; the oldest
    files go past HOST_BYTES. Sharing saves fetches: if it fails, the executors fetch."""
    if host is None or os.path.exists(os.path.join(host, ref)):
        return
    partial = os.path.join(host, f".part-{uuid.uuid4().hex}")
    try:
        os.makedirs(host, mode=0o700, exist_ok=True)
        info = os.lstat(host)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444), "wb") as file:
            file.write(data)
        os.rename(partial, os.path.join(host, ref))
        files = []
        for entry in os.scandir(host):
            if len(entry.name) == 64 and entry.is_file():
                files.append((entry.stat().st_mtime, entry.stat().st_size, entry.path))
        used = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if used <= HOST_BYTES:
                break
            os.remove(path)
            used -= size
    except OSError:
        try:
            os.remove(partial)
        except OSError:
            pass


class Store:
    """The object store of one cluster, over a JetStream context."""

    def __init__(self, js, cluster):
        self.js = js
        self.bucket = f"EMBER_{cluster}_OBJECTS"
        self.stream = f"OBJ_{self.bucket}"
        self.host = _host_dir(cluster)

    def _meta_subject(self, ref):
        name = base64.urlsafe_b64encode(ref.encode()).decode()
        return f"$O.{self.bucket}.M.{name}"

    async def _metadata(self, ref):
        """The metadata stored for `ref` and its sequence, or None."""
        try:
            message = await self.js.get_last_msg(self.stream, self._meta_subject(ref))
        except nats.js.errors.NotFoundError as error:
            if getattr(error, "err_code", None) == _STREAM_NOT_FOUND:
                raise self._no_store() from error
            return None
        return json.loads(message.data), message.seq

    def _no_store(self):
        return EmberError(
            f"the object store {self.bucket} does not exist: a driver with a journal makes it "
            f"when it starts (is one running on this cluster, with JetStream?)"
        )

    async def stat(self, ref):
        """The object's metadata ({"size", "chunks", "mtime", ...}), or None if it is not
        there."""
        found = await self._metadata(str(ref))
        if found is None or found[0].get("deleted"):
            return None
        return found[0]

    async def put_bytes(self, data):
        """Stores `data` unless the store holds it; its ObjectRef."""
        data = bytes(data)
        ref = hashlib.sha256(data).hexdigest()
        _leave_on_host(self.host, ref, data)
        found = await self._metadata(ref)
        if found is not None and not found[0].get("deleted"):
            return ObjectRef(ref, len(data))
        last = found[1] if found is not None else 0
        nuid = uuid.uuid4().hex
        chunk_subject = f"$O.{self.bucket}.C.{nuid}"
        chunks = 0
        pending = []
        try:
            for start in range(0, len(data), CHUNK_BYTES):
                chunk = data[start : start + CHUNK_BYTES]
                pending.append(asyncio.ensure_future(self.js.publish(chunk_subject, chunk)))
                chunks += 1
                if len(pending) >= CHUNKS_IN_FLIGHT:
                    await pending.pop(0)
            await asyncio.gather(*pending)
            meta = {
                "name": ref,
                "bucket": self.bucket,
                "nuid": nuid,
                "size": len(data),
                "chunks": chunks,
                "mtime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "digest": "SHA-256="
                + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode(),
                "options": {"max_chunk_size": CHUNK_BYTES},
            }
            headers = {"Nats-Rollup": "sub", "Nats-Expected-Last-Subject-Sequence": str(last)}
            await self.js.publish(
                self._meta_subject(ref), json.dumps(meta).encode(), headers=headers
            )
        except nats.js.errors.APIError as error:
            await self._abandon(pending, chunk_subject)
            if error.err_code == _WRONG_LAST_SEQUENCE:
                # Another writer's metadata came first: the object is there.
                return ObjectRef(ref, len(data))
            if "maximum bytes" in str(error):
                raise EmberError(
                    "the object store is full (the driver's --objects-max-bytes); delete "
                    "objects no job needs, or raise the limit"
                ) from error
            raise
        except BaseException:
            await self._abandon(pending, chunk_subject)
            raise
        return ObjectRef(ref, len(data))

    async def _abandon(self, pending, chunk_subject):
        """A put given up: the chunk publishes still waiting are cancelled, and the chunks sent
        purged."""
        for publish in pending:
            publish.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._purge(chunk_subject)

    async def _purge(self, chunk_subject):
        try:
            await self.js.purge_stream(self.stream, subject=chunk_subject)
        except Exception:  # a user without the right: left for the driver
            pass

    async def get_bytes(self, ref):
        """The object's bytes, checked against its name."""
        ref = str(ref)
        try:
            store = await self.js.object_store(self.bucket)
            result = await store.get(ref)
        except nats.js.errors.NotFoundError as error:
            raise EmberError(f"object {ref} not found: put it again") from error
        data = result.data
        got = hashlib.sha256(data).hexdigest()
        if got != ref:
            raise EmberError(
                f"object {ref} read back as {got}: its stored bytes do not match its name"
            )
        return data


# A reference's size in the request: a layout is measured before anything is put.
_PLACEHOLDER = "0" * 64


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _encoded_size(value):
    """The bytes `value` takes in a request, encoded as `Client.request` encodes it."""
    return len(json.dumps(value, separators=(",", ":")))


class MapTasks:
    """The python task specs of one map, one chunk of items each, laid out to fit in one
    SubmitJob request.

    A chunk's pickle goes inline in its task's `args`, or into the store by itself when it is
    over BY_REFERENCE_BYTES (`args_object`). When the task list would still take more than
    `room` bytes of the request, the function goes into the store (when its reference is the
    smaller), and then so do the chunks that take less room named than inline: in groups of
    about ITEM_GROUP_BYTES, each an object holding the list of its chunks' pickles, each such
    task's `args` the pickle of the persistent id ("ember-item", group, position) and its
    `objects` naming the group. A group holds pickles rather than values so that a worker
    unpickles its own chunk only, with the objects its own task names, and each attempt gets
    a fresh copy, as inline args give. A map of too many tasks even so is refused before
    anything is put, with a chunksize that would fit.
    """

    def __init__(self, store, base, function, function_data, room):
        self.store = store
        # The fields of every spec (kind, map, timeout_ms); the function's, as
        # `Client._pickled` made them, and its pickle.
        self.base = base
        self.function = function
        self.function_data = function_data
        self.room = room

    async def specs(self, items, chunksize):
        """The specs of the tasks of `items`, `chunksize` of them each."""
        count = math.ceil(len(items) / chunksize)
        function = self._smallest_function()
        least = _encoded_size(self._spec(function, {"args": ""}, [])) + 1
        if count * least + 1 > self.room:
            raise self._too_many(len(items), chunksize, self._grouped_cost(function, count))
        entries = []
        for start in range(0, len(items), chunksize):
            data, refs = dumps(items[start : start + chunksize])
            if len(data) > BY_REFERENCE_BYTES:
                entries.append(("args_object", (await self.store.put_bytes(data)).ref, refs))
            else:
                entries.append(("args", data, refs))
        if self._fits(entries, self.function):
            return self._specs(entries, self.function)
        if function is not self.function and self._fits(entries, function):
            return self._specs(entries, await self._put_function(function))
        entries, groups = self._grouped(entries, function)
        size = self._size(self._specs(entries, function))
        if size > self.room:
            raise self._too_many(len(items), chunksize, math.ceil((size - 1) / count))
        function = await self._put_function(function)
        refs = []
        for group in groups:
            data = pickle.dumps(group, protocol=cloudpickle.DEFAULT_PROTOCOL)
            refs.append((await self.store.put_bytes(data)).ref)
        return self._specs(entries, function, refs)

    def _smallest_function(self):
        """The function's fields with the function in the store (its reference a placeholder
        until it is put) if that takes less room; else as they are."""
        if "function" not in self.function:
            return self.function
        named = {key: value for key, value in self.function.items() if key != "function"}
        named["function_object"] = _PLACEHOLDER
        return min(self.function, named, key=_encoded_size)

    async def _put_function(self, function):
        if function.get("function_object") != _PLACEHOLDER:
            return function
        ref = (await self.store.put_bytes(self.function_data)).ref
        return {**function, "function_object": ref}

    def _grouped(self, entries, function):
        """`entries` with the inline chunks that take less room named than inline moved into
        groups (in task order, so that neighbouring tasks share one), and the groups, each a
        list of chunk pickles."""
        moved, groups, group, size = [], [], [], 0
        for entry in entries:
            form, data, refs = entry
            if form == "args" and self._smaller_named(function, data, refs, len(entries)):
                if group and size + len(data) > ITEM_GROUP_BYTES:
                    groups.append(group)
                    group, size = [], 0
                entry = ("item", (len(groups), len(group)), refs)
                group.append(data)
                size += len(data)
            moved.append(entry)
        if group:
            groups.append(group)
        return moved, groups

    def _smaller_named(self, function, data, refs, position):
        """Whether a task takes less room with its chunk `data` in a group (at `position` at
        most) than inline."""
        named = self._specs([("item", (0, position), refs)], function)[0]
        inline = self._spec(function, {"args": _b64(data)}, refs)
        return _encoded_size(named) < _encoded_size(inline)

    def _grouped_cost(self, function, count):
        """The most room a task takes with its chunk in a group."""
        spec = self._specs([("item", (0, count - 1), [])], function)[0]
        return _encoded_size(spec) + 1

    def _spec(self, function, args, refs):
        """One task's spec: `args` its args field, `refs` the objects its pickles name."""
        return name_refs({**self.base, **function, **args}, refs)

    def _specs(self, entries, function, groups=None):
        """The specs of `entries`, each ("args", pickle, refs), ("args_object", ref, refs) or
        ("item", (group, position), refs); with no `groups` yet, their references are
        placeholders."""
        specs = []
        for form, value, refs in entries:
            if form == "item":
                group, position = value
                group = _PLACEHOLDER if groups is None else groups[group]
                args, refs = {"args": _b64(item_pickle(group, position))}, refs + [group]
            elif form == "args":
                args = {"args": _b64(value)}
            else:
                args = {"args_object": value}
            specs.append(self._spec(function, args, refs))
        return specs

    def _fits(self, entries, function):
        return self._size(self._specs(entries, function)) <= self.room

    @staticmethod
    def _size(specs):
        """The bytes of a task list of `specs` in the request."""
        return sum(_encoded_size(spec) for spec in specs) + len(specs) + 1

    def _too_many(self, items, chunksize, per_task):
        count = math.ceil(items / chunksize)
        fit = (self.room - 1) // per_task
        if fit < 1:
            return RequestTooLarge(
                f"one task of this map takes {per_task} bytes of the request, more than the "
                f"{self.room} bytes the server's max_payload leaves for tasks: raise "
                f"max_payload in nats.conf"
            )
        needed = math.ceil(items / fit)
        return RequestTooLarge(
            f"a map of {count} tasks ({items} items, chunksize {chunksize}) does not fit in "
            f"one request, even with its items in the object store: each task takes some "
            f"{per_task} bytes of it, and the server's max_payload leaves room for {fit} "
            f"tasks. Use a chunksize of at least {needed} (about {needed / chunksize:.3g} "
            f"times larger), leave chunksize out to size tasks by the cluster's cores, or "
            f"raise max_payload in nats.conf"
        )
