#!/usr/bin/env bash
# Scale curves (issue #17): throughput and p99 latency of the in-process SQLite network against
# accounts, organizations and block size, and the ledger's bytes per transaction. Each point is one
# `chainify bench` run; results in bench/results/scale/<sweep>/<point>/, curves in
# bench/results/scale/<sweep>.svg, a table in bench/results/scale/summary.md.
#
#   bench/scale.sh [accounts|orgs|blocks|all]
#
# Environment: DURATION (s measured, default 10), WARMUP (default 3), CLIENTS (default 128),
# CHAINIFY (the binary; default: a release build of this checkout).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
duration="${DURATION:-10}"
warmup="${WARMUP:-3}"
clients="${CLIENTS:-128}"
out="$root/bench/results/scale"
mkdir -p "$out"

if [[ -z "${CHAINIFY:-}" ]]; then
    cargo build --release --quiet -p chainify
    CHAINIFY="$root/target/release/chainify"
fi

# point SWEEP X CLIENTS ARGS…: one run; the SQLite files are kept to measure the ledger, then
# removed.
point() {
    local sweep="$1" x="$2" n="$3"
    shift 3
    local dir="$out/$sweep/$x"
    rm -rf "$dir"
    mkdir -p "$dir/db"
    echo "▸ $sweep = $x: chainify bench $*" >&2
    "$CHAINIFY" bench --warmup "$warmup" --duration "$duration" --clients "$n" \
        --out "$dir" --dir "$dir/db" "$@" >&2
    python3 - "$dir" "$x" <<'PY'
import json, pathlib, sqlite3, sys
d, x = pathlib.Path(sys.argv[1]), sys.argv[2]
dbs = sorted(d.glob("db/**/*.db"))
ledger = txs = 0
if dbs:
    c = sqlite3.connect(dbs[0])
    ledger = c.execute("SELECT COALESCE(SUM(LENGTH(entry)), 0) FROM chainify_ledger").fetchone()[0]
    txs = c.execute("SELECT COUNT(*) FROM chainify_tx_index").fetchone()[0]
r = json.loads((d / "result.json").read_text())
point = {"x": float(x), "tps": r["successful_tps"], "p99": r["latency_ms"]["p99"],
         "p50": r["latency_ms"]["p50"], "ledger_bytes_per_tx": ledger / txs if txs else None}
(d / "point.json").write_text(json.dumps(point))
PY
    rm -rf "$dir/db"
}

# draw SWEEP LABEL: the sweep's points as two curves (TPS, p99) in one SVG, and table rows.
draw() {
    python3 - "$out" "$1" "$2" <<'PY'
import json, math, pathlib, sys
out, sweep, label = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
pts = sorted((json.loads(p.read_text()) for p in (out / sweep).glob("*/point.json")), key=lambda p: p["x"])
if not pts:
    sys.exit(0)
log = pts[-1]["x"] / max(pts[0]["x"], 1) >= 50
W, H, L, R, T, B = 720, 300, 70, 70, 30, 50
def sx(x):
    lo, hi = pts[0]["x"], pts[-1]["x"]
    if hi == lo:
        return L + (W - L - R) / 2
    f = (math.log10(x) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) if log else (x - lo) / (hi - lo)
    return L + f * (W - L - R)
def sy(v, top):
    return H - B - (v / top) * (H - T - B) if top else H - B
top_tps = max(p["tps"] for p in pts) * 1.15
top_p99 = max(p["p99"] for p in pts) * 1.15
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="18" text-anchor="middle" font-size="14">TPS (blue, left), p99 latency (red, right) against {label}</text>',
       f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="#1f77b4"/>',
       f'<line x1="{W-R}" y1="{T}" x2="{W-R}" y2="{H-B}" stroke="#d62728"/>']
for i in range(5):
    v = top_tps * i / 4
    svg.append(f'<text x="{L-6}" y="{sy(v, top_tps)+4}" text-anchor="end" fill="#1f77b4">{v:,.0f}</text>')
    v = top_p99 * i / 4
    svg.append(f'<text x="{W-R+6}" y="{sy(v, top_p99)+4}" fill="#d62728">{v:,.0f} ms</text>')
for p in pts:
    svg.append(f'<text x="{sx(p["x"])}" y="{H-B+18}" text-anchor="middle">{p["x"]:,.0f}</text>')
svg.append(f'<text x="{W/2}" y="{H-10}" text-anchor="middle">{label}{" (log scale)" if log else ""}</text>')
for key, top, colour in (("tps", top_tps, "#1f77b4"), ("p99", top_p99, "#d62728")):
    line = " ".join(f'{sx(p["x"]):.1f},{sy(p[key], top):.1f}' for p in pts)
    svg.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for p in pts:
        svg.append(f'<circle cx="{sx(p["x"]):.1f}" cy="{sy(p[key], top):.1f}" r="3" fill="{colour}"/>')
svg.append("</svg>")
(out / f"{sweep}.svg").write_text("\n".join(svg))
with open(out / "summary.md", "a") as f:
    for p in pts:
        lb = "–" if p["ledger_bytes_per_tx"] is None else f'{p["ledger_bytes_per_tx"]:,.0f}'
        f.write(f'| {label} | {p["x"]:,.0f} | {p["tps"]:,.0f} | {p["p50"]:.1f} | {p["p99"]:.1f} | {lb} |\n')
PY
}

accounts() {
    for n in 10000 100000 1000000; do
        point accounts "$n" "$clients" --engines sqlite,sqlite,sqlite --policy any-2 --keys "$n"
    done
    draw accounts "accounts"
}

orgs() {
    for n in 3 5 7; do
        local engines
        engines="$(printf 'sqlite,%.0s' $(seq "$n"))"
        point orgs "$n" "$clients" --engines "${engines%,}" --policy "any-$((n / 2 + 1))"
    done
    draw orgs "organizations (SQLite, majority)"
}

blocks() {
    for n in 32 128 512 1024; do
        point blocks "$n" $((2 * n)) --engines sqlite,sqlite,sqlite --policy any-2 \
            --block-txs "$n" --batch-timeout-ms 200 --cut timeout
    done
    draw blocks "block size (2 clients a slot)"
}

if [[ ! -f "$out/summary.md" ]]; then
    echo "| sweep | x | successful TPS | p50 ms | p99 ms | ledger bytes per tx |" > "$out/summary.md"
    echo "|---|---|---|---|---|---|" >> "$out/summary.md"
fi
case "${1:-all}" in
    accounts | orgs | blocks) "$1" ;;
    all)
        accounts
        orgs
        blocks
        ;;
    *)
        echo "usage: bench/scale.sh [accounts|orgs|blocks|all]" >&2
        exit 2
        ;;
esac
cat "$out/summary.md"
