#!/usr/bin/env python3
"""The cost of vcudnn's memory ownership without a budget (VCUDNN_POLICY=offload, no VCUDNN_DEVICE_BUDGET) against
PyTorch alone (both with cudaMallocAsync), measured in lockstep: each configuration runs in long-lived worker
processes that compile and warm up once, then take turns on the GPU, one block of steps at a time (alone, vcudnn,
vcudnn, alone, ...), so that both see the same moments of the machine. One process per configuration per run gave
ratios whose rounds spread ±20% with torch.compile (README, issue 11): the compile, the process's memory layout and
the machine's drift all differ between processes; here the drift is shared by both sides of each pair of blocks,
and several worker pairs show what differs between processes.

Only one worker runs at a time (the others wait on a pipe with their CUDA context idle). A block is `--block`
steps with one synchronisation at its end, as training runs. The ratio is the median over every (pair, round) of
vcudnn's block / the alone block next to it; its 95% interval is a bootstrap over those ratios. Prints a table,
writes JSON (scripts/bench/results/lockstep_step[-TAG].json)."""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ASYNC = "backend:cudaMallocAsync"
BATCH = {"resnet18": 64, "resnet50": 64, "transformer": 32, "mobilenet_v3_small": 64}
CONFIGS = ("alone", "vcudnn")


# --------------------------------------------------------------------------------------------------------------------
# Worker: one training configuration, steered through stdin ("run B", "quit"); answers one JSON line each.

def worker(args):
    import torch

    step = benchlib.synthetic_step(args.model, args.batch, compile_mode=args.compile, amp=args.amp)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    stats = benchlib.vcudnn_memory_stats()
    print(json.dumps({"ready": True, "warmup_s": time.perf_counter() - t0,
                      "vcudnn_active": bool(isinstance(stats, dict) and stats.get("active") == 1)}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        n = int(cmd[1])
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            loss = step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3 / n
        print(json.dumps({"ms_per_step": ms, "loss": loss.item()}), flush=True)
    stats = benchlib.vcudnn_memory_stats()
    print(json.dumps({"done": True, "vcudnn": stats, **benchlib.torch_peak_memory()}), flush=True)


# --------------------------------------------------------------------------------------------------------------------
# Driver

class Worker:
    def __init__(self, args, lib, tmp, model, cfg, index):
        self.cfg = cfg
        self.log = os.path.join(tmp, f"{model}-{cfg}-{index}.log") if cfg == "vcudnn" else None
        env = dict(os.environ)
        for k in ("LD_PRELOAD", "TORCH_CUDNN_V8_API_DISABLED"):
            env.pop(k, None)
        for k in [k for k in env if k.startswith("VCUDNN_")]:
            env.pop(k)
        env.update(PYTORCH_CUDA_ALLOC_CONF=ASYNC, PYTHONUNBUFFERED="1", LD_LIBRARY_PATH=benchlib.runtime_library_path())
        if args.compile:  # one compile cache per model: the first worker compiles, the others load its kernels
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, model, "inductor")
            env["TRITON_CACHE_DIR"] = os.path.join(tmp, model, "triton")
        if cfg == "vcudnn":
            env.update(LD_PRELOAD=lib, VCUDNN_POLICY="offload", VCUDNN_LOG_LEVEL="info", VCUDNN_LOG_FILE=self.log)
        cmd = [args.python, os.path.abspath(__file__), "--worker", "--model", model, "--worker-batch",
               str(args.batch.get(model, BATCH.get(model, 64))), "--warmup", str(args.warmup)]
        cmd += ["--compile", args.compile] if args.compile else []
        cmd += ["--amp", args.amp] if args.amp else []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.ready = self.answer()
        if cfg == "vcudnn" and not self.ready.get("vcudnn_active"):
            raise SystemExit(f"{model} {cfg}: vcudnn is not active in the worker (see {self.log})")

    def answer(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise SystemExit(f"{self.cfg} worker exited {self.proc.returncode}:\n{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def run(self, steps):
        self.proc.stdin.write(f"run {steps}\n")
        self.proc.stdin.flush()
        return self.answer()

    def finish(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        done = self.answer()
        self.proc.wait(timeout=120)
        if self.log:
            log = open(self.log, errors="replace").read() if os.path.exists(self.log) else ""
            m = re.search(r"exit: (\d+) calls .*?; ([0-9.]+) ms inside vcudnn", log)
            done["vcudnn_host_ms"] = float(m.group(2)) if m else None
            exits = [ln for ln in log.splitlines() if "exit:" in ln]
            done["exit_line"] = exits[-1] if exits else None
        return done


def bootstrap_median(values, reps=10000, seed=0):
    """95% percentile interval of the median of `values`, resampled with replacement."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def run_model(args, lib, tmp, model):
    pairs = []
    try:
        for i in range(args.pairs):
            pairs.append({cfg: Worker(args, lib, tmp, model, cfg, i) for cfg in CONFIGS})
            print(f"{model}: pair {i} ready (warm-up {pairs[-1]['alone'].ready['warmup_s']:.0f} s alone, "
                  f"{pairs[-1]['vcudnn'].ready['warmup_s']:.0f} s vcudnn)", file=sys.stderr)
        blocks = []  # (pair, round, cfg, ms per step)
        for r in range(args.rounds):
            for i, pair in enumerate(pairs):
                for cfg in (CONFIGS if (r + i) % 2 == 0 else CONFIGS[::-1]):
                    blocks.append((i, r, cfg, pair[cfg].run(args.block)["ms_per_step"]))
        ends = [{cfg: pair[cfg].finish() for cfg in CONFIGS} for pair in pairs]
    finally:
        for pair in pairs:
            for w in pair.values():
                if w.proc.poll() is None:
                    w.proc.kill()
    ms = {(i, r, cfg): v for i, r, cfg, v in blocks}
    ratios = [ms[(i, r, "vcudnn")] / ms[(i, r, "alone")] for i in range(args.pairs) for r in range(args.rounds)]
    lo, hi = bootstrap_median(ratios)
    per_pair = [statistics.median(ms[(i, r, "vcudnn")] / ms[(i, r, "alone")] for r in range(args.rounds))
                for i in range(args.pairs)]
    steps = (args.warmup + args.rounds * args.block)
    host = [e["vcudnn"].get("vcudnn_host_ms") for e in ends]
    return {
        "model": model, "batch": args.batch.get(model, BATCH.get(model, 64)),
        "blocks": [{"pair": i, "round": r, "config": c, "ms_per_step": v} for i, r, c, v in blocks],
        "median_ms": {c: statistics.median(v for (_, _, cc), v in ms.items() if cc == c) for c in CONFIGS},
        "ratios": ratios, "ratio": statistics.median(ratios), "ratio_ci95": [lo, hi],
        "per_pair_ratio": per_pair,
        "vcudnn_host_ms_per_step": [h / steps if h is not None else None for h in host],
        "peaks": [{c: {k: e[c].get(k) for k in ("max_memory_allocated", "max_memory_reserved")} for c in CONFIGS}
                  for e in ends],
        "vcudnn_peak_mapped": [(e["vcudnn"].get("vcudnn") or {}).get("peakMappedBytes") for e in ends],
        "exit_lines": [e["vcudnn"].get("exit_line") for e in ends],
    }


def report(results, args):
    mode = f"torch.compile ({args.compile})" if args.compile else "eager"
    print(f"\n{mode}; {args.pairs} worker pairs x {args.rounds} rounds of {args.block}-step blocks, in lockstep")
    print("| model | PyTorch alone (ms/step) | vcudnn owned | ratio (median) | 95% interval | per pair | "
          "vcudnn host ms/step |")
    print("|---|---:|---:|---:|---|---|---:|")
    for m in results:
        host = [h for h in m["vcudnn_host_ms_per_step"] if h is not None]
        print(f"| {m['model']} b{m['batch']} | {m['median_ms']['alone']:.2f} | {m['median_ms']['vcudnn']:.2f} | "
              f"**{m['ratio']:.4f}** | {m['ratio_ci95'][0]:.4f}-{m['ratio_ci95'][1]:.4f} | "
              f"{', '.join(f'{r:.3f}' for r in m['per_pair_ratio'])} | "
              f"{statistics.median(host) if host else float('nan'):.3f} |")


def batches(s):
    out = {}
    for part in filter(None, s.split(",")):
        k, v = part.split("=")
        out[k] = int(v)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,transformer", help="comma-separated (resnet18, resnet50, "
                   "transformer, or a torchvision model)")
    p.add_argument("--batch", type=batches, default={}, help="overrides, e.g. resnet18=32")
    p.add_argument("--compile", default=None, metavar="MODE", help="torch.compile mode (default, ...); eager if unset")
    p.add_argument("--amp", choices=("bf16",))
    p.add_argument("--pairs", type=int, default=2, help="worker pairs per model (processes alive at once: 2x)")
    p.add_argument("--rounds", type=int, default=20, help="turns each worker takes")
    p.add_argument("--block", type=int, default=20, help="steps per turn, one synchronisation at its end")
    p.add_argument("--warmup", type=int, default=10, help="steps before the first turn (the compile runs here)")
    p.add_argument("--bin", help="folder with libvcudnn.so (default <repo>/build/bin)")
    p.add_argument("--python", default=os.environ.get("VCUDNN_TEST_PYTHON") or sys.executable)
    p.add_argument("--quick", action="store_true", help="smoke run: resnet18 b16, 1 pair, 3 rounds of 3 steps")
    p.add_argument("--tag", help="result file lockstep_step-TAG.json")
    p.add_argument("--out-dir", help="default scripts/bench/results (build/gpu-test with --quick)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--worker-batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.batch = args.worker_batch
        return worker(args)
    if args.quick:
        args.models, args.batch, args.pairs, args.rounds, args.block, args.warmup = "resnet18", {"resnet18": 16}, 1, 3, 3, 3
    bindir = os.path.abspath(args.bin) if args.bin else benchlib.build_bin()
    lib = os.path.join(bindir, "libvcudnn.so")
    if not os.path.exists(lib):
        raise SystemExit(f"lockstep_step: {lib} not found (build first: scripts/build, or pass --bin)")
    tmp = tempfile.mkdtemp(prefix="vcudnn-lockstep-")
    try:
        results = [run_model(args, lib, tmp, m) for m in args.models.split(",") if m]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, args)
    out_dir = args.out_dir or os.path.join(benchlib.ROOT, "build/gpu-test" if args.quick else "scripts/bench/results")
    environment = benchlib.environment()
    environment["vcudnn_info"] = benchlib._run([os.path.join(bindir, "vcudnn"), "info"]).splitlines()[:6]
    with open(lib, "rb") as f:
        environment["libvcudnn_md5"] = hashlib.md5(f.read()).hexdigest()
    benchlib.write_result(os.path.join(out_dir, f"lockstep_step{'-' + args.tag if args.tag else ''}.json"), {
        "schema": "vcudnn.bench.lockstep_step/1",
        "command": benchlib.command_line(),
        "environment": environment,
        "compile": args.compile, "amp": args.amp, "pairs": args.pairs, "rounds": args.rounds, "block": args.block,
        "warmup": args.warmup,
        "models": results,
    })


if __name__ == "__main__":
    main()
