"""`ember bench --python` runs the Python workload under this interpreter and reports it."""

import json
import os
import subprocess
import sys

from conftest import binary, nats_server_binary


def test_ember_bench_runs_python_functions_from_python():
    env = dict(os.environ, EMBER_NATS_SERVER=nats_server_binary(), RUST_LOG="warn")
    done = subprocess.run(
        [binary("ember"), "bench", "--quick", "--soak-jobs", "0", "--wide-executors", "0",
         "--python", sys.executable, "--python-calls", "100", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["python"]
    assert [(r["executors"], r["workers"]) for r in rows] == [(2, 1), (2, 8)]
    for row in rows:
        assert row["calls_per_s_default_chunksize"] > 0
        assert row["calls_per_s_chunksize_1"] > 0
        assert row["submit_result_p50_ms"] > 0


def test_ember_bench_says_when_the_interpreter_lacks_the_package(tmp_path):
    # An interpreter that cannot import ember: a clear failure, not figures.
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    env = dict(os.environ, EMBER_NATS_SERVER=nats_server_binary(), RUST_LOG="warn")
    done = subprocess.run(
        [binary("ember"), "bench", "--quick", "--soak-jobs", "0", "--wide-executors", "0",
         "--python", str(bare), "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode != 0
    assert "is the ember package installed there" in done.stderr, done.stderr
