"""Ember from Python: run Python functions, commands and handlers on an Ember cluster.

    import ember
    with ember.LocalCluster() as cluster:       # or ember.connect("nats://host:4222")
        client = cluster.client()
        print(client.map(lambda x: x * x, range(10)).results())

`ember.Client` is the asyncio client (`await ember.Client.connect(...)`); `ember.connect` gives
the blocking one, and `ember.Executor` is a `concurrent.futures.Executor` on the cluster.
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
    retry_backoff,
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
from .sync import Executor, Future, SyncClient, SyncJob, connect
from .cluster import LocalCluster

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_URL",
    "Client",
    "DriverError",
    "EmberError",
    "Executor",
    "Future",
    "Job",
    "LocalCluster",
    "NoAnswer",
    "NoDriver",
    "ObjectRef",
    "RemoteError",
    "RemoteTraceback",
    "RequestTooLarge",
    "ResultGone",
    "SyncClient",
    "SyncJob",
    "Unavailable",
    "TaskError",
    "TaskFuture",
    "UpstreamError",
    "command_task",
    "connect",
    "handler_task",
    "python_task",
    "retry_backoff",
]
