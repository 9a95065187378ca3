#!/usr/bin/env python3
"""PyTorch training step time with and without vcudnn (LD_PRELOAD), on cuDNN's legacy API
(TORCH_CUDNN_V8_API_DISABLED=1). Worker processes alternate (alone, vcudnn, vcudnn, alone, ...)
in one run; each times its steps with CUDA events after a warm-up. Reports medians and the ratio,
writes JSON."""
import argparse
import json
import os
import statistics
import subprocess
import sys

import benchlib


def worker(args):
    import torch
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    model = getattr(torchvision.models, args.model)(num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, args.size, args.size, device="cuda")
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    times = []
    for i in range(args.warmup + args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        end.record()
        end.synchronize()
        if i >= args.warmup:
            times.append(start.elapsed_time(end))
    print(json.dumps({"step_ms": times, "peak_bytes": torch.cuda.max_memory_allocated()}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--reps", type=int, default=3, help="worker pairs, alternating order")
    p.add_argument("--quick", action="store_true", help="batch 32, 30 steps, 1 pair")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(benchlib.ROOT, "scripts/bench/results/pytorch_step.json"))
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.batch, args.steps, args.reps = 32, 30, 1
    lib = os.path.join(benchlib.build_bin(), "libvcudnn.so")
    steps = {"alone": [], "vcudnn": []}
    peak = {}
    order = []
    for rep in range(args.reps):
        order += ["alone", "vcudnn"] if rep % 2 == 0 else ["vcudnn", "alone"]
    for cfg in order:
        env = dict(os.environ, TORCH_CUDNN_V8_API_DISABLED="1", VCUDNN_LOG_LEVEL="warn")
        env.pop("LD_PRELOAD", None)
        if cfg == "vcudnn":
            env["LD_PRELOAD"] = lib
        cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--batch", str(args.batch), "--size",
               str(args.size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{cfg}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        steps[cfg] += r["step_ms"]
        peak[cfg] = r["peak_bytes"]
    med = {k: statistics.median(v) for k, v in steps.items()}
    ratio = med["vcudnn"] / med["alone"]
    print(f"\n{args.model} batch {args.batch} fp32, legacy cuDNN API, {len(steps['alone'])} steps per config "
          f"({args.reps} alternating pairs)")
    print("| config | median step (ms) | min | max | peak allocated (GiB) |")
    print("|---|---:|---:|---:|---:|")
    for k in ("alone", "vcudnn"):
        print(f"| {'PyTorch alone' if k == 'alone' else 'PyTorch + vcudnn (record)'} | {med[k]:.2f} | "
              f"{min(steps[k]):.2f} | {max(steps[k]):.2f} | {peak[k] / 2**30:.2f} |")
    print(f"\nstep-time ratio vcudnn / alone: {ratio:.4f} (target ≤ 1.01)")
    benchlib.write_result(args.out, {
        "schema": "vcudnn.bench.pytorch_step/1",
        "command": benchlib.command_line(),
        "environment": benchlib.environment(),
        "model": args.model, "batch": args.batch, "size": args.size, "dtype": "fp32",
        "cudnn_api": "legacy (TORCH_CUDNN_V8_API_DISABLED=1)",
        "order": order,
        "step_ms": steps,
        "median_ms": med,
        "peak_allocated_bytes": peak,
        "ratio": ratio,
    })


if __name__ == "__main__":
    main()
