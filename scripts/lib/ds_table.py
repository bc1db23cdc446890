#!/usr/bin/env python3
"""The numbers of scripts/bench-ds: one run's window, and the brook/rival table.

    ds_table.py window SAMPLES MEASURE_SECS BASELINE_KIB CONNS [START_UNIX END_UNIX]
        From ds_sample.py's lines: the server's peak VmRSS and RssAnon (MB), the server's and
        the client's CPU used (cores) over the measured window (START..END when given, as
        ds-pool reports it; else the last MEASURE_SECS seconds of the client's run, where
        ds-bench's read workloads end), and the server's RSS growth per connection over
        BASELINE_KIB (KiB). One line, space separated:
        peak_mb anon_peak_mb server_cores client_cores kib_per_conn

    ds_table.py table SAMPLES_TSV RIVAL_NAME
        The markdown table: per row and metric the median over rounds of each server, the ratio
        brook/rival, and the advantage (ratio oriented so that above 1 is brook ahead: the
        ratio for what is better higher, its inverse for what is better lower), then the median
        advantage over the scored metrics.
"""

import collections
import os
import statistics
import sys


def window(path, secs, baseline_kib, conns, start=None, end=None):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 5:
                rows.append([float(x) for x in p])
    if not rows:
        print("nan nan nan nan nan")
        return
    tck = os.sysconf("SC_CLK_TCK")
    peak = max(r[1] for r in rows)
    anon = max(r[2] for r in rows)
    if end is None:
        end = rows[-1][0]
        start = end - secs
    first = next((r for r in rows if r[0] >= start), rows[0])
    last = [r for r in rows if r[0] <= end][-1] if rows[0][0] <= end else rows[-1]
    span = max(last[0] - first[0], 1e-9)
    srv = (last[3] - first[3]) / tck / span
    cli = (last[4] - first[4]) / tck / span
    per = (peak - baseline_kib) / conns if conns > 0 else float("nan")
    print(f"{peak / 1024:.1f} {anon / 1024:.1f} {srv:.3f} {cli:.3f} {per:.2f}")


HIGHER = ("appends/s", "bytes/s")
LOWER = ("p50 ms", "p99 ms", "RSS MB", "RSS KiB/conn", "server CPU us/append", "server CPU us/MiB")


def fmt(v, metric):
    if v != v:
        return "-"
    if metric == "bytes/s":
        return f"{v / 2**30:.2f} GiB/s"
    if metric == "appends/s":
        return f"{v / 1e3:.1f}k"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def table(path, rival):
    data = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            w, m, s, _r, v = line.rstrip("\n").split("\t")
            try:
                v = float(v)
            except ValueError:
                continue
            data.setdefault((w, m), {}).setdefault(s, []).append(v)
    print(f"| workload | metric | brook | {rival} | brook/rival | advantage |")
    print("|---|---|---|---|---|---|")
    adv = []
    for (w, m), per in data.items():
        b = statistics.median(per["brook"]) if "brook" in per else float("nan")
        x = statistics.median(per["electric"]) if "electric" in per else float("nan")
        ratio = b / x if x == x and b == b and x != 0 else float("nan")
        a = "info"
        if ratio == ratio and m in HIGHER:
            a = f"{ratio:.2f}"
            adv.append(ratio)
        elif ratio == ratio and m in LOWER and ratio > 0:
            a = f"{1 / ratio:.2f}"
            adv.append(1 / ratio)
        r = "-" if ratio != ratio else f"{ratio:.2f}"
        print(f"| {w} | {m} | {fmt(b, m)} | {fmt(x, m)} | {r} | {a} |")
    n = {}
    for per in data.values():
        for s, v in per.items():
            n[s] = max(n.get(s, 0), len(v))
    print()
    if adv:
        ahead = sum(1 for a in adv if a > 1.02)
        level = sum(1 for a in adv if 0.98 <= a <= 1.02)
        print(
            f"Scored ratios: {len(adv)}; brook ahead on {ahead}, level (within 2%) on {level}, "
            f"behind on {len(adv) - ahead - level}; median advantage {statistics.median(adv):.2f}."
        )
    print(f"Medians over rounds (runs per server: {n}). Advantage above 1: brook ahead.")


def main():
    if sys.argv[1] == "window":
        start, end = (float(sys.argv[6]), float(sys.argv[7])) if len(sys.argv) > 7 else (None, None)
        window(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), start, end)
    elif sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: ds_table.py window|table ...")


if __name__ == "__main__":
    main()
