#!/bin/bash
# Rerun all peer anchors (W4 on Ray and Dask only). Each *_bench.py prints one JSON line
# (also results/<peer>.json); summarize.py turns results/*.json into the markdown tables.
# RUNS=3 by default.
set -u
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || ./install.sh
PY=./.venv/bin/python
RUNS=${RUNS:-3}
QW=${QUIET_WAIT_S:-30}   # bounded wait for a quiet machine before each run (s)
mkdir -p results
uptime | tee results/uptime_start.txt
timeout 900  $PY dask_bench.py  --runs "$RUNS" --quiet-wait-s "$QW"               > results/dask.stdout  2> results/dask.log
timeout 900  $PY ray_bench.py   --runs "$RUNS" --quiet-wait-s "$QW"               > results/ray.stdout   2> results/ray.log
# W4 (broadcast: 256 MiB read by 64 tasks on 2 workers x 2 slots) into results/<peer>_w4.json.
timeout 600  $PY ray_bench.py   --runs "$RUNS" --quiet-wait-s "$QW" --only w4     > results/ray_w4.stdout  2> results/ray_w4.log
timeout 600  $PY dask_bench.py  --runs "$RUNS" --quiet-wait-s "$QW" --only w4     > results/dask_w4.stdout 2> results/dask_w4.log
# Spark default config: Python path measured at M=2000 (steady per-task cost; M=10k would
# take ~4-6 min per run because of the ~40 ms per-task TCP stall between the JVM and its Python workers).
timeout 1800 $PY spark_bench.py --runs "$RUNS" --quiet-wait-s "$QW" --py-m 2000   > results/spark.stdout 2> results/spark.log
# Spark variant: JVM<->Python-worker over a Unix domain socket (no Nagle/delayed-ACK stall).
SPARK_BENCH_CONF=spark.python.unix.domain.socket.enabled=true \
timeout 900  $PY spark_bench.py --runs 1 --quiet-wait-s "$QW" --only w2,w3 --py-m 10000 --tag _uds \
                                                             > results/spark_uds.stdout 2> results/spark_uds.log
uptime | tee results/uptime_end.txt
$PY summarize.py | tee results/summary.md
