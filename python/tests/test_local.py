"""`ember.LocalCluster` and `ember up` as a Python user runs them: from the installed binaries,
stopped with their Python process, however it ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ember
from ember.cluster import binary

FROM_WHEEL = os.environ.get("EMBER_FROM_WHEEL") == "1"


def square(x):
    return x * x


def interpreter():
    return sys.executable


def alive(pid):
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(root):
    """The ids of every process below `root`, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def wait_gone(pids, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.05)
    return [(pid, command_of(pid)) for pid in pids if alive(pid)]


def test_a_local_cluster_runs_python_and_stops_everything_it_started():
    before = descendants(os.getpid())
    with ember.LocalCluster(executors=2, cores=1) as cluster:
        client = cluster.client()
        assert client.submit(square, 7).result(timeout=60) == 49
        assert client.map(square, range(20)).results(timeout=60) == [x * x for x in range(20)]
        # Its workers run this interpreter, so they unpickle what this process pickles.
        assert client.submit(interpreter).result(timeout=60) == sys.executable
        started = descendants(os.getpid()) - before
        commands = " ".join(command_of(pid) for pid in started)
        for name in ("nats-server", "ember-driver", "ember-executor"):
            assert name in commands, commands
        directory = cluster.directory
        assert os.path.isdir(directory)
    assert not cluster.running
    assert wait_gone(started, 5) == []
    assert not os.path.exists(directory)


def test_connect_with_no_url_reaches_the_local_cluster_of_this_process():
    with ember.LocalCluster(executors=1, cores=1, web=False) as cluster:
        with ember.connect() as client:
            assert client.submit(square, 5).result(timeout=60) == 25
        with ember.Executor() as executor:
            assert list(executor.map(square, range(5), timeout=60)) == [0, 1, 4, 9, 16]
        url = cluster.url
    # Closed, it is no longer the default.
    assert ember.cluster.default_target(None, None)[0] != url


def test_a_local_cluster_stops_when_its_block_raises():
    before = descendants(os.getpid())
    with pytest.raises(KeyError):
        with ember.LocalCluster(executors=1, cores=1, web=False):
            started = descendants(os.getpid()) - before
            raise KeyError("the user's error")
    assert started
    assert wait_gone(started, 5) == []


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="executors must be a positive integer"):
        ember.LocalCluster(executors=0)
    with pytest.raises(ValueError, match="cores must be"):
        ember.LocalCluster(cores=-1)


PROGRAM = textwrap.dedent(
    """
    import sys, time
    import ember
    cluster = ember.LocalCluster(executors=1, cores=1, web=False)
    print(cluster.client().submit(abs, -3).result(timeout=60), flush=True)
    time.sleep(600)
    """
)


def test_nothing_a_local_cluster_started_outlives_a_python_killed_with_sigkill(tmp_path):
    program = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        line = program.stdout.readline()
        assert line.strip() == b"3", (line, program.stderr.read() if program.poll() else b"")
        started = descendants(program.pid)
        commands = [command_of(pid) for pid in started]
        # ember up, nats-server, the driver, the executor and its python worker at least.
        assert len(started) >= 5, commands
        assert any("ember-executor" in c for c in commands), commands
        program.send_signal(signal.SIGKILL)
        program.wait(10)
        assert wait_gone(started, 5) == []
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


def test_ember_up_from_the_virtualenv_runs_python_in_its_own_interpreter(tmp_path):
    """`ember up` with no --python, run by its path with the virtualenv off the PATH: it
    starts the nats-server beside it, and the executors' workers run the python beside them
    (the virtualenv's, where pip put Ember), which has the client's cloudpickle."""
    ember_bin = Path(binary("ember"))
    if not (ember_bin.parent / "python").is_file():
        pytest.skip("ember is not installed beside a python (run from the wheel's virtualenv)")
    port = ember.cluster._free_port()
    name = "up-" + os.urandom(4).hex()
    env = dict(os.environ, TMPDIR=str(tmp_path), RUST_LOG="warn", PATH="/usr/bin:/bin")
    for key in ("EMBER_PYTHON", "EMBER_UP_PYTHON", "EMBER_NATS_SERVER"):
        env.pop(key, None)
    up = subprocess.Popen(
        [str(ember_bin), "up", "--port", str(port), "--cluster", name, "--executors", "1",
         "--cores", "1", "--http", "off"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "up.log", "wb"),
        env=env,
        cwd=tmp_path,
    )
    try:
        url = f"nats://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            try:
                with ember.connect(url, cluster=name) as client:
                    if client.executors()["registered_executors"] >= 1:
                        worker_python = client.submit(interpreter).result(timeout=60)
                        break
            except ember.EmberError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.1)
        assert worker_python == str(ember_bin.parent / "python")
        started = descendants(up.pid)
        up.send_signal(signal.SIGINT)
        assert up.wait(20) == 0
        assert wait_gone(started, 5) == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


@pytest.mark.skipif(not FROM_WHEEL, reason="checks the wheel's install (scripts/test sets EMBER_FROM_WHEEL=1)")
def test_the_wheel_brings_everything_and_needs_no_toolchain():
    import shutil

    prefix = Path(sys.prefix).resolve()
    assert Path(ember.__file__).resolve().is_relative_to(prefix)
    assert shutil.which("cargo") is None
    for name in ("ember", "ember-driver", "ember-executor", "nats-server"):
        found = shutil.which(name)
        assert found is not None and Path(found).resolve().is_relative_to(prefix), (name, found)
    assert "EMBER_BIN_DIR" not in os.environ and "EMBER_NATS_SERVER" not in os.environ
    assert (Path(ember.__file__).parent / "py.typed").is_file()
