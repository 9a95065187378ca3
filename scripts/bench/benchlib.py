"""Shared by vcudnn's benchmark drivers: where things are, what machine this is, result files."""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_bin(build_dir=None):
    return os.path.join(build_dir or os.environ.get("VCUDNN_BUILD_DIR", os.path.join(ROOT, "build")), "bin")


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.strip()
    except Exception as e:  # noqa: BLE001 - environment facts are best effort
        return f"unavailable ({e})"


def environment(build_dir=None):
    """GPU, driver, library versions and the resolved cuDNN, for the result file."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "gpu": _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        "vcudnn_info": _run([os.path.join(build_bin(build_dir), "vcudnn"), "info"]).splitlines()[:6],
        "python": sys.version.split()[0],
    }
    try:
        import torch  # noqa: PLC0415 - optional

        env["torch"] = torch.__version__
        env["torch_cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        env["torch"] = None
    return env


def command_line():
    return " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def write_result(path, payload):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def library_path():
    """LD_LIBRARY_PATH entries for the C++ programs: PyTorch's cuDNN, then CUDA's libraries."""
    dirs = []
    try:
        import nvidia.cudnn  # noqa: PLC0415

        dirs.append(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))
    except Exception:  # noqa: BLE001
        pass
    dirs += ["/usr/local/cuda/lib64"]
    return ":".join(d for d in dirs if os.path.isdir(d))


def training_step(model_name, batch, size, benchmark=False):
    """A torchvision model's SGD training step on fixed synthetic data, for the PyTorch workers.
    Pins the worker to cores 2-7 (same cores for every worker: less placement noise)."""
    import torch
    import torch.nn.functional as F
    import torchvision

    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 8:
        os.sched_setaffinity(0, set(range(2, 8)))
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = bool(benchmark)
    model = getattr(torchvision.models, model_name)(num_classes=1000).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


# --------------------------------------------------------------------------------------------------------------------
# Memory ownership (VCUDNN_POLICY=offload): shared by tests/pytorch/train_offload.py and scripts/bench/offload*.

def runtime_library_path():
    """LD_LIBRARY_PATH for any program run under vcudnn: PyTorch's cuDNN, CUDA's libraries, the CUDA runtime of
    PyTorch's wheel (as scripts/gpu-test builds it), then the caller's own LD_LIBRARY_PATH."""
    import glob  # noqa: PLC0415

    dirs = [d for d in library_path().split(":") if d]
    if os.environ.get("CUDNN_ROOT"):
        dirs += [os.path.join(os.environ["CUDNN_ROOT"], s) for s in ("lib", "lib64")]
    try:
        import nvidia  # noqa: PLC0415 - optional (namespace package of PyTorch's wheels)

        for base in nvidia.__path__:
            for f in glob.glob(os.path.join(base, "**", "libcudart.so.1[0-9]"), recursive=True):
                if os.path.dirname(f) not in dirs:
                    dirs.append(os.path.dirname(f))
    except Exception:  # noqa: BLE001
        pass
    dirs = [d for d in dirs if os.path.isdir(d)]
    old = os.environ.get("LD_LIBRARY_PATH", "")
    return ":".join(dirs + ([old] if old else []))


# vcudnnMemoryStats_t of interpose/include/vcudnn/vcudnn.h, field for field, in order: keep the two in step.
MEMORY_STATS_FIELDS = (
    ("active", "c_int"),
    ("budgetBytes", "c_uint64"),
    ("mappedBytes", "c_uint64"),
    ("peakMappedBytes", "c_uint64"),
    ("liveBytes", "c_uint64"),
    ("cachedBytes", "c_uint64"),
    ("evictedBytes", "c_uint64"),
    ("hostBudgetBytes", "c_uint64"),
    ("allocations", "c_uint64"),
    ("frees", "c_uint64"),
    ("cacheHits", "c_uint64"),
    ("failedAllocations", "c_uint64"),
    ("evictions", "c_uint64"),
    ("restores", "c_uint64"),
    ("faultIns", "c_uint64"),
    ("bytesEvicted", "c_uint64"),
    ("bytesRestored", "c_uint64"),
    ("trackedCalls", "c_uint64"),
    ("trackedHits", "c_uint64"),
    ("foreignAllocations", "c_uint64"),
    ("fragmentation", "c_double"),
    ("hostWaits", "c_uint64"),
    ("streamWaits", "c_uint64"),
    ("evictionsStarted", "c_uint64"),
    ("evictionsCancelled", "c_uint64"),
    ("freshBytes", "c_uint64"),
    ("trimmedBytes", "c_uint64"),
)


def _vcudnn_symbol(name):
    """A function of the libvcudnn.so loaded in this process (LD_PRELOAD), or None."""
    import ctypes  # noqa: PLC0415

    try:
        return getattr(ctypes.CDLL(None), name)  # the preloaded library's symbols are global
    except AttributeError:
        return None


def vcudnn_reset_memory_peak():
    """vcudnnResetMemoryPeak(): peakMappedBytes starts again from what is mapped now (as
    torch.cuda.reset_peak_memory_stats does for PyTorch's pool). False when no vcudnn owns memory here."""
    import ctypes  # noqa: PLC0415

    fn = _vcudnn_symbol("vcudnnResetMemoryPeak")
    if fn is None:
        return False
    fn.restype = ctypes.c_int
    return fn() == 0


def vcudnn_memory_stats():
    """vcudnnGetMemoryStats() of the libvcudnn.so loaded in this process (LD_PRELOAD) as a dict, or None when no
    vcudnn is loaded. {"error": status} when the call fails. Synchronise the device first for settled numbers."""
    import ctypes  # noqa: PLC0415

    class Stats(ctypes.Structure):
        _fields_ = [(name, getattr(ctypes, kind)) for name, kind in MEMORY_STATS_FIELDS]

    try:
        fn = ctypes.CDLL(None).vcudnnGetMemoryStats  # the preloaded library's symbols are global
    except AttributeError:
        return None
    fn.argtypes = [ctypes.POINTER(Stats)]
    fn.restype = ctypes.c_int  # cudnnStatus_t
    stats = Stats()
    status = fn(ctypes.byref(stats))
    if status != 0:
        return {"error": status}
    return {name: getattr(stats, name) for name, _ in MEMORY_STATS_FIELDS}


OFFLOAD_MODELS = ("resnet18", "resnet50", "transformer")


def synthetic_step(model_name, batch, size=224, seed=0, num_classes=1000, seq=256, vocab=1000, pin_cores=True,
                   compile_mode=None, graphed=False, torch_offload=None, amp=None, wrap=None):
    """A training step on synthetic data generated on the CPU from `seed`, so that every process, whatever it
    preloads, starts from the same weights and sees the same bytes. resnet18/resnet50 (or any other torchvision
    classification model, by name): images batch x 3 x size x size, `num_classes` classes, SGD with momentum.
    transformer: token embedding +
    nn.TransformerEncoder (d_model 512, 8 heads, 6 layers, feed-forward 2048, dropout 0.1, batch_first) + linear head,
    `seq` tokens of a `vocab`-word vocabulary, cross-entropy per token, AdamW. Returns step(), which runs one
    iteration and returns the loss as a CUDA tensor (no synchronisation). Dropout draws from CUDA's generator,
    seeded here too. pin_cores: run on cores 2-7, as training_step does (less placement noise).
    compile_mode: torch.compile the model with this mode ("default", "reduce-overhead", ...); graphed: the model
    through torch.cuda.make_graphed_callables (forward and backward replayed as CUDA graphs).
    torch_offload: PyTorch's own answers to a model that does not fit, for comparison: "save_on_cpu" (the forward
    under torch.autograd.graph.save_on_cpu(pin_memory=True): every saved activation goes to pinned host memory and
    back) or "checkpoint" (torch.utils.checkpoint, use_reentrant=False, on each block: each residual block of a
    resnet, each encoder layer of the transformer, four segments of another nn.Sequential stage).
    amp: "bf16" runs the forward under torch.autocast("cuda", dtype=torch.bfloat16).
    wrap: a function of the model (on the GPU, its optimizer already made) that returns the module to train, e.g.
    DistributedDataParallel; seed the data per rank with `seed`."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision

    if pin_cores and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 8:
        os.sched_setaffinity(0, set(range(2, 8)))
    torch.manual_seed(seed)  # weights (built on the CPU) and CUDA's generator (dropout)
    gen = torch.Generator().manual_seed(seed + 1)
    if model_name == "transformer":
        d_model = 512
        layer = nn.TransformerEncoderLayer(d_model, nhead=8, dim_feedforward=2048, dropout=0.1, batch_first=True)
        model = nn.Sequential(nn.Embedding(vocab, d_model),
                              nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False),
                              nn.Linear(d_model, vocab))
        x = torch.randint(0, vocab, (batch, seq), generator=gen)
        y = torch.randint(0, vocab, (batch, seq), generator=gen)
        model = model.cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

        def loss_of(out, target):
            return F.cross_entropy(out.reshape(-1, vocab), target.reshape(-1))
    elif model_name in ("resnet18", "resnet50") or hasattr(torchvision.models, model_name):
        model = getattr(torchvision.models, model_name)(num_classes=num_classes).cuda()
        x = torch.randn(batch, 3, size, size, generator=gen)
        y = torch.randint(0, num_classes, (batch,), generator=gen)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_of = F.cross_entropy
    else:
        raise ValueError(f"unknown model {model_name!r} (expected one of {', '.join(OFFLOAD_MODELS)})")
    model.train()
    x, y = x.cuda(), y.cuda()
    if wrap is not None:
        model = wrap(model)
    if torch_offload == "checkpoint":
        _checkpoint_blocks(model)
    elif torch_offload not in (None, "save_on_cpu"):
        raise ValueError(f"unknown torch_offload {torch_offload!r} (save_on_cpu or checkpoint)")
    if amp not in (None, "bf16"):
        raise ValueError(f"unknown amp {amp!r} (bf16)")
    if graphed:
        model = torch.cuda.make_graphed_callables(model, (x,))
    if compile_mode:
        model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)

    def forward():
        if amp == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return loss_of(model(x), y)
        return loss_of(model(x), y)

    def step():
        opt.zero_grad(set_to_none=True)
        if torch_offload == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = forward()
        else:
            loss = forward()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _checkpoint_blocks(model):
    """Wraps the blocks of `model` in torch.utils.checkpoint (see synthetic_step): each block's forward is
    replaced in place, so that the modules keep their attributes (TransformerEncoder reads its layers')."""
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    def wrap(module):
        inner = module.forward

        def forward(*args, **kwargs):
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)

        module.forward = forward

    wrapped = 0
    for module in list(model.modules()):
        if isinstance(module, nn.TransformerEncoder):
            for layer in module.layers:
                wrap(layer)
                wrapped += 1
        elif isinstance(module, nn.Sequential) and len(module) > 1 and module is not model:
            if all(len(list(m.children())) > 0 for m in module):  # blocks (a resnet stage): one each
                for m in module:
                    wrap(m)
                    wrapped += 1
            elif all(len(list(m.children())) == 0 for m in module) and len(module) >= 8:  # a flat stage (vgg)
                for m in module:  # an in-place op on a segment's input would spoil its recomputation
                    if hasattr(m, "inplace"):
                        m.inplace = False
                n = len(module)
                cuts = [round(k * n / 4) for k in range(5)]
                segments = [nn.Sequential(*list(module)[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]
                for i in range(n - 1, -1, -1):
                    del module[i]
                for seg in segments:
                    wrap(seg)
                    module.append(seg)
                    wrapped += 1
    if wrapped == 0:
        raise ValueError("checkpoint: no block of the model to wrap")
    return wrapped


def torch_versions():
    """Versions and device as PyTorch sees them (call once CUDA is initialised)."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "allocator_backend": torch.cuda.get_allocator_backend(),
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }


def torch_peak_memory():
    """PyTorch's own peak statistics (zero under vcudnn, whose arena PyTorch's pool never sees)."""
    import torch

    try:
        return {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved()}
    except Exception as e:  # noqa: BLE001 - a statistic must not lose the run
        return {"max_memory_allocated": None, "max_memory_reserved": None, "error": str(e)}
