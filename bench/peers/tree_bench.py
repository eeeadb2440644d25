#!/usr/bin/env python3
"""W5, a tree of futures, on Ray or Dask: 10,000 leaf calls, 100 reduces over 100 leaf
futures each, one combine over the 100 reduces, timed from the first submission to the
combine's value; and the same 10,101 calls with plain numbers in place of the futures, timed
until all have ended. The overhead per dependency edge is the difference over 10,100 edges.
Ember's side is `python/bench/bench.py` (the `tree` figures of `ember bench --python`).

Ray: ray.init(num_cpus=2*S) on one node, tasks of num_cpus=1. Dask: LocalCluster(n_workers=2,
threads_per_worker=S, processes=True), submits with pure=False. Each size on a fresh cluster,
warmed up with 2,000 leaf calls first; figures are medians of --runs runs.

    .venv/bin/python tree_bench.py ray --slots 1 8 --runs 3 > results/ray_tree.json
    .venv/bin/python tree_bench.py dask --slots 1 8 --runs 3 > results/dask_tree.json
"""
import argparse
import json
import statistics
import sys
import time


def leaf(i):
    return i


def reduce(*values):
    return sum(values)


def ray_sizes(slots, leaves, fan, runs):
    import ray

    ray.init(num_cpus=2 * slots, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        first = ray.remote(num_cpus=1)(leaf)
        then = ray.remote(num_cpus=1)(reduce)
        ray.get([first.remote(i) for i in range(2000)])
        tree, flat = [], []
        for _ in range(runs):
            started = time.perf_counter()
            refs = [first.remote(i) for i in range(leaves)]
            middles = [then.remote(*refs[g * fan:(g + 1) * fan]) for g in range(leaves // fan)]
            total = ray.get(then.remote(*middles))
            tree.append(time.perf_counter() - started)
            assert total == sum(range(leaves)), total
            started = time.perf_counter()
            refs = [first.remote(i) for i in range(leaves)]
            refs += [then.remote(*range(g * fan, (g + 1) * fan)) for g in range(leaves // fan)]
            refs.append(then.remote(*range(leaves // fan)))
            ray.wait(refs, num_returns=len(refs), fetch_local=False)
            flat.append(time.perf_counter() - started)
        return tree, flat
    finally:
        ray.shutdown()


def dask_sizes(slots, leaves, fan, runs):
    from dask.distributed import Client, LocalCluster, wait

    cluster = LocalCluster(n_workers=2, threads_per_worker=slots, processes=True,
                           dashboard_address=None)
    client = Client(cluster)
    try:
        client.gather(client.map(leaf, range(2000), pure=False))
        tree, flat = [], []
        for _ in range(runs):
            started = time.perf_counter()
            refs = [client.submit(leaf, i, pure=False) for i in range(leaves)]
            middles = [client.submit(reduce, *refs[g * fan:(g + 1) * fan], pure=False)
                       for g in range(leaves // fan)]
            total = client.submit(reduce, *middles, pure=False).result()
            tree.append(time.perf_counter() - started)
            assert total == sum(range(leaves)), total
            del refs, middles
            started = time.perf_counter()
            refs = [client.submit(leaf, i, pure=False) for i in range(leaves)]
            refs += [client.submit(reduce, *range(g * fan, (g + 1) * fan), pure=False)
                     for g in range(leaves // fan)]
            refs.append(client.submit(reduce, *range(leaves // fan), pure=False))
            wait(refs)
            flat.append(time.perf_counter() - started)
            del refs
        return tree, flat
    finally:
        client.close()
        cluster.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=["ray", "dask"])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--fan", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    run = {"ray": ray_sizes, "dask": dask_sizes}[args.peer]
    edges = args.leaves + args.leaves // args.fan
    rows = []
    for slots in args.slots:
        tree, flat = run(slots, args.leaves, args.fan, args.runs)
        tree_s, flat_s = statistics.median(tree), statistics.median(flat)
        rows.append({"peer": args.peer, "executors": 2, "slots": slots,
                     "tree_s": round(tree_s, 3), "tree_flat_s": round(flat_s, 3),
                     "tree_us_per_edge": round((tree_s - flat_s) / edges * 1e6, 1),
                     "runs": {"tree_s": [round(t, 3) for t in tree],
                              "flat_s": [round(t, 3) for t in flat]}})
        print(f"{args.peer} 2 x {slots}: tree {tree_s:.2f} s, without dependencies "
              f"{flat_s:.2f} s", file=sys.stderr)
    print(json.dumps({"python": sys.version.split()[0], "rows": rows}))


if __name__ == "__main__":
    main()
