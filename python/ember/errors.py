"""The exceptions of the Ember client."""


class EmberError(Exception):
    """Anything that went wrong talking to an Ember cluster."""


class NoDriver(EmberError):
    """No driver answers on the cluster's api subject."""


class NoAnswer(EmberError):
    """The driver did not answer in time, or the answer came from a driver that no longer
    leads: the request may or may not have been taken."""


class Unavailable(EmberError):
    """No driver could take the request, and nothing was done: send it again later (a driver
    standing by says so while no driver can lead, its journal's store refusing writes)."""


class DriverError(EmberError):
    """The driver answered `Error`: `message` is what it said."""

    def __init__(self, message):
        super().__init__(f"the driver said: {message}")
        self.message = message


class RequestTooLarge(EmberError):
    """A request over the server's max_payload (less Ember's headroom)."""


class TaskError(EmberError):
    """A task failed, was killed or lost, with the executor's or driver's error."""

    def __init__(self, message, *, job_id=None, index=None, state=None):
        super().__init__(message)
        self.job_id = job_id
        self.index = index
        self.state = state


class ResultGone(EmberError):
    """A task finished, but its result is no longer kept: the results bucket keeps results
    for `--results-max-age` and up to `--results-max-bytes`, the oldest going first (what a
    waiting task reads excepted)."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on an executor, set as the `__cause__` of the
    exception re-raised here (as `concurrent.futures` does), so both tracebacks print."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return f'\n"""\n{self.text.rstrip()}\n"""'


class RemoteError(TaskError):
    """A Python exception raised by a task whose exception could not be unpickled here: its
    type's name, message and the remote traceback."""

    def __init__(self, message, *, type_name, remote_traceback, **where):
        super().__init__(message, **where)
        self.type_name = type_name
        self.remote_traceback = remote_traceback

    def __str__(self):
        return f"{self.args[0]}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"


class UpstreamError(TaskError):
    """A task did not run because a job whose results it reads (a future in its arguments)
    did not succeed: `upstream` is that job, and the exception it failed with (the remote
    one, with its traceback, or its own `UpstreamError` further up) is the `__cause__`. The
    task's own attempts are not spent: it never started."""

    def __init__(self, message, *, upstream, **where):
        super().__init__(message, **where)
        self.upstream = upstream
