"""The time from `ember.LocalCluster()` to the first result of a `submit` on it, and to its
`close()`, over --runs runs (median, min and max), with the installed wheel's binaries:

    .tools/wheel-venv/bin/python python/bench/local_start.py --runs 7
"""

import argparse
import statistics
import time

import ember


def once(executors):
    start = time.monotonic()
    cluster = ember.LocalCluster(executors=executors, web=False)
    try:
        if cluster.client().submit(pow, 2, 10).result(timeout=60) != 1024:
            raise AssertionError("pow(2, 10) is not 1024")
        first = time.monotonic() - start
    finally:
        closing = time.monotonic()
        cluster.close()
    return first, time.monotonic() - closing


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--executors", type=int, default=2)
    args = parser.parse_args()
    runs = [once(args.executors) for _ in range(args.runs)]
    for name, values in (("first result", [r[0] for r in runs]), ("close", [r[1] for r in runs])):
        print(f"{name}: median {statistics.median(values):.2f} s "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)")


if __name__ == "__main__":
    main()
