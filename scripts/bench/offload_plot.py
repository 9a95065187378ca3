#!/usr/bin/env python3
"""Step time against device memory from scripts/bench/offload results (offload_step-*.json), one panel per
model and dtype: each policy's budgets as a line (vcudnn's plan, vDNN's policies, on-demand eviction), PyTorch's
own answers (save_on_cpu, checkpoint) and PyTorch alone as points, and the lower bound of each budget (Note [The
lower bound], the step no plan can beat at that budget) as crosses. Memory is what each run held on the device:
vcudnn's peakMappedBytes under vcudnn, PyTorch's max_memory_reserved without it. Step time is the ratio to
PyTorch alone (cudaMallocAsync) of the same file, so files from different runs share one axis.

  python3 scripts/bench/offload_plot.py RESULT.json [RESULT.json ...] --out PLOT.png [--title TEXT]
"""
import argparse
import json
import re
import sys

GIB = 1 << 30
# Row keys of offload_step.json: "vcudnn-90" is policy vcudnn at 90 %, "vdnn-conv-70" vdnn-conv at 70 %.
BUDGET_ROW = re.compile(r"^(?P<policy>[a-z-]+?)-(?P<percent>\d+)$")
STYLE = {  # policy: (label, marker, colour)
    "vcudnn": ("vcudnn (its plan, replayed)", "o", "tab:blue"),
    "vcudnn-whole": ("vcudnn, whole buffers", "o", "tab:cyan"),
    "vcudnn-arena": ("vcudnn, no static placement", "o", "tab:purple"),
    "vcudnn-mb": ("vcudnn, microbatch+offload", "h", "tab:pink"),
    "vdnn-conv": ("vDNN conv", "s", "tab:orange"),
    "vdnn-all": ("vDNN all", "D", "tab:red"),
    "modnn": ("moDNN", "v", "tab:brown"),
    "lru": ("on-demand eviction", "^", "tab:gray"),
}
TORCH = {  # row key: (label, marker, colour)
    "torch-async": ("PyTorch alone", "*", "black"),
    "save-on-cpu": ("PyTorch save_on_cpu", "P", "tab:green"),
    "checkpoint": ("PyTorch checkpoint", "X", "tab:olive"),
}


def panels(paths, newest=False):
    """{(model, batch, amp): {"series": {policy: {percent: [(GiB, ratio)]}}, "points": {key: [(GiB, ratio)]},
    "bounds": {percent: [(GiB, ratio)]}}} from every file; a budget measured in several files is their mean, or
    with `newest` the last file's that has it (files given oldest first)."""
    out = {}
    owner = {}  # with `newest`: id of a list -> the file that filled it

    def add(points, at, index):
        if newest and owner.get(id(points)) != index:
            points.clear()
            owner[id(points)] = index
        points.append(at)

    for index, path in enumerate(paths):
        with open(path) as f:
            data = json.load(f)
        for model in data.get("models", []):
            name = model["model"]
            rows = data["summaries"][name]["rows"]
            ref = rows.get("torch-async", {}).get("median_step_ms")
            if not ref:
                print(f"{path}: {name} has no PyTorch-alone row, skipped", file=sys.stderr)
                continue
            panel = out.setdefault((name, model["batch"], model.get("amp") or "fp32"),
                                   {"series": {}, "points": {}, "bounds": {}})
            for key, row in rows.items():
                if not row.get("median_step_ms") or not row.get("peak_bytes"):
                    continue
                at = (row["peak_bytes"] / GIB, row["median_step_ms"] / ref)
                m = BUDGET_ROW.match(key)
                if m and m.group("policy") in STYLE:
                    percent = int(m.group("percent"))
                    add(panel["series"].setdefault(m.group("policy"), {}).setdefault(percent, []), at, index)
                    if row.get("lower_bound_ms") and row.get("budget_bytes"):
                        add(panel["bounds"].setdefault(percent, []),
                            (row["budget_bytes"] / GIB, row["lower_bound_ms"] / ref), index)
                elif key in TORCH:
                    add(panel["points"].setdefault(key, []), at, index)
    return out


def mean(points):
    return (sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="offload_step-*.json files of scripts/bench/offload")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--title", default="")
    p.add_argument("--newest", action="store_true",
                   help="a budget measured in several files: the last file's (give them oldest first), not their "
                        "mean")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        print("offload_plot.py needs matplotlib (scripts/install-deps installs it)", file=sys.stderr)
        return 2
    data = panels(args.results, args.newest)
    if not data:
        print("no model with a PyTorch-alone row in the results given", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, len(data), figsize=(6.4 * len(data), 4.8), squeeze=False)
    for ax, ((model, batch, amp), panel) in zip(axes[0], sorted(data.items())):
        for policy, by_percent in sorted(panel["series"].items()):
            label, marker, colour = STYLE[policy]
            points = sorted(mean(v) + (percent,) for percent, v in by_percent.items())
            ax.plot([x for x, _, _ in points], [y for _, y, _ in points], marker=marker, color=colour, label=label)
            if policy == "vcudnn":
                for x, y, percent in points:
                    ax.annotate(f"{percent}%", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if panel["bounds"]:
            bounds = [mean(v) for v in panel["bounds"].values()]
            ax.scatter([x for x, _ in bounds], [y for _, y in bounds], marker="x", color="tab:blue", alpha=0.6,
                       label="lower bound at the budget")
        for key, points in panel["points"].items():
            label, marker, colour = TORCH[key]
            ax.scatter([x for x, _ in points], [y for _, y in points], marker=marker, s=90, color=colour, label=label,
                       zorder=3)
        ax.set_yscale("log")
        times = FuncFormatter(lambda v, _: f"{v:g}x")
        ax.yaxis.set_major_formatter(times)
        ax.yaxis.set_minor_formatter(times)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("device memory held (GiB): vcudnn's peak mapped, PyTorch's peak reserved")
        ax.set_ylabel("step time / PyTorch alone")
        ax.set_title(f"{model}, batch {batch}, {amp}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
