"""Ember's Python worker: one warm interpreter that runs python tasks for an executor.

The executor starts it with `python -c <this file>` and talks to it over its standard input
and output, which the worker keeps for itself: what a task prints goes to standard error, and
the task reads /dev/null. Every message either way is a frame: 4 bytes of big-endian length,
then that many bytes of JSON.

- The worker's first frame: {"ready": <pid>, "cloudpickle": <bool>}.
- A request: {"function": <b64>, "args": <b64>, "map": <bool>, "job_id", "task_id", "index",
  "attempt", "term", "resources", "gang"}. `function` is a pickled callable, `args` a pickled
  (args, kwargs) pair, or with `map` a pickled list of items; `resources` the addresses of the
  custom resources the attempt holds, by name ({"gpu": ["1"]}), and `gang` (a gang's task
  only) its EMBER_GANG_ variables, set in the environment for the call only.
- The answer: {"ok": <b64 pickled result>}, or {"error": <text>, "type": <name>,
  "traceback": <text>, "exception": <b64 pickled exception or null>}.

A request whose function cannot be unpickled because a module it needs is not importable here
answers {"error": ..., "type": "ModuleNotFoundError", "unimportable": <module name>}.

A request may name `retry_on` and `no_retry_on` (exception class names): an exception they say
is final answers with "no_retry": true, and the error says why. SIGINT while a call runs (the
executor stopping it) raises KeyboardInterrupt in the call, which answers as a failure; the
worker then takes the next request. SIGINT when no call runs (the call answered as the executor
asked it to stop) changes nothing.

Objects: a request may carry `function_path` or `args_path` instead of `function` or `args`
(a file holding the raw pickle, fetched from the cluster's object store by the executor), and
`objects`, {<reference>: <file>}: the values the pickles refer to by persistent id
("ember-object", <reference>), each file a pickle, loaded once per worker and shared
read-only by later calls. A map's items may come in groups: ("ember-item", <reference>,
<position>) is the chunk at that position of the object's value, a list of the chunks'
pickles; the list is loaded once, as any object is, and the chunk unpickled for each call.

Results of other jobs: a request may carry `results`, {<job id>: [<result>, ...]}, the results
of the jobs its task reads, each task's in order (a python task's is {"pickle": <b64>}). The
persistent id ("ember-result", <job id>, <shape>) stands for the value they make: "value" the
one result of a call, unpickled; "call" the list of a job's unpickled results; "map" the same
with each task's list of values flattened; "json" the results as they are. Each call gets its
own copy.
"""

import base64
import io
import json
import os
import pickle
import signal
import struct
import sys
import traceback

try:
    import cloudpickle

    dumps = cloudpickle.dumps
    HAVE_CLOUDPICKLE = True
except ImportError:  # plain pickle still runs functions defined in importable modules
    dumps = pickle.dumps
    HAVE_CLOUDPICKLE = False

# Unpickled functions by their pickle: a map's many tasks share one.
FUNCTIONS = {}
# Whether the user's call runs: SIGINT stops it then, and only then.
CALLING = False
FUNCTIONS_KEPT = 64
# Values of objects by reference, loaded once: a broadcast value serves every later call.
VALUES = {}
VALUES_KEPT = 16
# The files of the objects the current call names.
OBJECT_FILES = {}
# The results of the jobs the current call reads, by job id (a string).
RESULTS = {}
# What a task sees of itself, as a command task does.
ENVIRONMENT = (
    ("job_id", "EMBER_JOB_ID"),
    ("task_id", "EMBER_TASK_ID"),
    ("index", "EMBER_TASK_INDEX"),
    ("attempt", "EMBER_TASK_ATTEMPT"),
    ("term", "EMBER_TASK_TERM"),
)

# The variables of a task's custom resources, as a command task gets them.
RESOURCES_ALL = "EMBER_TASK_RESOURCES"
RESOURCE_PREFIX = "EMBER_RESOURCE_"
# The variables of a gang's task (its peers, its port, its rank), set by the executor.
GANG_PREFIX = "EMBER_GANG_"


def take_pipes():
    """The protocol's pipes, and fds 0 and 1 pointed elsewhere so that tasks cannot touch them."""
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return inp, out


def send(out, message):
    body = json.dumps(message).encode()
    out.write(struct.pack(">I", len(body)) + body)
    out.flush()


def receive(inp):
    head = inp.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    body = inp.read(size)
    if len(body) < size:
        return None
    return json.loads(body)


def class_names(error):
    """The names an exception answers to: `module.Class` of its class and every base, and the
    bare name of the built-in ones (`ValueError`)."""
    names = set()
    for cls in type(error).__mro__:
        names.add(f"{cls.__module__}.{cls.__qualname__}")
        if cls.__module__ == "builtins":
            names.add(cls.__qualname__)
    return names


def final_failure(error, retry_on, no_retry_on):
    """Why a failure by `error` must not run again under the job's `retry_on` and
    `no_retry_on`, or None if it may."""
    if not retry_on and not no_retry_on:
        return None
    names = class_names(error)
    kind = type(error).__name__
    if no_retry_on and names.intersection(no_retry_on):
        return f"no_retry_on names {kind}"
    if retry_on and not names.intersection(retry_on):
        return f"retry_on does not name {kind}"
    return None


def failure(error, what):
    """The answer for an exception raised by `what` (the task's code, or unpickling)."""
    tb = error.__traceback__
    # Leave out this file's own frame: the traceback starts in the task's code.
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(error), error, tb))
    try:
        pickled = base64.b64encode(dumps(error)).decode()
    except Exception:
        pickled = None
    return {
        "error": f"{what}: {type(error).__name__}: {error}",
        "type": type(error).__name__,
        "traceback": text,
        "exception": pickled,
    }


class Unpickler(pickle.Unpickler):
    """Loads the objects a pickle refers to by persistent id from the files the executor
    fetched."""

    def persistent_load(self, pid):
        kind = pid[0] if isinstance(pid, tuple) and pid else None
        if kind == "ember-object" and len(pid) == 2:
            return load_object(pid[1])
        if kind == "ember-item":
            return load_item(pid)
        if kind == "ember-result" and len(pid) == 3:
            return load_result(pid[1], pid[2])
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def load_item(pid):
    """The chunk of a map's items that ("ember-item", <reference>, <position>) names. The
    group's list of pickles is shared; the chunk is unpickled afresh, so that each attempt
    gets its own copy, as it does of inline arguments."""
    if not (
        len(pid) == 3
        and isinstance(pid[1], str)
        and type(pid[2]) is int
        and pid[2] >= 0
    ):
        raise pickle.UnpicklingError(
            f"malformed persistent id {pid!r}: an item is "
            f"('ember-item', <reference>, <position>)"
        )
    _, reference, position = pid
    group = load_object(reference)
    if not isinstance(group, list) or position >= len(group):
        raise pickle.UnpicklingError(
            f"object {reference} holds no group of map items with a position {position}"
        )
    chunk = group[position]
    if not isinstance(chunk, bytes):
        raise pickle.UnpicklingError(
            f"object {reference} holds no group of map items: its element {position} is of "
            f"type {type(chunk).__name__}, not a pickle"
        )
    return Unpickler(io.BytesIO(chunk)).load()


def load_result(job_id, shape):
    """The value the results of job `job_id` make, as `shape` says (see above)."""
    if job_id is None:
        return []
    results = RESULTS.get(str(job_id))
    if results is None:
        raise pickle.UnpicklingError(
            f"job {job_id} is not among the jobs whose results the task reads"
        )
    if shape == "json":
        return list(results)
    values = []
    for result in results:
        if not isinstance(result, dict) or not isinstance(result.get("pickle"), str):
            raise pickle.UnpicklingError(
                f"job {job_id} has a result that is no python task's: {str(result)[:200]}"
            )
        values.append(Unpickler(io.BytesIO(base64.b64decode(result["pickle"]))).load())
    if shape == "value":
        if len(values) != 1:
            raise pickle.UnpicklingError(
                f"job {job_id} has {len(values)} results; a call's future stands for one"
            )
        return values[0]
    if shape == "call":
        return values
    if shape == "map":
        return [value for chunk in values for value in chunk]
    raise pickle.UnpicklingError(f"unknown shape {shape!r} of job {job_id}'s results")


def load_object(reference):
    value = VALUES.get(reference)
    if value is None:
        path = OBJECT_FILES.get(reference)
        if path is None:
            raise pickle.UnpicklingError(
                f"object {reference} is not among the objects the task names"
            )
        with open(path, "rb") as file:
            value = Unpickler(file).load()
        if len(VALUES) >= VALUES_KEPT:
            VALUES.clear()
        VALUES[reference] = value
    return value


def pickled(request, field):
    """The raw pickle of `field` (function or args): inline in base64, or in a file."""
    path = request.get(field + "_path")
    if path:
        with open(path, "rb") as file:
            return file.read()
    return base64.b64decode(request[field])


def unpickle(data, what):
    """Loads a pickle; an ImportError says which module this interpreter lacks."""
    try:
        return Unpickler(io.BytesIO(data)).load(), None
    except ImportError as error:
        module = getattr(error, "name", None) or str(error)
        answer = failure(error, f"could not unpickle the task's {what}")
        answer["error"] = (
            f"the task's {what} needs module {module!r}, which is not importable on this "
            f"executor ({sys.executable}): {error}. Install it there, or define the function "
            f"in __main__ so that cloudpickle sends it by value"
        )
        answer["unimportable"] = module
        return None, answer
    except Exception as error:
        answer = failure(error, f"could not unpickle the task's {what}")
        version = getattr(sys.modules.get("cloudpickle"), "__version__", "not installed")
        answer["error"] += (
            f" (this executor's interpreter is {sys.executable}, with cloudpickle {version}: "
            f"what one version of cloudpickle pickles, another may not load. Start the "
            f"executors with --python naming an interpreter with the client's cloudpickle)"
        )
        # The client raises this text, not the bare exception, which would lose the hint.
        answer["exception"] = None
        return None, answer


def set_resources(resources, gang=None):
    """Sets the variables a command task with `resources` sees: EMBER_TASK_RESOURCES (all of
    them, as JSON) and EMBER_RESOURCE_<NAME> (one's addresses, comma-separated), and for a
    gang's task the EMBER_GANG_ variables in `gang`. Returns what they held before, for
    `restore`: the next call may hold other resources, or none."""
    values = {}
    if resources:
        values[RESOURCES_ALL] = json.dumps(resources, separators=(",", ":"))
        for name, addresses in resources.items():
            values[RESOURCE_PREFIX + str(name).upper()] = ",".join(map(str, addresses))
    for name, value in (gang or {}).items():
        if str(name).startswith(GANG_PREFIX):
            values[str(name)] = str(value)
    # Any other EMBER_RESOURCE_ or EMBER_GANG_ variable (the executor's own, say) is hidden
    # for the call, so that a task sees only what it holds.
    prefixes = (RESOURCE_PREFIX, GANG_PREFIX)
    names = set(values) | {n for n in os.environ if n.startswith(prefixes)}
    names.add(RESOURCES_ALL)
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(values)
    return saved


def restore(saved):
    """Puts back the variables `set_resources` changed."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run(request):
    global CALLING
    OBJECT_FILES.clear()
    OBJECT_FILES.update(request.get("objects") or {})
    RESULTS.clear()
    RESULTS.update(request.get("results") or {})
    key = request.get("function_path") or request["function"]
    function = FUNCTIONS.get(key)
    if function is None:
        function, answer = unpickle(pickled(request, "function"), "function")
        if answer is not None:
            return answer
        if len(FUNCTIONS) >= FUNCTIONS_KEPT:
            FUNCTIONS.clear()
        FUNCTIONS[key] = function
    args, answer = unpickle(pickled(request, "args"), "arguments")
    if answer is not None:
        return answer
    for field, variable in ENVIRONMENT:
        os.environ[variable] = str(request.get(field, ""))
    saved = set_resources(request.get("resources") or {}, request.get("gang"))
    try:
        CALLING = True
        if request.get("map"):
            result = [function(item) for item in args]
        else:
            positional, keywords = args
            result = function(*positional, **keywords)
    except KeyboardInterrupt as error:  # the executor asked the call to stop
        return failure(error, "the task was interrupted")
    except BaseException as error:  # SystemExit too: the task failed, the worker goes on
        answer = failure(error, "the task raised")
        why = final_failure(error, request.get("retry_on"), request.get("no_retry_on"))
        if why:
            answer["no_retry"] = True
            answer["error"] += f" (not retried: {why})"
        return answer
    finally:
        CALLING = False
        restore(saved)
    try:
        return {"ok": base64.b64encode(dumps(result)).decode()}
    except Exception as error:
        return failure(error, "could not pickle the task's result")


def on_interrupt(_signum, _frame):
    # The executor stops a call with SIGINT. One that comes when no call runs (the call
    # answered just as the executor asked it to stop, the answer being sent, the next request
    # awaited) has nothing to stop: raising then would end the worker, or cut an answer.
    if CALLING:
        raise KeyboardInterrupt


def main():
    signal.signal(signal.SIGINT, on_interrupt)
    inp, out = take_pipes()
    send(out, {"ready": os.getpid(), "cloudpickle": HAVE_CLOUDPICKLE})
    while True:
        try:
            request = receive(inp)
            if request is None:
                return
            answer = run(request)
        except KeyboardInterrupt:
            # Raised as the call ended, outside its own handling: the executor, which asked
            # it to stop, replaces this worker once its grace is over.
            continue
        send(out, answer)


main()
