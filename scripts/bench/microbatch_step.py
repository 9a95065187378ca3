#!/usr/bin/env python3
"""Worker of scripts/bench/microbatch, part B: one PyTorch training configuration in its own process.
Synthetic data, SGD; the driver sets the environment (TORCH_CUDNN_V8_API_DISABLED=1 for the legacy path,
LD_PRELOAD / VCUDNN_* for the vcudnn configurations). Times the first step alone (where vcudnn plans), then windows of steps after the
warm-up, as pytorch_step.py does; writes one JSON object to --out."""
import argparse
import json
import os
import time

import benchlib


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=15, help="untimed steps, the first one included")
    p.add_argument("--steps", type=int, default=40, help="timed steps")
    p.add_argument("--window", type=int, default=5, help="steps per timed window (one synchronization each)")
    p.add_argument("--benchmark", type=int, choices=(0, 1), default=0, help="torch.backends.cudnn.benchmark")
    p.add_argument("--out", required=True, help="JSON result file")
    args = p.parse_args()

    import torch
    if not torch.cuda.is_available():
        raise SystemExit("microbatch_step.py: no CUDA device visible to PyTorch")
    torch.backends.cudnn.enabled = True
    step = benchlib.training_step(args.model, args.batch, args.size, args.benchmark)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()  # cudnn.benchmark searches here; vcudnn records and plans during the first iterations
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(max(0, args.warmup - 1)):
        step()
    torch.cuda.synchronize()
    warmup_ms = (time.perf_counter() - t0) * 1e3
    peak_warmup = torch.cuda.max_memory_allocated()
    reserved_warmup = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()

    window = max(1, min(args.window, args.steps))
    windows = []
    for _ in range(max(1, args.steps // window)):
        t = time.perf_counter()
        for _ in range(window):
            step()
        torch.cuda.synchronize()
        windows.append((time.perf_counter() - t) * 1e3 / window)
    result = {
        "model": args.model,
        "batch": args.batch,
        "size": args.size,
        "benchmark": bool(args.benchmark),
        "warmup": args.warmup,
        "steps": args.steps,
        "window": window,
        "first_step_ms": first_ms,
        "warmup_ms": warmup_ms,
        "window_step_ms": windows,
        # max_memory_allocated includes the workspaces PyTorch allocates through its caching allocator (and, with
        # benchmark=True, the search's); "steady" is after the warm-up, once every algorithm has been chosen.
        "peak_bytes": max(peak_warmup, torch.cuda.max_memory_allocated()),
        "steady_peak_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": max(reserved_warmup, torch.cuda.max_memory_reserved()),
        "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
        f.write("\n")


if __name__ == "__main__":
    main()
