-- The state digest's accumulator (chainify_core::state, LtHash16: 1024 little-endian 16-bit
-- lanes) of each shared table after a block; their sum is the LedgerBlock's state_digest. Block 0
-- holds the tables' content at registration. Written in the database transaction that digests
-- the block; kept for the newest blocks and every checkpoint, so a restore knows its state.
CREATE TABLE IF NOT EXISTS chainify_state (
    block BIGINT NOT NULL,
    table_name VARCHAR(64) NOT NULL,
    lanes BLOB NOT NULL,
    PRIMARY KEY (block, table_name)
);
