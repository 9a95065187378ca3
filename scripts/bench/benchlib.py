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
