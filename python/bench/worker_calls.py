"""No-op calls a second through one Python worker alone, driven through its pipes as the
executor drives it, with no executor or broker around it; median, min and max of --runs runs.
Several worker scripts alternate, run by run, to compare them:

    python3 python/bench/worker_calls.py --runs 12
    python3 python/bench/worker_calls.py --runs 12 src/executor/python_worker.py /tmp/other.py
"""

import argparse
import base64
import json
import pickle
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "src" / "executor" / "python_worker.py"


def calls_per_second(script, calls):
    worker = subprocess.Popen(
        [sys.executable, "-c", Path(script).read_text()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )

    def send(message):
        body = json.dumps(message).encode()
        worker.stdin.write(struct.pack(">I", len(body)) + body)
        worker.stdin.flush()

    def receive():
        (size,) = struct.unpack(">I", worker.stdout.read(4))
        return json.loads(worker.stdout.read(size))

    try:
        receive()  # ready
        pickled = lambda value: base64.b64encode(pickle.dumps(value)).decode()
        request = {"function": pickled(abs), "args": pickled(((-1,), {})), "map": False}
        start = time.perf_counter()
        for _ in range(calls):
            send(request)
            if "ok" not in receive():
                raise AssertionError("a no-op call failed")
        return calls / (time.perf_counter() - start)
    finally:
        worker.kill()
        worker.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", default=[str(WORKER)])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    rates = {script: [] for script in args.scripts}
    for run in range(args.runs):
        # Each run rotates the order, so that none always goes first.
        order = args.scripts[run % len(args.scripts):] + args.scripts[: run % len(args.scripts)]
        for script in order:
            rates[script].append(calls_per_second(script, args.calls))
    for script, seen in rates.items():
        print(f"{script}: {statistics.median(seen):.0f} calls/s "
              f"(min {min(seen):.0f}, max {max(seen):.0f}, {len(seen)} runs)")


if __name__ == "__main__":
    main()
