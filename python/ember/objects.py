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
import re
import uuid

import cloudpickle
import nats.js.errors

from .errors import EmberError

# The size of an object's chunks, as the Object Store's own default.
CHUNK_BYTES = 128 * 1024
# How many chunks a put has sent whose acknowledgements it has not read yet.
CHUNKS_IN_FLIGHT = 32
# A function or arguments whose pickle is larger than this go into the store, and the task
# carries a reference instead.
BY_REFERENCE_BYTES = 64 * 1024
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


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with every ObjectRef written as a persistent id that the worker resolves,
    and the references it wrote counted."""

    def __init__(self, file):
        super().__init__(file)
        self.refs = []

    def persistent_id(self, obj):
        if isinstance(obj, ObjectRef):
            if obj.ref not in self.refs:
                self.refs.append(obj.ref)
            return ("ember-object", obj.ref)
        return None


def dumps(value):
    """The pickle of `value`, and the references of the ObjectRefs in it."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer)
    pickler.dump(value)
    return buffer.getvalue(), pickler.refs


class Store:
    """The object store of one cluster, over a JetStream context."""

    def __init__(self, js, cluster):
        self.js = js
        self.bucket = f"EMBER_{cluster}_OBJECTS"
        self.stream = f"OBJ_{self.bucket}"

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
