"""Worker of offload_test.cpp: trains resnet18 / resnet50 / a TransformerEncoder for a few steps, deterministically,
and writes one JSON object: the losses (exact, as float.hex, and as floats), the wall time of each step
(synchronised), PyTorch's peak memory statistics and, when libvcudnn.so is preloaded, vcudnnGetMemoryStats() after
training (peaks reset after the third step, so that vcudnn's peakMappedBytes and steady_max_memory_* are the
steady state's; max_memory_* are the first three steps'; give --steps 4 or more). The caller sets the environment (PYTORCH_CUDA_ALLOC_CONF, LD_PRELOAD,
VCUDNN_*).

Deterministic by construction, so that runs in different processes can be compared bit for bit: deterministic
algorithms only (cuDNN and cuBLAS included), no cudnn.benchmark search, no TF32, fixed seeds, and data generated on
the CPU from the seed (benchlib.synthetic_step). --benchmark gives that up for the cuDNN search most vision scripts
use (the caller compares with two runs of PyTorch alone)."""
import argparse
import json
import math
import os
import sys
import time

# cuBLAS is deterministic only with a fixed workspace configuration, read when CUDA is initialised.
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts", "bench"))
import benchlib  # noqa: E402


def make_deterministic(torch):
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if hasattr(torch.backends, "fp32_precision"):  # PyTorch >= 2.9 (the allow_tf32 flags are deprecated)
        torch.backends.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18", help="resnet18, resnet50, transformer or a torchvision model")
    p.add_argument("--benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True, as most vision scripts set it: cuDNN algorithms "
                        "chosen by timing (no longer deterministic run to run)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=224, help="image side for the resnets")
    p.add_argument("--classes", type=int, default=10, help="classes for the resnets")
    p.add_argument("--seq", type=int, default=256, help="tokens per sample for the transformer")
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="torch.compile the model: default, reduce-overhead (CUDA graphs), max-autotune-no-cudagraphs")
    p.add_argument("--graphed", action="store_true", help="torch.cuda.make_graphed_callables on the model")
    p.add_argument("--ddp", type=int, default=0, metavar="N",
                   help="DistributedDataParallel on N GPUs (NCCL; one process each, rank r on GPU r, its data seeded "
                        "with seed + r): the result is rank 0's, with every rank's in \"ranks\"")
    p.add_argument("--json", required=True, help="result file")
    args = p.parse_args()
    if args.ddp:
        return run_ddp(args)

    train(args)


def train(args, rank=None):
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("train_offload.py: no CUDA device visible to PyTorch")
    make_deterministic(torch)
    wrap, seed = None, args.seed
    if rank is not None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method="file://" + os.path.abspath(args.json) + ".rendezvous",
                                rank=rank, world_size=args.ddp, device_id=torch.device("cuda", rank))
        seed = args.seed + rank

        def wrap(model):
            return DistributedDataParallel(model, device_ids=[rank])
    if args.compile:
        import torch._inductor.config as inductor_config
        if hasattr(inductor_config, "deterministic"):  # no kernel choice by timing (PyTorch >= 2.7)
            inductor_config.deterministic = True
        # Dropout through PyTorch's own generator: with Inductor's random kernels the transformer's
        # losses differ run to run under PyTorch alone (measured on the H100, PyTorch 2.11).
        inductor_config.fallback_random = True
    if args.benchmark:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.benchmark = True
    if args.model.startswith("vgg") and args.size == 224:
        # VGG's AdaptiveAvgPool2d((7, 7)) meets a 7x7 map at 224x224: an identity, whose backward has no
        # deterministic kernel (torch.use_deterministic_algorithms refuses it). Removed, the model computes the same.
        outer = wrap

        def wrap(model):
            model.avgpool = torch.nn.Identity()
            return outer(model) if outer else model
    step = benchlib.synthetic_step(args.model, args.batch, size=args.size, seed=seed, num_classes=args.classes,
                                   seq=args.seq, pin_cores=False, compile_mode=args.compile, graphed=args.graphed,
                                   wrap=wrap)
    losses, step_ms, first_step_peaks = [], [], None
    for i in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        if i == min(2, args.steps - 2):  # the steady state's peaks: after three steps (cudnn.benchmark's search; memory it left idle
            # goes back to the device two synchronisations later under vcudnn, at synchronisation in cudaMallocAsync's pool)
            first_step_peaks = benchlib.torch_peak_memory()
            first_step_peaks["vcudnn"] = benchlib.vcudnn_memory_stats()
            torch.cuda.reset_peak_memory_stats()
            benchlib.vcudnn_reset_memory_peak()
    torch.cuda.synchronize()
    if first_step_peaks is None:  # a single step: no steady state apart from it
        first_step_peaks = benchlib.torch_peak_memory()
        first_step_peaks["vcudnn"] = benchlib.vcudnn_memory_stats()
    steady = benchlib.torch_peak_memory()
    result = {
        "schema": "vcudnn.test.train_offload/1",
        "model": args.model, "batch": args.batch, "steps": args.steps, "seed": args.seed,
        "size": args.size if args.model != "transformer" else None,
        "seq": args.seq if args.model == "transformer" else None,
        "losses": [float.hex(v) for v in losses],
        "loss_values": losses,
        "finite": all(math.isfinite(v) for v in losses),
        "step_ms": step_ms,
        "cudnn_benchmark": args.benchmark,
        "compile": args.compile,
        "graphed": args.graphed,
        **first_step_peaks,  # max_memory_allocated / reserved of the first three steps
        "steady_max_memory_allocated": steady["max_memory_allocated"],
        "steady_max_memory_reserved": steady["max_memory_reserved"],
        "vcudnn_first_step": first_step_peaks.pop("vcudnn"),
        "vcudnn": benchlib.vcudnn_memory_stats(),  # peakMappedBytes: the steps after the first
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        **benchlib.torch_versions(),
    }
    if rank is not None:
        import torch.distributed as dist
        result["rank"], result["pid"] = rank, os.getpid()
        dist.destroy_process_group()
    with open(args.json if rank is None else f"{args.json}.rank{rank}", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{args.model}{'' if rank is None else f' rank {rank}'}: losses {' '.join(f'{v:.6f}' for v in losses)}; "
          f"step ms {' '.join(f'{v:.1f}' for v in step_ms)}", flush=True)


def ddp_worker(rank, args):
    train(args, rank)


def run_ddp(args):
    """--ddp N: N processes started afresh (spawn: each loads what LD_PRELOAD names, as torchrun's would)."""
    import torch.multiprocessing as mp
    rendezvous = os.path.abspath(args.json) + ".rendezvous"
    if os.path.exists(rendezvous):
        os.remove(rendezvous)
    mp.spawn(ddp_worker, args=(args,), nprocs=args.ddp, join=True)
    ranks = []
    for r in range(args.ddp):
        with open(f"{args.json}.rank{r}") as f:
            ranks.append(json.load(f))
    result = dict(ranks[0], ranks=ranks, ddp=args.ddp)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
