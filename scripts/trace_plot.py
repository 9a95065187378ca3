#!/usr/bin/env python3
"""Draws the memory of a recorded iteration (trace schema vcudnn.trace/2, written by VCUDNN_TRACE with
VCUDNN_POLICY=offload): live bytes over the iteration, stacked by what holds them, so that one sees at a glance
where the peak is and what makes it.

  kept         buffers alive when the iteration starts and still alive at its end (parameters, gradients,
               optimizer state: what an offload planner can move only between iterations)
  activations  allocated before the turn from forward to backward and freed after it (what a forward pass
               leaves for its backward: what vDNN-style offload moves)
  temporaries  everything else the framework allocates and frees
  library      buffers NVIDIA's libraries allocate for themselves (never moved)
  unused       alive when the iteration starts, used by none of its operations (a library's workspace set
               once, memory kept for later: iteration.alive_at_start less the buffers the operations name)

The x axis is cumulative GPU time when every operation of the iteration that queues work has one, else the
operation's index.
The turn is a dashed line; the peak is marked. Used by `vcudnn trace FILE --plot OUT.png`; needs matplotlib.

usage: trace_plot.py TRACE.json OUT.png [--budget BYTES]"""
import argparse
import json
import sys

CATEGORIES = ("unused", "kept", "activations", "temporaries", "library")
COLOURS = {"unused": "#c7c7c7", "kept": "#4c72b0", "activations": "#dd8452", "temporaries": "#55a868",
           "library": "#8c8c8c"}
MIB = 1 << 20
# The kinds of call that queue work on the GPU (the others take no GPU time: allocations, frees, queries,
# handle and stream calls).
WORK = ("convolution", "graph_execute", "library", "launch", "memcpy", "memset")


def span_of(trace):
    calls = trace["calls"]
    it = trace["iteration"]
    if it.get("complete") and it["first_seq"] < it["end_seq"]:
        return [c for c in calls if it["first_seq"] <= c["seq"] < it["end_seq"]]
    return list(calls)


def turn_of(calls):
    seen_forward = False
    for c in calls:
        if c["kind"] != "convolution":
            continue
        if c.get("conv") == "fwd":
            seen_forward = True
        elif seen_forward:
            return c["seq"]
    return None


def series(trace):
    """(x values, {category: live bytes after each call}, turn seq, x label, seqs)."""
    calls = span_of(trace)
    buffers = trace["buffers"]
    alloc, free = {}, {}
    used = set()
    for c in calls:
        if c["kind"] == "alloc":
            alloc[c["buffer"]] = c["seq"]
        elif c["kind"] == "free":
            free[c["buffer"]] = c["seq"]
        for b, _mode in c.get("accesses", []):
            used.add(b)
    involved = set(alloc) | set(free) | used
    turn = turn_of(calls)

    def category(b):
        if buffers[b].get("library"):
            return "library"
        if b not in alloc and b not in free:
            return "kept"
        if turn is not None and alloc.get(b, -1) < turn and (b not in free or free[b] > turn):
            return "activations"
        return "temporaries"

    cat = {b: category(b) for b in involved}
    live = {k: 0 for k in CATEGORIES}
    for b in involved:
        if b not in alloc:  # alive when the span starts
            live[cat[b]] += buffers[b]["bytes"]
    it = trace["iteration"]
    alive = it.get("alive_at_start")
    if alive is not None and calls and calls[0]["seq"] >= it["first_seq"]:
        live["unused"] = max(0, alive - sum(live.values()))
    work = [c for c in calls if c["kind"] in WORK]
    timed = bool(work) and all(c.get("gpu_ms") is not None for c in work)
    xs, ys, seqs = [], {k: [] for k in CATEGORIES}, []
    t = 0.0
    for i, c in enumerate(calls):
        if c["kind"] == "alloc":
            live[cat[c["buffer"]]] += buffers[c["buffer"]]["bytes"]
        xs.append(t if timed else i)
        for k in CATEGORIES:
            ys[k].append(live[k])
        seqs.append(c["seq"])
        if c["kind"] == "free":
            live[cat[c["buffer"]]] -= buffers[c["buffer"]]["bytes"]
        if timed and c.get("gpu_ms") is not None:
            t += c["gpu_ms"]
    return xs, ys, turn, ("GPU time (ms)" if timed else "operation"), seqs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--budget", type=int, help="draw a device budget (bytes)")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("trace_plot.py: matplotlib is missing (pip install matplotlib)")
    with open(args.trace) as f:
        trace = json.load(f)
    if trace.get("schema") != "vcudnn.trace/2":
        sys.exit(f"trace_plot.py: {args.trace} has schema {trace.get('schema')!r}, not vcudnn.trace/2")
    xs, ys, turn, xlabel, seqs = series(trace)
    if not xs:
        sys.exit(f"trace_plot.py: {args.trace} holds no operations")
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    ax.stackplot(xs, *[[v / MIB for v in ys[k]] for k in CATEGORIES], labels=CATEGORIES,
                 colors=[COLOURS[k] for k in CATEGORIES], step="post", alpha=0.9)
    totals = [sum(ys[k][i] for k in CATEGORIES) for i in range(len(xs))]
    peak = max(range(len(xs)), key=lambda i: totals[i])
    ax.annotate(f"peak {totals[peak] / MIB:.0f} MiB", (xs[peak], totals[peak] / MIB), textcoords="offset points",
                xytext=(0, 6), ha="center", fontsize=8)
    if turn is not None and turn in seqs:
        ax.axvline(xs[seqs.index(turn)], color="black", linestyle="--", linewidth=0.8, label="forward | backward")
    if args.budget:
        ax.axhline(args.budget / MIB, color="red", linewidth=0.8, label="budget")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("live MiB")
    it = trace["iteration"]
    ax.set_title(f"{trace.get('program', '')[:80]} — calls {it['first_seq']}..{it['end_seq']}"
                 f"{'' if it.get('complete') else ' (no complete iteration)'}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.margins(x=0)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"{args.out}: peak {totals[peak] / MIB:.1f} MiB at call {seqs[peak]}")


if __name__ == "__main__":
    main()
