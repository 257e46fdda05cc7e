# Everyday commands. `just` is optional: every recipe is a plain cargo command.

# Format check, clippy (warnings denied) and all tests: the README's and CI's test command.
test:
    cargo xtask test

# Format check and clippy only.
lint:
    cargo xtask lint

# Throw-away PostgreSQL, MariaDB and Kafka on private ports (data under target/services/).
services-start *which:
    cargo xtask services start {{which}}

services-stop *which:
    cargo xtask services stop {{which}}

services-status:
    cargo xtask services status

# Format the workspace.
fmt:
    cargo fmt --all

# Criterion micro-benchmarks of the pure crates (analysis, DAG, scheduler, signatures, policy).
bench-pure:
    cargo bench -p chainify-bench

# Compile and run every benchmark once, as a test.
bench-check:
    cargo bench --workspace -- --test

# Read/write sets and conflicts of a block of SQL transactions.
analyze schema block:
    cargo run --quiet -- analyze --schema {{schema}} {{block}}

# The whole system in one process: 3 SQLite organizations, Smallbank load, one tampered with and
# repaired, a summary (e.g. `just demo --duration 10 --json`).
demo *args:
    cargo run --release -- demo {{args}}

# Keys and configs for a local network.
init dir orgs="3":
    cargo run --quiet -- init --orgs {{orgs}} --out {{dir}}

# A network of processes on loopback (SQLite by default). Extra flags follow the directory:
# `just devnet-up net --engines postgres,mariadb,sqlite` (after `just services-start` and
# `eval "$(cargo xtask services env)"`).
devnet-up dir="net" *args:
    cargo run --release -- devnet up --dir {{dir}} {{args}}

# Stops every process of the network (SIGTERM, SIGKILL after 30 s); the databases are kept.
devnet-down dir="net":
    cargo run --release -- devnet down --dir {{dir}}

# Pids, agreed heights, lag and recovery state of every organization, as JSON.
devnet-status dir="net":
    cargo run --release -- devnet status --dir {{dir}}

# End to end with real processes: PostgreSQL, MariaDB and PostgreSQL organizations with Kafka.
e2e:
    cargo xtask services start && eval "$(cargo xtask services env)" && cargo test -p chainify --test e2e

# Fuzz the SQL parser and analyser (needs nightly and `cargo install cargo-fuzz`).
fuzz seconds="60":
    cd crates/chainify-sql && cargo +nightly fuzz run analyze -- -max_total_time={{seconds}}
