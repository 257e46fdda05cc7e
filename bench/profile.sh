#!/usr/bin/env bash
# Profiles one `chainify bench` run at saturation with perf and draws its flame graph
# (inferno), then prints where the CPU went, grouped by component (bench/profile.py).
#
#   bench/profile.sh sqlite                       # one organization on SQLite, 24 clients
#   bench/profile.sh mariadb --clients 128
#   bench/profile.sh postgres,mariadb,postgres --policy any-2 --block-txs 1024
#
# The first argument is the bench's --engines; the rest are passed to the bench. Output goes to
# bench/results/profile/<engines>/: perf.data, folded stacks, flamegraph.svg, breakdown.txt.
# Needs perf (apt-get install linux-perf) and inferno (cargo install inferno); the script
# installs inferno when missing. Environment: SECONDS_SAMPLED (default 12), HZ (default 499),
# CHAINIFY (the binary; default: a release build of this checkout).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
engines="${1:?usage: bench/profile.sh ENGINES [bench options]}"
shift
sampled="${SECONDS_SAMPLED:-12}"
hz="${HZ:-499}"
out="$root/bench/results/profile/${engines//,/-}"
mkdir -p "$out"

command -v perf >/dev/null || { echo "perf is missing: apt-get install -y linux-perf" >&2; exit 1; }
command -v inferno-flamegraph >/dev/null || cargo install --quiet inferno
if [[ -z "${CHAINIFY:-}" ]]; then
    cargo build --release --quiet -p chainify
    CHAINIFY="$root/target/release/chainify"
fi
cargo xtask services start postgres mariadb >&2
eval "$(cargo xtask services env)"

policy=(--policy any-1)
[[ "$engines" == *,* || " $* " == *" --policy "* ]] && policy=()
# 24 clients unless the options name their own (the bench refuses an option given twice).
clients=(--clients 24)
[[ " $* " == *" --clients "* ]] && clients=()
"$CHAINIFY" bench --engines "$engines" "${policy[@]}" "${clients[@]}" --warmup 3 \
    --duration "$((sampled + 6))" --out "$out/bench" "$@" >"$out/bench.txt" 2>&1 &
bench=$!
sleep 4
perf record -F "$hz" -g --call-graph dwarf,16384 -p "$bench" -o "$out/perf.data" \
    -- sleep "$sampled" 2>"$out/perf.log"
wait "$bench"
perf script -i "$out/perf.data" 2>/dev/null | inferno-collapse-perf >"$out/folded.txt"
# Frames under 0.1 % are dropped: the picture stays small enough to open in a browser.
inferno-flamegraph --minwidth 0.1 --title "chainify bench --engines $engines $*" \
    <"$out/folded.txt" >"$out/flamegraph.svg"
python3 "$root/bench/profile.py" "$out/folded.txt" | tee "$out/breakdown.txt"
grep -E "successful TPS|latency|phases" "$out/bench.txt" | tee -a "$out/breakdown.txt"
echo "wrote $out/flamegraph.svg" >&2
