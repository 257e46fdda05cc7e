#!/usr/bin/env bash
# Resident memory per organization at saturation (issue #17): a network of processes (each
# organization's execution, commit and chainify processes, Kafka, TLS) driven by SDK clients for
# DURATION seconds, every process's VmRSS sampled every INTERVAL seconds. Writes
# bench/results/memory/samples.csv (seconds, org, process, KiB), memory.svg (one curve per
# organization: the sum of its processes) and summary.md (per organization after the warm-up:
# mean, min, max, the largest deviation from the mean, and the last minute against the first).
#
#   bench/memory.sh
#
# Environment: DURATION (s measured, default 600), WARMUP (s, default 30; not judged), CLIENTS
# (default 128), INTERVAL (s between samples, default 5), ENGINES (default
# postgres,mariadb,postgres), CHAINIFY (the binary; default: a release build of this checkout).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
duration="${DURATION:-600}"
warmup="${WARMUP:-30}"
clients="${CLIENTS:-128}"
interval="${INTERVAL:-5}"
engines="${ENGINES:-postgres,mariadb,postgres}"
out="$root/bench/results/memory"
net="$out/network"

if [[ -z "${CHAINIFY:-}" ]]; then
    cargo build --release --quiet -p chainify
    CHAINIFY="$root/target/release/chainify"
fi
cargo xtask services start >&2
eval "$(cargo xtask services env)"
rm -rf "$out"
mkdir -p "$out"
"$CHAINIFY" devnet up --dir "$net" --engines "$engines" --orderer kafka --split --accounts 10000 \
    --base-port 17400 --block-txs 1024 --batch-timeout-ms 100 --checkpoint-interval 100 >&2
sampler=""
cleanup() {
    [[ -n "$sampler" ]] && kill "$sampler" 2>/dev/null || true
    "$CHAINIFY" devnet down --dir "$net" >&2 || true
}
trap cleanup EXIT

# The sampler reads the pids once (a process that restarts would be a finding in itself: its
# samples stop) and appends one line per process per interval.
"$CHAINIFY" devnet status --dir "$net" >"$out/status.json"
python3 - "$out/status.json" "$out/samples.csv" "$interval" <<'PY' &
import json, sys, time
status, csv, interval = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3])
procs = [(o["org"], name, p["pid"]) for o in status["orgs"] for name, p in o["processes"].items() if p["pid"]]
start = time.monotonic()
with open(csv, "w") as f:
    f.write("seconds,org,process,rss_kib\n")
    while True:
        t = time.monotonic() - start
        for org, name, pid in procs:
            try:
                for line in open(f"/proc/{pid}/status"):
                    if line.startswith("VmRSS:"):
                        f.write(f"{t:.1f},{org},{name},{line.split()[1]}\n")
            except OSError:
                pass
        f.flush()
        time.sleep(interval)
PY
sampler=$!

"$CHAINIFY" bench --devnet "$net" --clients "$clients" --warmup "$warmup" --duration "$duration" \
    --out "$out/run" >&2
kill "$sampler"
sampler=""

python3 - "$out" "$warmup" <<'PY'
import collections, csv, json, pathlib, sys
out, warmup = pathlib.Path(sys.argv[1]), float(sys.argv[2])
per = collections.defaultdict(lambda: collections.defaultdict(int))  # org -> t -> KiB
for r in csv.DictReader(open(out / "samples.csv")):
    per[int(r["org"])][round(float(r["seconds"]))] += int(r["rss_kib"])
run = json.loads((out / "run" / "result.json").read_text())
rows = []
W, H, L, R, T, B = 720, 300, 70, 30, 30, 50
tmax = max(t for s in per.values() for t in s)
top = max(v for s in per.values() for v in s.values()) / 1024 * 1.15
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="18" text-anchor="middle" font-size="14">Resident memory per organization (MiB) at {run["successful_tps"]:,.0f} TPS</text>',
       f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
sx = lambda t: L + t / tmax * (W - L - R)
sy = lambda v: H - B - v / top * (H - T - B)
for i in range(5):
    v = top * i / 4
    svg.append(f'<text x="{L-6}" y="{sy(v)+4}" text-anchor="end">{v:,.0f}</text>')
    t = tmax * i / 4
    svg.append(f'<text x="{sx(t)}" y="{H-B+18}" text-anchor="middle">{t:,.0f}</text>')
svg.append(f'<text x="{W/2}" y="{H-10}" text-anchor="middle">seconds (warm-up ends at {warmup:.0f} s)</text>')
colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
for i, (org, series) in enumerate(sorted(per.items())):
    pts = sorted(series.items())
    line = " ".join(f"{sx(t):.1f},{sy(v/1024):.1f}" for t, v in pts)
    svg.append(f'<polyline points="{line}" fill="none" stroke="{colours[i % 5]}" stroke-width="2"/>')
    svg.append(f'<text x="{W-R-4}" y="{sy(pts[-1][1]/1024)-6:.1f}" text-anchor="end" fill="{colours[i % 5]}">org{org}</text>')
    judged = [v for t, v in pts if t >= warmup]
    if not judged:
        continue
    mean = sum(judged) / len(judged)
    first = [v for t, v in pts if warmup <= t < warmup + 60]
    last = [v for t, v in pts if t >= pts[-1][0] - 60]
    dev = max(abs(v - mean) for v in judged) / mean * 100
    growth = (sum(last) / len(last)) / (sum(first) / len(first)) * 100 - 100
    # The second half alone: bounded caches (recent outcomes, remembered signatures, prepared
    # statements) fill during the first minutes at this rate.
    half = [v for t, v in pts if t >= warmup + (pts[-1][0] - warmup) / 2]
    hmean = sum(half) / len(half)
    hdev = max(abs(v - hmean) for v in half) / hmean * 100
    rows.append(f"| org{org} | {mean/1024:,.0f} | {min(judged)/1024:,.0f} | {max(judged)/1024:,.0f} | ±{dev:.1f} % | {growth:+.1f} % | {hmean/1024:,.0f} ±{hdev:.1f} % |")
svg.append("</svg>")
(out / "memory.svg").write_text("\n".join(svg))
summary = [f"{run['successful_tps']:,.0f} successful TPS over {run['measured_s']:.0f} s measured, "
           f"p50 {run['latency_ms']['p50']:.0f} ms, p99 {run['latency_ms']['p99']:.0f} ms",
           "", "| organization | mean MiB | min | max | largest deviation from the mean | last minute ÷ first minute | second half: mean MiB, largest deviation |",
           "|---|---|---|---|---|---|---|", *rows]
(out / "summary.md").write_text("\n".join(summary) + "\n")
print("\n".join(summary))
PY
