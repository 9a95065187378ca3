"""Trains torchvision's resnet18 (or --model, e.g. mobilenet_v3_small) for a few iterations on fixed
random data and prints one JSON line: the losses (exact, as float.hex), versions and device. Run by
pytorch_test.cpp with and without LD_PRELOAD=libvcudnn.so; set TORCH_CUDNN_V8_API_DISABLED=1 for
cuDNN's legacy API. --channels-last and --bf16 (autocast) as vision training scripts use them."""
import argparse
import json
import os

import torch
import torch.nn.functional as F
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--benchmark", action="store_true", help="torch.backends.cudnn.benchmark=True")
    p.add_argument("--heuristic", action="store_true",
                   help="deterministic=False: cuDNN's heuristic algorithms instead of PyTorch's default ones")
    p.add_argument("--no-tf32", action="store_true", help="fp32 convolutions without TF32 (allow_tf32=False)")
    p.add_argument("--model", default="resnet18", help="a torchvision classification model")
    p.add_argument("--channels-last", action="store_true", help="model and input in torch.channels_last")
    p.add_argument("--bf16", action="store_true", help="forward under torch.autocast(dtype=torch.bfloat16)")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = args.benchmark
    torch.backends.cudnn.deterministic = not (args.benchmark or args.heuristic)
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=gen).cuda()
    y = torch.randint(0, 10, (args.batch,), generator=gen).cuda()
    model = getattr(torchvision.models, args.model)(num_classes=10).cuda()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(args.iters):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    print(json.dumps({
        "losses": [float.hex(v) for v in losses],
        "loss_values": losses,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "legacy_api": os.environ.get("TORCH_CUDNN_V8_API_DISABLED") == "1",
        "model": args.model,
        "channels_last": args.channels_last,
        "bf16": args.bf16,
    }), flush=True)


if __name__ == "__main__":
    main()
