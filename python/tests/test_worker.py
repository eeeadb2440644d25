"""The executor's Python worker on its own, driven through its pipes as the executor drives it:
what an interrupt does when it comes while no call runs."""

import base64
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "src" / "executor" / "python_worker.py"


def send(worker, message):
    body = json.dumps(message).encode()
    worker.stdin.write(struct.pack(">I", len(body)) + body)
    worker.stdin.flush()


def receive(worker):
    (size,) = struct.unpack(">I", worker.stdout.read(4))
    return json.loads(worker.stdout.read(size))


def call(function, *args):
    pickled = lambda value: base64.b64encode(pickle.dumps(value)).decode()
    return {"function": pickled(function), "args": pickled((args, {})), "map": False}


def test_an_interrupt_while_an_answer_is_sent_leaves_the_worker_running():
    # The executor stops a call with SIGINT; when the call has just answered, the interrupt
    # comes while the answer is written (or after), and must change nothing: the worker lives
    # on to take the next call.
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER.read_text()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert "ready" in receive(worker)
        # An answer far larger than a pipe holds: the worker waits in its write until it is
        # read, and the interrupt comes then.
        send(worker, call(os.urandom, 8 << 20))
        time.sleep(1.0)
        worker.send_signal(signal.SIGINT)
        answer = receive(worker)
        assert len(pickle.loads(base64.b64decode(answer["ok"]))) == 8 << 20
        send(worker, call(pow, 2, 10))
        answer = receive(worker)
        assert pickle.loads(base64.b64decode(answer["ok"])) == 1024
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait(timeout=10)
