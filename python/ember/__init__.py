"""Ember from Python: run Python functions, commands and handlers on an Ember cluster.

    import ember
    client = ember.connect("nats://127.0.0.1:4222")
    print(client.map(lambda x: x * x, range(10)).results())

`ember.Client` is the asyncio client (`await ember.Client.connect(...)`); `ember.connect` gives
the blocking one.
"""

from .client import (
    DEFAULT_CLUSTER,
    DEFAULT_URL,
    Client,
    Job,
    TaskFuture,
    command_task,
    handler_task,
    python_task,
)
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
from .sync import SyncClient, SyncFuture, SyncJob, connect

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_URL",
    "Client",
    "DriverError",
    "EmberError",
    "Job",
    "NoAnswer",
    "NoDriver",
    "ObjectRef",
    "RemoteError",
    "RemoteTraceback",
    "RequestTooLarge",
    "ResultGone",
    "SyncClient",
    "SyncFuture",
    "SyncJob",
    "Unavailable",
    "TaskError",
    "TaskFuture",
    "UpstreamError",
    "command_task",
    "connect",
    "handler_task",
    "python_task",
]
