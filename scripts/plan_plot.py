#!/usr/bin/env python3
"""Draws device memory over a recorded iteration without an offload plan and with each policy's plan, against
the budget and the least budget any plan needs, from the JSON that `vcudnn plan FILE --budget B --json OUT`
writes (schema vcudnn.plan/1, with its "curves"). Used by `vcudnn plan ... --plot OUT.png`; needs matplotlib.

The x axis is the operation's index in the iteration (the plan's model counts calls, not time).

usage: plan_plot.py PLAN.json OUT.png"""
import argparse
import json
import sys
from pathlib import Path

MIB = 1 << 20
STYLES = {"without": ("#8c8c8c", "-"), "vcudnn": ("#c44e52", "-"), "vdnn-all": ("#4c72b0", "--"),
          "vdnn-conv": ("#55a868", ":")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plan")
    p.add_argument("out")
    args = p.parse_args()
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    if plan.get("schema") != "vcudnn.plan/1" or "curves" not in plan:
        sys.exit(f"plan_plot.py: {args.plan} is not a vcudnn.plan/1 file with curves")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plan_plot.py: matplotlib is missing (scripts/install-deps installs it)")

    fig, ax = plt.subplots(figsize=(11, 4.5))
    for name, curve in plan["curves"].items():
        colour, style = STYLES.get(name, ("#937860", "-."))
        label = "no plan" if name == "without" else name
        ax.plot(range(len(curve)), [v / MIB for v in curve], color=colour, linestyle=style, linewidth=1.3,
                label=label)
    ax.axhline(plan["budget"] / MIB, color="black", linewidth=1, label=f"budget {plan['budget'] / MIB:.0f} MiB")
    ax.axhline(plan["least_budget"] / MIB, color="black", linewidth=0.8, linestyle=":",
               label=f"least any plan needs {plan['least_budget'] / MIB:.0f} MiB")
    ax.set_xlabel("operation of the iteration")
    ax.set_ylabel("device memory (MiB)")
    ax.set_title(f"offload plans: {Path(plan['trace']).name}, budget {plan['budget'] / 2**20:.0f} MiB", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
