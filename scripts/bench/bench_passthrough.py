#!/usr/bin/env python3
"""Pass-through overhead per intercepted call. Runs vcudnn_bench_passthrough three times: without
vcudnn (noise floor), preloaded with VCUDNN_POLICY=passthrough, and preloaded with the default
policy (record: steady state after the first iteration, plus the cost while recording). In each
process the same calls go through the hooked symbol and the real one, interleaved, so each
overhead is measured within one run. Prints a table, writes JSON."""
import argparse
import json
import os
import subprocess

import benchlib

CONFIGS = [
    ("no vcudnn", {}),
    ("passthrough", {"VCUDNN_POLICY": "passthrough"}),
    ("record", {"VCUDNN_POLICY": "record"}),
]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="20 rounds")
    p.add_argument("--out", default=os.path.join(benchlib.ROOT, "scripts/bench/results/passthrough_overhead.json"))
    args = p.parse_args()
    rounds = 20 if args.quick else args.rounds
    binary = os.path.join(benchlib.build_bin(), "vcudnn_bench_passthrough")
    lib = os.path.join(benchlib.build_bin(), "libvcudnn.so")
    runs = {}
    for name, extra in CONFIGS:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env["LD_LIBRARY_PATH"] = benchlib.library_path() + ":" + env.get("LD_LIBRARY_PATH", "")
        env["VCUDNN_LOG_LEVEL"] = "warn"
        if extra:
            env["LD_PRELOAD"] = lib
            env.update(extra)
        proc = subprocess.run([binary, "--rounds", str(rounds)], capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr}")
        runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])

    calls = list(runs["passthrough"]["calls"].keys())
    print("\nµs per call; Δ = hooked − direct in the same process, median of %d paired rounds [p25, p75]" % rounds)
    print(f"| call | direct | no vcudnn: Δ (noise) | passthrough: Δ | record (steady): Δ |")
    print("|---|---:|---:|---:|---:|")

    def cell(n, c):
        r = runs[n]["calls"][c]
        return f"{r['overhead_us']:+.3f} [{r['overhead_p25_us']:+.2f}, {r['overhead_p75_us']:+.2f}]"

    for c in calls:
        d = runs["passthrough"]["calls"][c]["direct_us"]
        print(f"| {c} | {d:.3f} | {cell(CONFIGS[0][0], c)} | {cell(CONFIGS[1][0], c)} | {cell(CONFIGS[2][0], c)} |")
    rec = runs["record"]["first_calls_distinct_shapes"]
    print(f"| conv_fwd while recording ({rec['count']} distinct shapes) | {rec['direct_us']:.3f} | "
          f"{runs['no vcudnn']['first_calls_distinct_shapes']['overhead_us']:+.3f} | "
          f"{runs['passthrough']['first_calls_distinct_shapes']['overhead_us']:+.3f} | {rec['overhead_us']:+.3f} |")
    worst = max(runs[n]["calls"][c]["overhead_us"] for n in ("passthrough", "record") for c in calls)
    fixed = max(runs[n]["calls"]["set_stream"]["overhead_us"] for n in ("passthrough", "record"))
    print(f"\nfixed cost per intercepted call (set_stream, the cheapest call): {fixed:.3f} µs; "
          f"largest median Δ on any call: {worst:.3f} µs (heavier calls: compare with the no-vcudnn noise column)")
    benchlib.write_result(args.out, {
        "schema": "vcudnn.bench.passthrough/1",
        "command": benchlib.command_line(),
        "environment": benchlib.environment(),
        "rounds": rounds,
        "runs": runs,
        "worst_steady_overhead_us": worst,
        "fixed_overhead_us": fixed,
    })


if __name__ == "__main__":
    main()
