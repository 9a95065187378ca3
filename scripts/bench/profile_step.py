#!/usr/bin/env python3
"""Where a training step's time goes, with and without vcudnn: each configuration in its own process runs a few
steps under torch.profiler (CUDA activity through CUPTI) and splits each step's time on the compute stream (the
stream with the most kernel time) into kernels running and idle, and the idle time into
  - host late: the next kernel was not launched yet (the host was busy: PyTorch's own launches, vcudnn's work in
    its hooks, the driver calls that map memory, or a host wait), and
  - waiting: it was launched but waited on the device (for a copy back, an event, another stream);
beside the copies each way (busy time and bytes) and the host's waits inside the step (event and stream
synchronisations: vcudnn's waits for room, PyTorch's own). A step that is mostly host
late is bound by the host, and vcudnn's host work adds to it one for one; one that is mostly waiting is bound by the
link or the plan. The profiler itself slows the host (a step alone runs faster than here): compare rows with each
other, not with scripts/bench/offload's step times.

  scripts/bench/profile_step.py --bin build/bin --budgets 90,60 --out scripts/bench/results/profile_step-TAG.json

Budgets are percentages of PyTorch alone's peak of live bytes (torch.cuda.max_memory_allocated with
cudaMallocAsync, measured by the first worker), as scripts/bench/offload's default budget base."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ASYNC = "backend:cudaMallocAsync"
STEP_MARK = "vcudnn_profiled_step"


def analyze(events):
    """Per profiled step (the STEP_MARK annotations) the split described in the module's doc, in ms."""
    xs = [e for e in events if e.get("ph") == "X"]
    marks = sorted((e for e in xs if e.get("name") == STEP_MARK and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    kernels = [e for e in xs if e.get("cat") == "kernel"]
    copies = [e for e in xs if e.get("cat") == "gpu_memcpy"]
    runtime = [e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launch_of = {e["args"].get("correlation"): e for e in runtime if "args" in e}
    busy = {}
    for k in kernels:
        busy[k["args"].get("stream")] = busy.get(k["args"].get("stream"), 0) + k["dur"]
    if not marks or not busy:
        return []
    compute = max(busy, key=busy.get)
    steps = []
    for m in marks:
        t0, t1 = m["ts"], m["ts"] + m["dur"]
        ks = sorted((k for k in kernels if k["args"].get("stream") == compute and t0 <= k["ts"] < t1),
                    key=lambda k: k["ts"])
        if not ks:
            continue
        end = max(k["ts"] + k["dur"] for k in ks)
        late = wait = 0.0
        free_from = t0  # the compute stream is idle from here until the next kernel starts
        for k in ks:
            gap = k["ts"] - free_from
            if gap > 0:
                launch = launch_of.get(k["args"].get("correlation"))
                launched = launch["ts"] + launch["dur"] if launch else free_from
                host = min(max(0.0, launched - free_from), gap)
                late += host
                wait += gap - host
            free_from = max(free_from, k["ts"] + k["dur"])
        row = {"step_ms": (max(t1, end) - t0) / 1e3, "kernels_ms": sum(k["dur"] for k in ks) / 1e3,
               "host_late_ms": late / 1e3, "waiting_ms": wait / 1e3}
        for name, key in (("DtoH", "d2h"), ("HtoD", "h2d")):
            cs = [c for c in copies if name in c["name"] and t0 <= c["ts"] < t1]
            row[f"{key}_ms"] = sum(c["dur"] for c in cs) / 1e3
            row[f"{key}_mib"] = sum(c["args"].get("bytes", 0) for c in cs) / 2**20
        # Waits inside the step (vcudnn's for room, PyTorch's own), not the wait for its end.
        row["host_sync_ms"] = sum(e["dur"] for e in runtime if t0 <= e["ts"] < t1 and "Synchronize" in e["name"]
                                  and "DeviceSynchronize" not in e["name"]) / 1e3
        row["timeline"] = timeline(ks, free_from0=t0, t1=t1, launch_of=launch_of, copies=copies, runtime=runtime)
        steps.append(row)
    return steps


def timeline(ks, free_from0, t1, launch_of, copies, runtime, least_us=100.0):
    """The step's compute-stream gaps of at least `least_us`, each with what it most likely waited for, and the
    copies, in ms from the step's start: a gap whose next kernel was launched late is the host's (inside a
    synchronisation call when one overlaps it); one that ends as a copy ends waited for that copy; the rest waited for
    something else on the device (an event of another stream)."""
    t0 = free_from0
    ms = lambda t: round((t - t0) / 1e3, 3)  # noqa: E731
    step_copies = [c for c in copies if t0 <= c["ts"] < t1]
    syncs = [e for e in runtime if t0 <= e["ts"] < t1 and "Synchronize" in e["name"]
             and "DeviceSynchronize" not in e["name"]]
    gaps = []
    free_from = t0
    for k in ks:
        gap = k["ts"] - free_from
        if gap >= least_us:
            launch = launch_of.get(k["args"].get("correlation"))
            launched = launch["ts"] + launch["dur"] if launch else free_from
            host = min(max(0.0, launched - free_from), gap)
            cause = "host"
            if host < gap / 2:
                ended = [c for c in step_copies if abs(c["ts"] + c["dur"] - k["ts"]) <= 30.0]
                cause = ("copy " + ended[0]["name"].split()[1] if ended and len(ended[0]["name"].split()) > 1
                         else "copy") if ended else "device"
            elif any(e["ts"] < launched and e["ts"] + e["dur"] > free_from for e in syncs):
                cause = "host sync"
            gaps.append({"at_ms": ms(free_from), "ms": round(gap / 1e3, 3), "host_ms": round(host / 1e3, 3),
                         "cause": cause, "next": k["name"][:60]})
        free_from = max(free_from, k["ts"] + k["dur"])
    return {"gaps": gaps,
            "copies": [{"at_ms": ms(c["ts"]), "ms": round(c["dur"] / 1e3, 3), "what": c["name"],
                        "mib": round(c["args"].get("bytes", 0) / 2**20, 1),
                        "queued_ms": ms(launch_of[c["args"]["correlation"]]["ts"])
                        if c["args"].get("correlation") in launch_of else None} for c in step_copies
                       if c["args"].get("bytes", 0) >= 1 << 20],
            "host_syncs": [{"at_ms": ms(e["ts"]), "ms": round(e["dur"] / 1e3, 3), "what": e["name"]} for e in syncs
                           if e["dur"] >= least_us]}


def worker(args):
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile, record_function  # noqa: PLC0415

    step = benchlib.synthetic_step(args.model, args.batch)
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            torch.cuda.synchronize()
            with record_function(STEP_MARK):
                step()
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as g:
            events = json.load(g)["traceEvents"]
    with open(args.worker_out, "w") as f:
        json.dump({"steps": analyze(events), "max_memory_allocated": peak,
                   "vcudnn": benchlib.vcudnn_memory_stats()}, f)


def run_config(args, lib, cfg, budget, tmp):
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=ASYNC)
    env = {k: v for k, v in env.items() if not k.startswith("VCUDNN_")}
    if cfg != "torch-async":
        env.update(LD_PRELOAD=lib, VCUDNN_POLICY="offload", VCUDNN_LOG_LEVEL="info",
                   VCUDNN_LOG_FILE=os.path.join(tmp, f"{cfg}.log"), LD_LIBRARY_PATH=benchlib.runtime_library_path())
        if budget:
            env["VCUDNN_DEVICE_BUDGET"] = str(budget)
        env.update(kv.split("=", 1) for kv in args.env)
    out = os.path.join(tmp, f"{cfg}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker-out", out, "--model", args.model,
           "--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    rc = subprocess.run(cmd, env=env, cwd=benchlib.ROOT).returncode
    if rc != 0 or not os.path.exists(out):
        return {"config": cfg, "budget_bytes": budget, "returncode": rc}
    with open(out) as f:
        result = json.load(f)
    log = os.path.join(tmp, f"{cfg}.log")
    exit_line = ""
    if os.path.exists(log):
        with open(log) as f:
            exit_line = next((line.strip() for line in f if "info: exit:" in line), "")
    return {"config": cfg, "budget_bytes": budget, "returncode": rc, **result, "exit_line": exit_line}


def median(rows, key):
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=benchlib.build_bin(), help="folder with libvcudnn.so")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--budgets", default="90,60", help="percentages of PyTorch alone's peak of live bytes")
    p.add_argument("--warmup", type=int, default=8, help="steps before profiling (the plan is followed from ~3)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--out", help="JSON result file")
    p.add_argument("--gaps", action="store_true",
                   help="print the budgeted runs' compute-stream gaps and copies (last profiled step)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a VCUDNN_* setting for every vcudnn run (repeatable)")
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_out:
        return worker(args)

    lib = os.path.join(os.path.abspath(args.bin), "libvcudnn.so")
    if not os.path.exists(lib):
        raise SystemExit(f"profile_step.py: {lib} not found (build first: scripts/build)")
    budgets = [int(b) for b in args.budgets.split(",") if b]
    runs = []
    with tempfile.TemporaryDirectory(prefix="vcudnn-profile-") as tmp:
        runs.append(run_config(args, lib, "torch-async", None, tmp))
        base = runs[0].get("max_memory_allocated")
        runs.append(run_config(args, lib, "vcudnn", None, tmp))
        for pct in budgets:
            if base:
                runs.append(run_config(args, lib, f"vcudnn-{pct}", base * pct // 100, tmp))
    print(f"### {args.model} batch {args.batch}, {args.steps} profiled steps after {args.warmup}; medians per step, ms "
          "(compute stream: kernels + host late + waiting; the rest of the step is its end, after the last kernel)")
    print("| config | budget (GiB) | step | kernels | host late | waiting | copies out (MiB) | copies back (MiB) | "
          "host syncs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        s = r.get("steps") or []
        if not s:
            print(f"| {r['config']} | failed (rc {r['returncode']}) |||||||")
            continue
        budget = f"{r['budget_bytes'] / 2**30:.2f}" if r["budget_bytes"] else "-"
        print(f"| {r['config']} | {budget} | {median(s, 'step_ms'):.1f} | {median(s, 'kernels_ms'):.1f} | "
              f"{median(s, 'host_late_ms'):.1f} | {median(s, 'waiting_ms'):.1f} | "
              f"{median(s, 'd2h_ms'):.1f} ({median(s, 'd2h_mib'):.0f}) | {median(s, 'h2d_ms'):.1f} "
              f"({median(s, 'h2d_mib'):.0f}) | {median(s, 'host_sync_ms'):.1f} |")
    if args.gaps:
        for r in runs:
            s = r.get("steps") or []
            if not s or not r["budget_bytes"]:
                continue
            tl = s[-1]["timeline"]
            print(f"\n{r['config']}, last profiled step: compute-stream gaps of 0.1 ms or more, copies of 1 MiB or more")
            for g in tl["gaps"]:
                print(f"  gap   {g['at_ms']:8.2f} ms  {g['ms']:6.2f} ms  {g['cause']:<10} host {g['host_ms']:.2f}  "
                      f"then {g['next']}")
            for c in tl["copies"]:
                queued = f"queued {c['queued_ms']:8.2f} ms" if c.get("queued_ms") is not None else ""
                print(f"  copy  {c['at_ms']:8.2f} ms  {c['ms']:6.2f} ms  {c['mib']:7.1f} MiB  {c['what']}  {queued}")
            for h in tl["host_syncs"]:
                print(f"  sync  {h['at_ms']:8.2f} ms  {h['ms']:6.2f} ms  {h['what']}")
    for r in runs:
        if r.get("exit_line"):
            print(f"  {r['config']}: {r['exit_line'][r['exit_line'].find('driver:'):]}")
    if args.out:
        benchlib.write_result(args.out, {"schema": "vcudnn.bench.profile_step/1", "command": benchlib.command_line(),
                                         "environment": benchlib.environment(os.path.dirname(args.bin)),
                                         "model": args.model, "batch": args.batch, "warmup": args.warmup,
                                         "budgets_percent": budgets, "runs": runs})


if __name__ == "__main__":
    main()
