#!/usr/bin/env python3
"""Worker of scripts/bench/offload: one training configuration in its own process. Synthetic data generated on the
CPU from the seed (benchlib.synthetic_step), PyTorch's default numerics (cuDNN's heuristics, TF32 convolutions as
PyTorch ships them). The driver sets the environment (PYTORCH_CUDA_ALLOC_CONF, LD_PRELOAD, VCUDNN_*). Runs the
warm-up steps, then times each step alone (synchronised before and after), and reads vcudnnGetMemoryStats() after
the warm-up and at the end, so that the eviction traffic per step counts timed steps only. Peak memory (PyTorch's and
vcudnn's peakMappedBytes) is reset after the warm-up: the peaks reported are the steady state's, the warm-up's
(cudnn.benchmark's search) are kept apart. Writes one JSON object."""
import argparse
import json
import math
import os
import statistics
import time

import benchlib

COUNTERS = ("evictions", "restores", "faultIns", "bytesEvicted", "bytesRestored", "allocations", "cacheHits",
            "failedAllocations", "trackedCalls", "hostWaits", "streamWaits", "evictionsStarted", "freshBytes")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet50", help="resnet18, resnet50, transformer or a torchvision model")
    p.add_argument("--benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="image side for the resnets")
    p.add_argument("--seq", type=int, default=256, help="tokens per sample for the transformer")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="torch.compile the model (default, reduce-overhead, ...); the compile runs in the warm-up")
    p.add_argument("--torch-offload", choices=("save_on_cpu", "checkpoint"),
                   help="PyTorch's own memory saving instead (benchlib.synthetic_step)")
    p.add_argument("--amp", choices=("bf16",), help="autocast the forward")
    p.add_argument("--out", required=True, help="JSON result file")
    args = p.parse_args()

    import torch
    if not torch.cuda.is_available():
        raise SystemExit("offload_step.py: no CUDA device visible to PyTorch")
    torch.backends.cudnn.benchmark = args.benchmark
    step = benchlib.synthetic_step(args.model, args.batch, size=args.size, seq=args.seq, seed=args.seed,
                                   compile_mode=args.compile, torch_offload=args.torch_offload, amp=args.amp)

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        loss = step()
    torch.cuda.synchronize()
    warmup_ms = (time.perf_counter() - t0) * 1e3
    warmup_peaks = benchlib.torch_peak_memory()
    # Steady-state peaks: from here on (cudnn.benchmark's search, in the first step, may take the whole card).
    torch.cuda.reset_peak_memory_stats()
    benchlib.vcudnn_reset_memory_peak()
    before = benchlib.vcudnn_memory_stats()
    step_ms = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t) * 1e3)
    last_loss = loss.item()
    after = benchlib.vcudnn_memory_stats()
    per_step = None
    if isinstance(before, dict) and isinstance(after, dict) and "error" not in before and "error" not in after:
        per_step = {k: (after[k] - before[k]) / max(1, args.steps) for k in COUNTERS}
    result = {
        "schema": "vcudnn.bench.offload_step_worker/1",
        "model": args.model, "batch": args.batch, "cudnn_benchmark": args.benchmark,
        "size": args.size if args.model != "transformer" else None,
        "seq": args.seq if args.model == "transformer" else None,
        "warmup": args.warmup, "steps": args.steps, "seed": args.seed,
        "torch_offload": args.torch_offload, "amp": args.amp,
        "warmup_ms": warmup_ms,
        "step_ms": step_ms,
        "median_step_ms": statistics.median(step_ms) if step_ms else None,
        "last_loss": last_loss,
        "finite": math.isfinite(last_loss),
        **benchlib.torch_peak_memory(),  # timed steps only (reset after the warm-up)
        "warmup_peaks": warmup_peaks,
        "vcudnn_after_warmup": before,
        "vcudnn": after,
        "vcudnn_per_timed_step": per_step,
        **benchlib.torch_versions(),
        "vcudnn_env": {k: v for k, v in os.environ.items() if k.startswith("VCUDNN_")},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
