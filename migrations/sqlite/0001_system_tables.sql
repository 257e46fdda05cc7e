-- chainify's own tables. Names start with chainify_ so they never clash with shared tables.

-- Tables registered as shared; the fingerprint notices a definition changed after registration.
CREATE TABLE IF NOT EXISTS chainify_shared_tables (
    table_name TEXT NOT NULL PRIMARY KEY,
    fingerprint VARCHAR(64) NOT NULL,
    -- Last block whose digest saw a change to the table (-1: none yet).
    last_changed_block BIGINT NOT NULL,
    -- Block of the table's newest snapshot (-1: none yet).
    last_snapshot_block BIGINT NOT NULL
);

-- Blocks whose effects are applied and digested, with the executor's outcome.
CREATE TABLE IF NOT EXISTS chainify_applied_blocks (
    block BIGINT NOT NULL PRIMARY KEY,
    digest BLOB NOT NULL,
    -- One bit per transaction, least significant first (chainify_core::canonical::pack_bits).
    success BLOB NOT NULL,
    tx_count BIGINT NOT NULL
);

-- Transactions of a block in progress that already committed (parallel engines commit each
-- transaction on its own): a re-run of the block skips them, so nothing is applied twice.
CREATE TABLE IF NOT EXISTS chainify_applied_txs (
    block BIGINT NOT NULL,
    tx_index BIGINT NOT NULL,
    success SMALLINT NOT NULL,
    PRIMARY KEY (block, tx_index)
);

-- Checkpoints: the shared tables as of an agreed block.
CREATE TABLE IF NOT EXISTS chainify_checkpoints (
    block BIGINT NOT NULL PRIMARY KEY,
    created_unix_ms BIGINT NOT NULL
);

-- For each checkpoint and shared table, the snapshot that holds the table's rows (the table's
-- newest snapshot at or before the checkpoint: unchanged tables are not copied again).
CREATE TABLE IF NOT EXISTS chainify_checkpoint_tables (
    block BIGINT NOT NULL,
    table_name TEXT NOT NULL,
    snapshot_block BIGINT NOT NULL,
    PRIMARY KEY (block, table_name)
);

-- The ledger: agreed blocks, hash-chained, each with its certificate.
CREATE TABLE IF NOT EXISTS chainify_ledger (
    block BIGINT NOT NULL PRIMARY KEY,
    hash BLOB NOT NULL,
    previous_hash BLOB NOT NULL,
    -- The ledger block and its certificate, canonically encoded.
    entry BLOB NOT NULL
);

-- Signed votes received for blocks not yet agreed or kept as evidence.
CREATE TABLE IF NOT EXISTS chainify_votes (
    block BIGINT NOT NULL,
    org BIGINT NOT NULL,
    ledger_hash BLOB NOT NULL,
    signature BLOB NOT NULL,
    PRIMARY KEY (block, org)
);
