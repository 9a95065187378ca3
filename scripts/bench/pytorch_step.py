#!/usr/bin/env python3
"""PyTorch training step time with and without vcudnn (LD_PRELOAD, policy record), on cuDNN's legacy API
(TORCH_CUDNN_V8_API_DISABLED=1, the default here) or PyTorch's default path (--api default: every convolution through
cuDNN's graph API). Worker processes alternate (alone, vcudnn, vcudnn, alone, ...) in one run; each times its warm-up
steps one by one (synchronised: the recording iterations' cost), then windows of steps. The ratio is the median over
adjacent pairs of workers of their median step times. Prints a table, writes JSON."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

import benchlib


def worker(args):
    import time

    import torch
    step = benchlib.training_step(args.model, args.batch, args.size)

    warmup_ms = []
    for _ in range(args.warmup):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        warmup_ms.append((time.perf_counter() - t0) * 1e3)
    # Windows of several steps with one synchronization each: the host may run ahead inside a
    # window as in real training, and the per-step sync jitter does not dominate.
    windows = []
    for _ in range(max(1, args.steps // args.window)):
        t0 = time.perf_counter()
        for _ in range(args.window):
            step()
        torch.cuda.synchronize()
        windows.append((time.perf_counter() - t0) * 1e3 / args.window)
    print(json.dumps({"window_step_ms": windows, "warmup_step_ms": warmup_ms,
                      "peak_bytes": torch.cuda.max_memory_allocated()}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=60, help="timed steps per worker")
    p.add_argument("--window", type=int, default=5, help="steps per timed window")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--reps", type=int, default=4, help="worker pairs, alternating order")
    p.add_argument("--api", choices=("legacy", "default"), default="legacy",
                   help="legacy: TORCH_CUDNN_V8_API_DISABLED=1; default: PyTorch's default path (cuDNN's graph API)")
    p.add_argument("--quick", action="store_true", help="batch 32, 30 steps, 1 pair")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(benchlib.ROOT, "scripts/bench/results/pytorch_step.json"))
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.batch, args.steps, args.reps, args.warmup = 32, 30, 1, 10
    lib = os.path.join(benchlib.build_bin(), "libvcudnn.so")
    windows = {"alone": [], "vcudnn": []}
    warmups = {"alone": [], "vcudnn": []}  # per worker: each warm-up step's time
    per_worker = []  # (config, median window step ms), in run order
    peak = {}
    order = []
    for rep in range(args.reps):
        order += ["alone", "vcudnn"] if rep % 2 == 0 else ["vcudnn", "alone"]
    self_ms = []  # vcudnn's own host time per vcudnn worker, from its exit line
    log_path = os.path.join(os.path.dirname(os.path.abspath(args.out)), f".pytorch_step_vcudnn_{os.getpid()}.log")
    for cfg in order:
        env = dict(os.environ, VCUDNN_LOG_LEVEL="warn")
        env.pop("LD_PRELOAD", None)
        env.pop("TORCH_CUDNN_V8_API_DISABLED", None)
        if args.api == "legacy":
            env["TORCH_CUDNN_V8_API_DISABLED"] = "1"
        if cfg == "vcudnn":
            env.update(LD_PRELOAD=lib, VCUDNN_LOG_LEVEL="info", VCUDNN_LOG_FILE=log_path)
            if os.path.exists(log_path):
                os.remove(log_path)
        cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--batch", str(args.batch), "--size",
               str(args.size), "--steps", str(args.steps), "--window", str(args.window), "--warmup",
               str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{cfg}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        windows[cfg] += r["window_step_ms"]
        warmups[cfg].append(r["warmup_step_ms"])
        per_worker.append((cfg, statistics.median(r["window_step_ms"])))
        peak[cfg] = r["peak_bytes"]
        if cfg == "vcudnn":
            with open(log_path) as f:
                log = f.read()
            m = re.search(r"exit: (\d+) calls .*?; ([0-9.]+) ms inside vcudnn", log)
            found = re.search(r"iteration found \((\w+)\): calls (\d+)\.\.(\d+)", log)
            self_ms.append({"calls": int(m.group(1)), "ms": float(m.group(2)),
                            "iteration": [int(found.group(2)), int(found.group(3))] if found else None})
            os.remove(log_path)
    # Ratio per adjacent pair of workers (same moment of the machine), then their median.
    pair_ratios = []
    for i in range(0, len(per_worker) - 1, 2):
        d = dict(per_worker[i:i + 2])
        pair_ratios.append(d["vcudnn"] / d["alone"])
    med = {k: statistics.median(v) for k, v in windows.items()}
    ratio = statistics.median(pair_ratios)
    api = "legacy cuDNN API" if args.api == "legacy" else "PyTorch's default path (cuDNN graph API)"
    print(f"\n{args.model} batch {args.batch} fp32, {api}; {len(order)} workers alternating, each "
          f"{args.warmup} warm-up + {args.steps} timed steps in windows of {args.window}")
    print("| config | median step (ms) | min window | max window | peak allocated (GiB) |")
    print("|---|---:|---:|---:|---:|")
    for k in ("alone", "vcudnn"):
        print(f"| {'PyTorch alone' if k == 'alone' else 'PyTorch + vcudnn (record)'} | {med[k]:.2f} | "
              f"{min(windows[k]):.2f} | {max(windows[k]):.2f} | {peak[k] / 2**30:.2f} |")
    print("per-pair ratios vcudnn/alone: " + ", ".join(f"{r:.3f}" for r in pair_ratios))
    steps_per_worker = args.warmup + args.steps
    own = statistics.median(s["ms"] for s in self_ms) / steps_per_worker
    print(f"vcudnn's own host time (its exit line; recording of the first iterations included): "
          f"{own:.4f} ms per step = {100 * own / med['alone']:.3f}% of a step, "
          f"{statistics.median(s['calls'] for s in self_ms) / steps_per_worker:.0f} intercepted calls per step")
    # The recording iterations: each warm-up step's median over the workers of a config, side by side.
    first = {k: [statistics.median(w[i] for w in v) for i in range(args.warmup)] for k, v in warmups.items()}
    shown = min(args.warmup, 8)
    print("\nwarm-up steps one by one (median over workers, ms; vcudnn records until it finds a steady iteration):")
    print("| step | " + " | ".join(str(i + 1) for i in range(shown)) + " |")
    print("|---|" + "---:|" * shown)
    for k in ("alone", "vcudnn"):
        print(f"| {'PyTorch alone' if k == 'alone' else 'PyTorch + vcudnn'} | "
              + " | ".join(f"{first[k][i]:.1f}" for i in range(shown)) + " |")
    extra = sum(first["vcudnn"][i] - first["alone"][i] for i in range(shown))
    print(f"recording cost: {extra:.1f} ms over the first {shown} steps (vcudnn minus alone, per-step medians)")
    print(f"\nstep-time ratio vcudnn / alone (median of pairs): {ratio:.4f} (target ≤ 1.01)")
    benchlib.write_result(args.out, {
        "schema": "vcudnn.bench.pytorch_step/2",
        "command": benchlib.command_line(),
        "environment": benchlib.environment(),
        "model": args.model, "batch": args.batch, "size": args.size, "dtype": "fp32",
        "cudnn_api": "legacy (TORCH_CUDNN_V8_API_DISABLED=1)" if args.api == "legacy" else "default (graph API)",
        "warmup_step_ms": warmups,
        "warmup_median_ms": first,
        "recording_cost_ms": extra,
        "warmup": args.warmup, "steps": args.steps, "window": args.window,
        "order": order,
        "window_step_ms": windows,
        "per_worker_median_ms": per_worker,
        "pair_ratios": pair_ratios,
        "median_ms": med,
        "peak_allocated_bytes": peak,
        "ratio": ratio,
        "vcudnn_self": self_ms,
        "vcudnn_self_ms_per_step": own,
    })


if __name__ == "__main__":
    main()
