#!/usr/bin/env bash
# The chainifyDB paper's experiments (CIDR 2021, §6) as recipes: each runs `chainify bench` over the
# heterogeneous set of organizations (PostgreSQL, MariaDB, PostgreSQL, from `cargo xtask services`)
# and prints a Markdown table of what it measured. Results go to bench/results/<experiment>/<run>/
# (result.json and result.svg per run; summary.md per experiment).
#
#   bench/paper.sh clients      # Fig. 7: successful TPS vs 3–24 clients, Any-2 and All-3
#   bench/paper.sh crypto       # Fig. 9: crypto on/off × parallel/serial execution
#   bench/paper.sh blocks       # Fig. 10: block size 256–4096
#   bench/paper.sh recovery     # Fig. 8: commit timeline with a tampered and a failed organization
#   bench/paper.sh raw          # one organization: chainify vs the same stream straight on the engine
#   bench/paper.sh devnet       # the same load on a network of processes with Kafka, over gRPC
#   bench/paper.sh all          # every one of them, in this order
#
# Environment: DURATION (s measured, default 15), WARMUP (default 3), ENGINES (default
# postgres,mariadb,postgres), CHAINIFY (the binary; default: a release build of this checkout).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
duration="${DURATION:-15}"
warmup="${WARMUP:-3}"
engines="${ENGINES:-postgres,mariadb,postgres}"
out="$root/bench/results"

if [[ -z "${CHAINIFY:-}" ]]; then
    cargo build --release --quiet -p chainify
    CHAINIFY="$root/target/release/chainify"
fi
cargo xtask services start postgres mariadb >&2
eval "$(cargo xtask services env)"

# run EXPERIMENT NAME ARGS…: one measured run; its result.json and result.svg in $out/EXPERIMENT/NAME.
run() {
    local experiment="$1" name="$2"
    shift 2
    echo "▸ $experiment/$name: chainify bench $*" >&2
    rm -rf "${out:?}/$experiment/$name"
    "$CHAINIFY" bench --warmup "$warmup" --duration "$duration" --out "$out/$experiment/$name" "$@" >&2
}

# summarize EXPERIMENT: a Markdown table of every run of the experiment, written to summary.md.
summarize() {
    python3 - "$out/$1" <<'PY' | tee "$out/$1/summary.md"
import json, pathlib, sys
base = pathlib.Path(sys.argv[1])
print("| run | engines | policy | clients | block | execution | crypto | successful TPS | p50 / p99 ms | mean txs per block (measured) | phases (ms: validate+analyse, execute, digest, vote) | raw TPS (÷) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(base.glob("*/result.json"), key=lambda p: p.stat().st_mtime):
    r = json.loads(path.read_text())
    c = r["config"]
    ph = lambda n: sum(v["mean_ms"] for v in r["phases"].get(n, {}).values()) / max(len(r["phases"].get(n, {})), 1)
    raw = ", ".join(f'{x["engine"]} {x["successful_tps"]:.0f} ({x["layer_over_raw"]:.2f})' for x in r.get("raw", [])) or "–"
    print(f'| {path.parent.name} | {",".join(c["engines"])} | {c["policy"]} | {c["clients"]} | {c["block_txs"]} '
          f'| {c["execution"]} | {c.get("crypto", "on")} | {r["successful_tps"]:.0f} '
          f'| {r["latency_ms"]["p50"]:.1f} / {r["latency_ms"]["p99"]:.1f} | {r["committed"] / max(r.get("blocks_measured", r["blocks"]), 1):.0f} '
          f'| {ph("validate") + ph("analyse"):.1f}, {ph("execute"):.1f}, {ph("digest"):.1f}, {ph("vote"):.1f} | {raw} |')
    for rec in r.get("recoveries", []):
        print(f'|  ↳ recovery | {rec["org"]} block {rec["block"]} | restore {rec["restore_ms"]:.0f} ms | replay {rec["replayed"]} blocks {rec["replay_ms"]:.0f} ms '
              f'| disagreement → agreed {rec["disagreement_to_agreed_ms"]:.0f} ms | | | | | | | |')
    for cu in r.get("catch_ups", []):
        after = cu["caught_up_after_s"]
        print(f'|  ↳ catch-up | {cu["org"]} | restarted at {cu["restarted_at_s"]:.1f} s | caught up after '
              f'{"–" if after is None else f"{after:.2f} s"} | | | | | | | | |')
PY
}

clients() {
    for policy in any-2 all; do
        for n in 3 6 12 24; do
            run clients "$policy-$n" --engines "$engines" --policy "$policy" --clients "$n"
        done
    done
    summarize clients
}

crypto() {
    # Small blocks (24 clients, cut after 10 ms) and full blocks of 1024 (2048 clients).
    for shape in "24 256 10" "2048 1024 200"; do
        read -r clients block timeout <<<"$shape"
        for execution in parallel serial; do
            for c in on off; do
                run crypto "block-$block-$execution-crypto-$c" --engines "$engines" --clients "$clients" \
                    --block-txs "$block" --batch-timeout-ms "$timeout" --execution "$execution" --crypto "$c"
            done
        done
    done
    summarize crypto
}

blocks() {
    # Twice as many closed-loop clients as a block holds keep the orderer cutting full blocks.
    for size in 256 512 1024 2048 4096; do
        run blocks "block-$size" --engines "$engines" --block-txs "$size" --clients $((2 * size)) \
            --batch-timeout-ms 200 --keys 100000
    done
    summarize blocks
}

recovery() {
    # Any-2: org1 and org3 go on while org2 is repaired, org1 and org2 while org3 is down.
    local saved="$duration"
    duration=$((duration > 30 ? duration : 30))
    run recovery timeline --engines "$engines" --policy any-2 --clients 24 \
        --checkpoint-interval 10 --tamper "2@$((warmup + 8))" --fail "3@$((warmup + 18))+5"
    duration="$saved"
    summarize recovery
}

raw() {
    for engine in $(tr , '\n' <<<"$engines" | sort -u); do
        run raw "$engine" --engines "$engine" --policy any-1 --clients 24 --raw
    done
    summarize raw
}

devnet() {
    # The same load through the real stack: each organization as its own processes (execution,
    # commit, chainify), Kafka, TLS, SDK clients over gRPC spread over the organizations.
    cargo xtask services start kafka >&2
    eval "$(cargo xtask services env)"
    local net="$out/devnet/network"
    rm -rf "$net"
    mkdir -p "$out/devnet"
    # Kafka cuts blocks by time: with a time-to-cut shorter than a block's trip through the
    # processes (~30 ms), tiny blocks queue up; 100 ms lets blocks grow with the load.
    "$CHAINIFY" devnet up --dir "$net" --engines "$engines" --orderer kafka --split --accounts 10000 \
        --base-port 17300 --block-txs 1024 --batch-timeout-ms 100 --checkpoint-interval 100 >&2
    # A failing run ends the script (`set -e`) without returning here: take the network down then.
    trap "\"$CHAINIFY\" devnet down --dir \"$net\" >&2" EXIT
    for n in 24 128 512; do
        run devnet "split-kafka-$n" --devnet "$net" --clients "$n"
    done
    summarize devnet
    "$CHAINIFY" devnet down --dir "$net" >&2
    trap - EXIT
}

case "${1:-}" in
    clients | crypto | blocks | recovery | raw | devnet) "$1" ;;
    # One per line: in `a && b` bash would not stop a function at its first failing command.
    all)
        clients
        crypto
        blocks
        recovery
        raw
        devnet
        ;;
    *)
        sed -n '2,16p' "$0" >&2
        exit 2
        ;;
esac
