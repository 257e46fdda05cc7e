-- Every transaction id of an applied block, valid or not, so that a replayed transaction is
-- recognized deterministically (ExecutionServer validation). Written in the same database
-- transaction that digests the block.
CREATE TABLE IF NOT EXISTS chainify_tx_index (
    tx_id BLOB NOT NULL PRIMARY KEY,
    block BIGINT NOT NULL
);
