#!/usr/bin/env python3
"""Render results/*.json (from the *_bench.py scripts) as a markdown table."""
import json
import os

R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def load(name):
    p = os.path.join(R, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def s(x, unit="s", nd=2):
    return "n/a" if x is None else f"{x:.{nd}f} {unit}".strip()


def w1(res, E, key="median_ready_s"):
    try:
        return res["w1"][f"E{E}"].get(key)
    except (KeyError, TypeError):
        return None


def w2(res, name):
    if not res:
        return "n/a"
    w = res.get("w2", {}).get(name)
    if w:
        return f"{w['median_tasks_per_s']:.0f}/s ({w['median_elapsed_s']:.1f} s, n={w['n']})"
    sk = res.get("w2_skipped", {}).get(name)
    if sk:
        small = res.get("w2", {}).get(name.replace("M100000", "M10000"))
        proj = 100000 / small["median_tasks_per_s"] if small and "M100000" in name else sk["projected_s"]
        return f"skipped (projected {proj:.0f} s)"
    return "n/a"


def w3(res, name):
    if not res:
        return "n/a"
    w = res.get("w3", {}).get(name)
    return f"{w['median_p50_ms']:.1f} / {w['median_p99_ms']:.1f}" if w else "n/a"


rows = []
sp, spu, dk, ry = load("spark"), load("spark_uds"), load("dask"), load("ray")
# W1 re-measured on a quieter machine (rerun_w1.sh) replaces the run_all W1 when present.
for base, name in ((dk, "dask_w1q"), (ry, "ray_w1q")):
    q = load(name)
    if base and q and "w1" in q:
        base["w1_first_pass"] = base.get("w1")
        base["w1"] = q["w1"]
        print(f"(W1 for {name.split('_')[0]} from results/{name}.json)")
r100 = load("ray_100k")
if ry and r100 and r100.get("w2", {}).get("M100000"):
    ry["w2"]["M100000"] = r100["w2"]["M100000"]
    print("(Ray W2 M=100k from results/ray_100k.json, 1 run, above the 60 s rule)")
if sp:
    v = sp["versions"]["pyspark"]
    rows.append(["Spark (PySpark tasks, default conf)", v, s(w1(sp, 2)), s(w1(sp, 8)),
                 w2(sp, "py_M2000") + " [M=2k]", "skipped", w3(sp, "py_collect")])
    rows.append(["Spark (JVM-only tasks)", v, "same", "same", w2(sp, "jvm_M10000"),
                 w2(sp, "jvm_M100000"), w3(sp, "jvm_count")])
if spu:
    rows.append(["Spark (PySpark tasks, unix.domain.socket=true)", spu["versions"]["pyspark"],
                 "-", "-", w2(spu, "py_M10000"), "skipped", w3(spu, "py_collect")])
if dk:
    rows.append(["Dask distributed (LocalCluster, processes)", dk["versions"]["distributed"],
                 s(w1(dk, 2)), s(w1(dk, 8)), w2(dk, "M10000"), w2(dk, "M100000"),
                 w3(dk, "submit_result")])
if ry:
    rows.append(["Ray core (init + first task)", ry["versions"]["ray"], s(w1(ry, 2)), s(w1(ry, 8)),
                 w2(ry, "M10000"), w2(ry, "M100000"), w3(ry, "remote_get")])

hdr = ["peer", "version", "W1 E=2", "W1 E=8", "W2 M=10k tasks/s", "W2 M=100k tasks/s",
       "W3 p50/p99 ms"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for r in rows:
    print("| " + " | ".join(r) + " |")
print()
# W1 breakdowns
for name, res in (("spark", sp), ("dask", dk), ("ray", ry)):
    if not res or "w1" not in res:
        continue
    for E in (2, 8):
        d = res["w1"].get(f"E{E}", {})
        parts = {k: v for k, v in d.items() if k.startswith("median_")}
        loads = [(r.get("load_before") or {}).get("load1") for r in d.get("runs", [])]
        busy = [(r.get("load_before") or {}).get("cpu_busy_1s") for r in d.get("runs", [])]
        print(f"- {name} W1 E={E}: {parts}; load1 before runs {loads}; cpu_busy {busy}")
for name, res in (("spark", sp), ("spark_uds", spu), ("dask", dk), ("ray", ry)):
    if not res:
        continue
    runs = res.get("w23_runs", [])
    loads = [(r.get("load_before") or {}).get("load1") for r in runs]
    busy = [(r.get("load_before") or {}).get("cpu_busy_1s") for r in runs]
    errs = [r.get("error") for r in runs if r.get("error")]
    print(f"- {name} W2/W3: load1 before runs {loads}; cpu_busy {busy}; errors {errs}")

# W2/W3 at 2 workers x S slots (results/<peer>_s<S>.json from `--slots S`, e.g. run_slots.sh).
import re  # noqa: E402
slot_files = sorted(f[:-5] for f in os.listdir(R) if re.fullmatch(r"(ray|dask|spark)_s\d+\.json", f))
if slot_files:
    print()
    hdr = ["peer", "slots", "W2 M=10k tasks/s", "W2 M=100k tasks/s", "W3 p50/p99 ms"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for name in slot_files:
        res = load(name)
        peer, S = name.split("_s")
        k10, k100, k3 = {"spark": ("jvm_M10000", "jvm_M100000", "jvm_count"),
                         "dask": ("M10000", "M100000", "submit_result"),
                         "ray": ("M10000", "M100000", "remote_get")}[peer]
        label = {"spark": "Spark (JVM-only tasks)", "dask": "Dask distributed",
                 "ray": "Ray core"}[peer]
        print(f"| {label} | 2 x {res.get('slots', S)} | {w2(res, k10)} | {w2(res, k100)} | "
              f"{w3(res, k3)} |")
    print()
    for name in slot_files:
        res = load(name)
        runs = res.get("w23_runs", [])
        loads = [(r.get("load_before") or {}).get("load1") for r in runs]
        busy = [(r.get("load_before") or {}).get("cpu_busy_1s") for r in runs]
        per = {k: [(r.get("w2", {}).get(k) or {}).get("tasks_per_s") for r in runs]
               for k in sorted({k for r in runs for k in r.get("w2", {})})}
        errs = [r.get("error") for r in runs if r.get("error")]
        print(f"- {name} W2 per run tasks/s {per}; load1 before runs {loads}; "
              f"cpu_busy {busy}; errors {errs}")

# W4 broadcast: one object read by many tasks on 2 workers x 2 slots (results/<peer>_w4.json
# from `--only w4`, or the w4 part of results/<peer>.json).
w4rows = []
for peer, label in (("ray", "Ray core (ray.put, one node)"),
                    ("dask", "Dask distributed (scatter broadcast=True)")):
    res = load(peer + "_w4") or load(peer)
    if res and res.get("w4"):
        w4rows.append((peer, label, res))
if w4rows:
    print()
    hdr = ["peer", "version", "object x reads", "seconds (put + tasks)", "GB/s", "runs s"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for peer, label, res in w4rows:
        w = res["w4"]
        runs = [r.get("total_s") for r in w["runs"]]
        ver = res["versions"].get("distributed" if peer == "dask" else "ray")
        print(f"| {label} | {ver} | {w['object_bytes'] >> 20} MiB x {w['tasks']} | "
              f"{s(w['median_total_s'], '', 3)} ({s(w['median_put_s'], '', 3)} + "
              f"{s(w['median_tasks_s'], '', 3)}) | {s(w['median_gbps'], '', 1)} | {runs} |")
    print()
    for peer, label, res in w4rows:
        runs = res["w4"]["runs"]
        loads = [(r.get("load_before") or {}).get("load1") for r in runs]
        busy = [(r.get("load_before") or {}).get("cpu_busy_1s") for r in runs]
        rust = [(r.get("load_before") or {}).get("rustc_procs") for r in runs]
        errs = [r.get("error") for r in runs if r.get("error")]
        print(f"- {peer} W4: load1 before runs {loads}; cpu_busy {busy}; rustc procs {rust}; "
              f"errors {errs}")
