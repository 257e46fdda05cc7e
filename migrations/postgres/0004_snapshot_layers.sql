-- The layers of the snapshot tables (chainify_cp_<t>). A checkpoint copies a table whole once
-- (a base layer: base_block = block) and afterwards only the keys changed since its previous
-- layer (a delta layer, with tombstones for deleted keys). A table's state in a layer is the
-- newest row of each key over the layers from base_block to block. Snapshots without a row here
-- (taken before this table existed) are base layers (recorded below).
CREATE TABLE IF NOT EXISTS chainify_snapshot_layers (
    table_name VARCHAR(64) NOT NULL,
    block BIGINT NOT NULL,
    base_block BIGINT NOT NULL,
    PRIMARY KEY (table_name, block)
);

-- Every snapshot taken before layers existed is a base layer.
INSERT INTO chainify_snapshot_layers (table_name, block, base_block)
SELECT DISTINCT table_name, snapshot_block, snapshot_block FROM chainify_checkpoint_tables ON CONFLICT DO NOTHING;
