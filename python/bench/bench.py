"""Python functions on Ember: 10,000 calls of a no-op through `map`, on 2 executors of 1 and of
8 Python workers each, the round trip of one `submit(...).result()`, and a tree of futures.

`map` runs with its default chunksize (about four tasks per core: 8 tasks of 1,250 calls at
2 x 1, 64 of 157 at 2 x 8) and with chunksize=1 (10,000 tasks, one call each); both figures are
calls per second, which at chunksize=1 are tasks per second.

The tree: 10,000 `submit(leaf, i)`, 100 `submit(reduce, *futures)` over 100 of them each, and
one `submit(reduce, *reduces)`, from the asyncio client, timed from the first submit to the
combine's value; beside it the same 10,101 submits with plain numbers in place of the futures,
timed to the end of the last. The overhead per dependency edge is the difference over the
10,100 edges.

    EMBER_NATS_SERVER=.tools/bin/nats-server .tools/wheel-venv/bin/python python/bench/bench.py

It starts its own nats-server (max_payload 8 MB; JetStream only with --journal), a driver and the executors
from target/release (or $EMBER_BIN_DIR) on a loopback port, and stops them at the end. Each
figure is the median of --runs runs; every map's results are checked. With --json it prints
one JSON list of the figures and nothing else (`ember bench --python` reads it).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ember  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, limit=20):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Cluster:
    def __init__(self, executors, workers, journal=False):
        self.dir = tempfile.mkdtemp(prefix="ember-bench-")
        config = Path(self.dir) / "nats.conf"
        config.write_text("max_payload: 8MB\n")
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.name = "bench-" + uuid.uuid4().hex[:8]
        server = os.environ.get("EMBER_NATS_SERVER") or shutil.which("nats-server")
        if not server:
            raise RuntimeError("no nats-server: set EMBER_NATS_SERVER or put it on the PATH")
        server = os.path.abspath(server)
        bins = Path(os.environ.get("EMBER_BIN_DIR", REPO / "target" / "release")).resolve()
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
        # With JetStream, the driver keeps its journal and results bucket there.
        store = ["-js", "-sd", str(Path(self.dir) / "jetstream")] if journal else []
        self.processes = [
            subprocess.Popen(
                [server, "-c", str(config), "-a", "127.0.0.1", "-p", str(self.port), *store],
                stderr=subprocess.DEVNULL,
                **quiet,
            )
        ]
        wait_listening(self.port)
        common = ["--nats-url", self.url, "--cluster", self.name]
        env = dict(os.environ, RUST_LOG="error")
        self.processes.append(
            # The tree names 10,000 jobs after they have ended: they must still be kept.
            subprocess.Popen([bins / "ember-driver", *common, "--retain-jobs", "100000"],
                             env=env, cwd=self.dir, **quiet)
        )
        for n in range(executors):
            self.processes.append(
                subprocess.Popen(
                    [bins / "ember-executor", *common, "--executor-id", f"exec-{n + 1}",
                     "--cores", str(workers), "--python-workers", str(workers),
                     "--python", sys.executable],
                    env=env, cwd=self.dir, **quiet,
                )
            )

    def stop(self):
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def noop(x):
    return x


def leaf(i):
    return i


def reduce(*values):
    return sum(values)


async def tree_once(url, name, leaves, fan, futures):
    """One run of the tree (`futures`) or of the same submits without dependencies: seconds."""
    import asyncio

    client = await ember.Client.connect(url, cluster=name)
    try:
        await client._ensure_watch()
        started = time.perf_counter()
        firsts = await asyncio.gather(*(client.submit(leaf, i) for i in range(leaves)))
        groups = [range(s, min(s + fan, leaves)) for s in range(0, leaves, fan)]
        if futures:
            middles = await asyncio.gather(
                *(client.submit(reduce, *(firsts[i] for i in group)) for group in groups)
            )
            total = await (await client.submit(reduce, *middles))
        else:
            middles = await asyncio.gather(*(client.submit(reduce, *group) for group in groups))
            last = await client.submit(reduce, *range(len(groups)))
            await asyncio.gather(
                *(client._end_of(f.job_id) for f in [*firsts, *middles, last])
            )
            total = sum(range(leaves))
        elapsed = time.perf_counter() - started
        assert total == sum(range(leaves)), total
        return elapsed
    finally:
        await client.close()


def measure_tree(url, name, leaves, fan, runs):
    """Median seconds of the tree and of the same submits without dependencies."""
    import asyncio

    tree, flat = [], []
    for _ in range(runs):
        flat.append(asyncio.run(tree_once(url, name, leaves, fan, False)))
        tree.append(asyncio.run(tree_once(url, name, leaves, fan, True)))
    return statistics.median(tree), statistics.median(flat)


def measure(executors, workers, calls, runs, chunksizes, round_trips, leaves, fan, journal):
    cluster = Cluster(executors, workers, journal)
    try:
        with ember.connect(cluster.url, cluster=cluster.name) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.executors()["registered_executors"] == executors:
                        break
                except ember.NoDriver:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the executors did not register")
                time.sleep(0.1)
            # Every worker warm before anything is timed.
            client.map(noop, range(executors * workers * 4), chunksize=1).results()
            figures = {}
            for chunksize in chunksizes:
                rates = []
                for _ in range(runs):
                    started = time.perf_counter()
                    results = client.map(noop, range(calls), chunksize=chunksize).results()
                    elapsed = time.perf_counter() - started
                    assert results == list(range(calls))
                    rates.append(calls / elapsed)
                figures[chunksize or "default"] = statistics.median(rates)
            times = []
            for n in range(round_trips + 10):
                started = time.perf_counter()
                assert client.submit(noop, n).result() == n
                if n >= 10:
                    times.append((time.perf_counter() - started) * 1000)
            p50 = statistics.median(times)
            tree = measure_tree(cluster.url, cluster.name, leaves, fan, runs) if leaves else None
            return figures, p50, tree
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tree-leaves", type=int, default=10_000,
                        help="leaf calls of the tree (0 skips it)")
    parser.add_argument("--tree-fan", type=int, default=100,
                        help="futures each reduce of the tree reads")
    parser.add_argument("--journal", action="store_true",
                        help="run the server with JetStream: the driver keeps its journal and "
                             "results bucket there (without, it keeps them in memory)")
    parser.add_argument("--json", action="store_true", help="print one JSON list only")
    args = parser.parse_args()
    chunksizes = [None, 1]
    table = sys.stderr if args.json else sys.stdout
    print(f"{args.calls} calls of a no-op via map, median of {args.runs}; "
          f"p50 of {args.round_trips} submit().result()", file=table)
    print(f"{'executors x workers':>20} {'calls/s, default chunksize':>27} "
          f"{'calls/s, chunksize=1':>21} {'p50 ms':>8}", file=table)
    rows = []
    for workers in args.workers:
        figures, p50, tree = measure(args.executors, workers, args.calls, args.runs, chunksizes,
                                     args.round_trips, args.tree_leaves, args.tree_fan,
                                     args.journal)
        print(f"{f'{args.executors} x {workers}':>20} {figures['default']:>27,.0f} "
              f"{figures[1]:>21,.0f} {p50:>8.2f}", file=table)
        row = {"executors": args.executors, "workers": workers,
               "calls_per_s_default_chunksize": round(figures["default"]),
               "calls_per_s_chunksize_1": round(figures[1]),
               "submit_result_p50_ms": round(p50, 3)}
        if tree is not None:
            edges = args.tree_leaves + -(-args.tree_leaves // args.tree_fan)
            per_edge = (tree[0] - tree[1]) / edges * 1e6
            print(f"{'':>20} tree of {args.tree_leaves} leaves: {tree[0]:.2f} s, without "
                  f"dependencies {tree[1]:.2f} s: {per_edge:.0f} us per edge", file=table)
            row.update({"tree_s": round(tree[0], 3), "tree_flat_s": round(tree[1], 3),
                        "tree_us_per_edge": round(per_edge, 1)})
        rows.append(row)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
