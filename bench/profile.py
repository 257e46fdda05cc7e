#!/usr/bin/env python3
"""Where the CPU of a profiled bench run went, from folded stacks (inferno-collapse-perf).

Usage: bench/profile.py folded.txt

Each sample counts once for the first component (in the order below) whose pattern matches a
frame of its stack, so the shares add up to 100 %. The order puts the specific before the
general: a signature check inside admission counts as signatures, not admission.
"""

import re
import sys
from collections import Counter

COMPONENTS = [
    ("signing (Ed25519)", r"Ed25519KeyPair::sign|SigningKey::sign|ring::ec::curve25519::ed25519::signing"),
    ("verification (Ed25519)", r"ed25519_zebra|curve25519_dalek|ed25519::verification|UnparsedPublicKey"),
    ("SQLite engine", r"^sqlite3|sqlite3VdbeExec|sqlite3_step"),
    ("SQL analysis (sqlparser, analyser)", r"^sqlparser::|^chainify_sql::"),
    ("protobuf / canonical encoding", r"^prost::|chainify_core::canonical|chainify_proto::convert|as prost::message::Message>|^decode<|tonic_prost::codec"),
    ("hashing (SHA-256, BLAKE3)", r"sha2::|blake3|ring::digest"),
    ("database driver (sqlx)", r"^sqlx_core::|^sqlx_mysql::|^sqlx_postgres::|^sqlx_sqlite::"),
    ("gRPC / HTTP/2 (tonic, h2, hyper)", r"^tonic::|^h2::|^hyper::"),
    ("block digest and state (storage)", r"chainify_storage::exec::.*finalize|chainify_storage::state|chainify_core::effect|chainify_core::state"),
    ("execution (storage)", r"chainify_storage::exec"),
    ("checkpoints", r"checkpoint"),
    ("admission", r"chainify_node::admission"),
    ("pipeline, votes, ledger", r"chainify_node::|chainify_commit::"),
    ("workload generation", r"chainify_workload::"),
    ("allocation", r"malloc|_int_free|cfree|realloc"),
    ("scheduler wake-ups (futex, context switches)", r"futex|finish_task_switch|schedule$|__schedule|try_to_wake_up"),
    ("async runtime (tokio)", r"^tokio::"),
    ("kernel: network and files", r"tcp_|unix_stream|sock_|vfs_|ext4_|filemap_|copy_.*iter"),
]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    shares: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    compiled = [(name, re.compile(pattern)) for name, pattern in COMPONENTS]
    with open(sys.argv[1], encoding="utf-8") as folded:
        for line in folded:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            total += n
            threads[frames[0]] += n
            for name, pattern in compiled:
                if any(pattern.search(f) for f in frames):
                    shares[name] += n
                    break
            else:
                shares["other"] += n
    if total == 0:
        sys.exit("no samples")
    print("| component | share of CPU samples |")
    print("|---|---|")
    for name, n in shares.most_common():
        print(f"| {name} | {100 * n / total:.1f} % |")
    print()
    print("| thread | share |")
    print("|---|---|")
    for name, n in threads.most_common(6):
        print(f"| {name} | {100 * n / total:.1f} % |")


if __name__ == "__main__":
    main()
