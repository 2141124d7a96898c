"""Run time of original, rewritten and hand-written collective matmuls, side by side.

    python benchmarks/execution.py [--json PATH] [--rounds N] [--case-budget S]

For each case of `benchmarks.common` (MLP up/down and attention Q/K/V/output projections
at two sizes) every variant is compiled, checked against the original, warmed up, and then
timed round-robin: each round runs every variant once, in an order that rotates by one
each round; a call during which other processes kept the CPUs busy is run again (a
bounded number of times), and the calls that still shared the machine are counted. The
table reports medians and interquartile ranges; a variant's ratio to the original (or to
the hand-written loop) is the median over rounds of the ratio of the two calls of the
same round, which cancels most of the machine's slow drifts. Large cases get fewer rounds
(--case-budget, --min-rounds) so that the whole run stays near 2 minutes on 2 idle cores.

On this machine the 8 "devices" are threads sharing 2 cores, so the permutes are memory
copies that compete with the dots for the same cores: this measures the overhead of the
decomposed loop, not the overlap a real interconnect would give.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402  (sets XLA_FLAGS before jax loads)
from benchmarks.common import HAND, OPTION_SETS, ORIGINAL, VARIANTS  # noqa: E402

import numpy as np  # noqa: E402


def paired_ratio(times: dict[str, list[float]], name: str, base: str) -> dict[str, float]:
    """Median and quartiles over rounds of times[name][r] / times[base][r]."""
    ratios = np.asarray(times[name]) / np.asarray(times[base])
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return {"ratio": float(med), "q1": float(q1), "q3": float(q3),
            "min_ratio": float(np.min(times[name]) / np.min(times[base])),
            "not_slower_rounds": int(np.sum(ratios <= 1.0)), "rounds": int(len(ratios))}


def verdict(r: dict[str, float]) -> str:
    """`yes` when the median paired ratio is at most 1; `no (noise)` when it is above 1
    but at least a quarter of the rounds were no slower; `NO` otherwise."""
    if r["ratio"] <= 1.0:
        return "yes"
    return "no (noise)" if r["q1"] <= 1.0 else "NO"


def measure(case, rounds: int, min_rounds: int, budget: float, warmup: int,
            max_foreign: float) -> dict:
    args = common.inputs(case)
    start = time.perf_counter()
    compiled = common.compile_variants(case, args)
    compile_s = time.perf_counter() - start
    errors = common.check_agree(compiled, args)          # also the first call of each
    # One timed warm-up round tells how many rounds fit in the case's budget.
    one_round = sum(common.run_once(fn, args)[0] for fn in compiled.values())
    n = min(rounds, max(min_rounds, int(budget // one_round)))
    gc.collect()
    gc.disable()
    try:
        timings = common.interleaved_times(compiled, args, rounds=n, warmup=warmup,
                                           max_foreign=max_foreign)
    finally:
        gc.enable()
    times = timings.seconds
    foreign = np.concatenate([timings.foreign[v] for v in VARIANTS])
    result = {"case": case.name, "kind": case.kind, "seq": case.seq, "d": case.d,
              "shapes": case.describe(), "collective": case.spec.collective,
              "gflop": case.flops() / 1e9, "rounds": n, "compile_s": compile_s,
              "reruns": timings.reruns,
              "shared_calls": int(np.sum(foreign > max_foreign)),
              "foreign_cores_median": float(np.median(foreign)),
              "variants": {}}
    for name in VARIANTS:
        entry = common.summary(times[name])
        entry["times_ms"] = [t * 1e3 for t in times[name]]
        entry["foreign_cores"] = timings.foreign[name]
        entry["cpu_ms"] = [t * 1e3 for t in timings.cpu[name]]
        entry["cpu_median_ms"] = float(np.median(timings.cpu[name]) * 1e3)
        if name != ORIGINAL:
            entry["cpu_vs_original"] = paired_ratio(timings.cpu, name, ORIGINAL)
        if name != HAND:
            entry["cpu_vs_hand"] = paired_ratio(timings.cpu, name, HAND)
        entry["min_ms"] = float(np.min(times[name]) * 1e3)
        entry["max_rel_error"] = errors[name]
        if name != ORIGINAL:
            entry["vs_original"] = paired_ratio(times, name, ORIGINAL)
        if name != HAND:
            entry["vs_hand"] = paired_ratio(times, name, HAND)
        result["variants"][name] = entry
    return result


def cell(entry: dict) -> str:
    ratio = f" ({entry['vs_original']['ratio']:.2f}x)" if "vs_original" in entry else ""
    return f"{entry['median_ms']:.1f} [{entry['q1_ms']:.1f}-{entry['q3_ms']:.1f}]{ratio}"


def report(results: list[dict]) -> str:
    out = []
    out.append("Median ms per call [interquartile range] (median of per-round ratios to the "
               "original)\n")
    out.append(common.markdown_table(
        ["case", "rounds", "shared", *VARIANTS],
        [[r["case"], str(r["rounds"]), f"{r['shared_calls']}/{r['rounds'] * len(VARIANTS)}",
          *(cell(r["variants"][v]) for v in VARIANTS)] for r in results]))
    out.append("(shared: timed calls during which other processes kept the CPUs busy, "
               "after reruns; rows with many are less trustworthy)")
    out.append("\nCPU time of this process per call, all threads (work and any spinning; "
               "hardly changed by other processes, but not the run time: a variant that keeps "
               "both cores busy spends more CPU time in less wall time): median ms (median "
               "per-round ratio to the original / to the hand loop)\n")
    def cpu_cell(v: dict) -> str:
        ratios = [f"{v[k]['ratio']:.2f}" if k in v else "-"
                  for k in ("cpu_vs_original", "cpu_vs_hand")]
        return f"{v['cpu_median_ms']:.1f} ({' / '.join(ratios)})"
    out.append(common.markdown_table(
        ["case", *VARIANTS],
        [[r["case"], *(cpu_cell(r["variants"][v]) for v in VARIANTS)] for r in results]))
    out.append("\nPer-device shapes:\n")
    out.append(common.markdown_table(["case", "shapes", "GFLOP (all devices)"],
                                     [[r["case"], r["shapes"], f"{r['gflop']:.1f}"]
                                      for r in results]))
    out.append("\nTargets: rewritten no slower than the original / than the hand-written loop.\n"
               "Cell: median per-round ratio [IQR], rounds no slower / rounds, verdict "
               "(yes: median <= 1; no (noise): median > 1 but >= 1/4 of rounds no slower; "
               "NO: otherwise), and the ratio of the fastest calls\n")
    rows = []
    for r in results:
        for name in OPTION_SETS:
            v = r["variants"][name]
            row = [r["case"], name]
            for key in ("vs_original", "vs_hand"):
                p = v[key]
                row.append(f"{p['ratio']:.2f} [{p['q1']:.2f}-{p['q3']:.2f}] "
                           f"{p['not_slower_rounds']}/{p['rounds']} {verdict(p)} "
                           f"(min {p['min_ratio']:.2f})")
            rows.append(row)
    out.append(common.markdown_table(["case", "variant", "vs original", "vs hand"], rows))
    out.append("")
    for name in OPTION_SETS:
        for key, label in (("vs_original", "the original"), ("vs_hand", "the hand loop")):
            misses = [f"{r['case']} ({r['variants'][name][key]['ratio']:.2f}x, "
                      f"{verdict(r['variants'][name][key])})"
                      for r in results if verdict(r["variants"][name][key]) != "yes"]
            status = "MET for every case" if not misses else "NOT met for " + ", ".join(misses)
            out.append(f"{name} no slower than {label}: {status}")
    hand_slow = [r["case"] for r in results
                 if verdict(r["variants"][HAND]["vs_original"]) != "yes"]
    if hand_slow:
        out.append(f"\nThe hand-written loop is itself slower than the original for "
                   f"{len(hand_slow)} of {len(results)} cases ({', '.join(hand_slow)}): there "
                   "the decomposition costs on this machine (8 devices sharing "
                   f"{common.machine()['cpu_count']} cores, permutes are memory copies on the "
                   "same cores), whichever way it is written.")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="save the numbers as JSON")
    parser.add_argument("--rounds", type=int, default=15,
                        help="timed rounds per case (default 15)")
    parser.add_argument("--min-rounds", type=int, default=9,
                        help="never fewer rounds than this (default 9)")
    parser.add_argument("--case-budget", type=float, default=30.0, metavar="S",
                        help="seconds of timed rounds per case; cases whose rounds take "
                             "longer get fewer rounds, down to --min-rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="extra untimed rounds after the check and the sizing round, "
                             "which already run every variant twice (default 0)")
    parser.add_argument("--max-foreign", type=float, default=0.25, metavar="CORES",
                        help="rerun a call (twice at most, reruns at most half the calls) "
                             "when other processes kept more than this many cores busy "
                             "during it (default 0.25)")
    parser.add_argument("--kinds", nargs="+", default=list(common.KINDS),
                        choices=common.KINDS)
    parser.add_argument("--sizes", nargs="+", default=None, metavar="SEQxD",
                        help="sizes as SEQxD (default 2048x512 4096x1024)")
    options = parser.parse_args(argv)
    sizes = common.SIZES if options.sizes is None else [
        tuple(int(v) for v in s.split("x")) for s in options.sizes]

    info = common.header()
    common.print_header(info)
    print(f"variants: {', '.join(VARIANTS)}; rewritten options: "
          + "; ".join(f"{k}: {v}" for k, v in OPTION_SETS.items()))
    print()
    start = time.perf_counter()
    results = []
    for case in common.all_cases(options.kinds, sizes):
        results.append(measure(case, options.rounds, options.min_rounds,
                               options.case_budget, options.warmup, options.max_foreign))
        r = results[-1]
        print(f"  {r['case']}: {r['rounds']} rounds, compile {r['compile_s']:.1f} s, "
              f"all variants agree (max rel error "
              f"{max(v['max_rel_error'] for v in r['variants'].values()):.1g}); "
              f"{r['reruns']} calls rerun, {r['shared_calls']} of "
              f"{r['rounds'] * len(VARIANTS)} kept calls shared the CPUs with other "
              f"processes", flush=True)
    print()
    print(report(results))
    elapsed = time.perf_counter() - start
    shared = sum(r["shared_calls"] for r in results)
    calls = sum(r["rounds"] * len(VARIANTS) for r in results)
    print(f"\n{shared} of {calls} timed calls shared the CPUs with other processes "
          f"(more than {options.max_foreign} cores busy elsewhere) even after reruns; "
          f"load average at the end {common.loadavg()} (this process's threads count too)")
    print(f"total {elapsed:.0f} s")
    if options.json:
        common.write_json(options.json, info, benchmark="execution", elapsed_s=elapsed,
                          results=results, options=vars(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
