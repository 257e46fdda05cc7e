//! SQL that chainify generates from the catalog, per dialect: digest tables and their triggers,
//! snapshot tables, and the statements that read, consume, snapshot and restore them. Pure text
//! generation, so every dialect's output is unit-tested without a server.
//!
//! For shared table `t` (names are checked to be plain lower-case identifiers first):
//! - `chainify_dg_t(chainify_seq, <key columns>, chainify_was, chainify_o1…)`: a log of the
//!   changes since the last block digest, one record a changed row, appended by row triggers
//!   (the old and the new key when an UPDATE moves a row). The digest step locks these tables
//!   against writers ([`begin_digest`]), reads the log and keeps each key's first record, and
//!   so consumes exactly the records it hashed; a direct change meanwhile waits for the next
//!   block. A record of a change that removes the row from its key holds the row as it was
//!   (`chainify_was` = 1 and the columns in `chainify_o1…`; 0 when the change creates the
//!   row): the key's earliest record
//!   (`chainify_seq`) is its image before the block, which the state digest subtracts before it
//!   adds the new one. The triggers need no session state: a direct change by anyone is
//!   recorded like chainify's own.
//! - `chainify_cp_t(chainify_cp_block, chainify_cp_gone, <all columns>)`: checkpoint snapshots of
//!   `t` in layers (`chainify_snapshot_layers`): a base layer holds every row, a delta layer only
//!   the keys changed since the layer before it, a deleted key as a tombstone (`chainify_cp_gone`
//!   = 1). A snapshot is the newest row of each key over its layers ([`in_layers`]).

use chainify_core::Value;
use chainify_sql::ColumnType;
use chainify_sql::render::Dialect;
use chainify_sql::schema::Limit;

use crate::catalog::CatalogTable;

/// Digest table of `table`.
pub fn digest_table(table: &str) -> String {
    format!("chainify_dg_{table}")
}

/// Snapshot table of `table`.
pub fn snapshot_table(table: &str) -> String {
    format!("chainify_cp_{table}")
}

/// The index of `table`'s snapshot table by key and layer: a snapshot's newest row of a key is
/// one lookup.
fn snapshot_index(table: &str) -> String {
    format!("chainify_cpk_{table}")
}

/// The statements that add the tombstone column `chainify_cp_gone` and the key index to `t`'s
/// snapshot table created before layers existed.
pub fn snapshot_upgrade(t: &CatalogTable) -> Vec<String> {
    let cp = snapshot_table(&t.name);
    vec![
        format!("ALTER TABLE {cp} ADD COLUMN chainify_cp_gone SMALLINT NOT NULL DEFAULT 0"),
        format!(
            "CREATE INDEX {} ON {cp} ({}, chainify_cp_block)",
            snapshot_index(&t.name),
            t.primary_key.join(", ")
        ),
    ]
}

/// Whether table `$1` has a column named `$2`: 1 or 0 (0 also when there is no such table).
pub fn has_column(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => {
            "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2"
        }
        Dialect::MySql => {
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?"
        }
        Dialect::Sqlite => "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
    }
}

/// The column only a digest table of the first shape has: one upserted row a key, with a count
/// of its changes, where the digest table is now a log ([`log_table`]).
pub const UPSERTED_DIGEST_COLUMN: &str = "chainify_n";

/// Where [`digest_upgrade`] sets a digest table of the first shape aside while it copies its
/// records into the log (as long as the digest table's name, so within every engine's limit).
pub fn upserted_digest_table(table: &str) -> String {
    format!("chainify_d1_{table}")
}

/// Turns `t`'s digest table of the first shape into the log: sets it aside (`set_aside`: it
/// still has its name), creates the log and copies its records into it, a key's one record
/// (its before-image) first, then drops it. The triggers are reinstalled after. Run again after
/// an interruption (MySQL's DDL commits statement by statement) with `set_aside` false, it
/// copies what is left: a record copied twice is harmless, since a key's earliest record alone
/// is read and the copies agree.
pub fn digest_upgrade(dialect: Dialect, t: &CatalogTable, set_aside: bool) -> Vec<String> {
    let (dg, old) = (digest_table(&t.name), upserted_digest_table(&t.name));
    let keys = t.primary_key.join(", ");
    let before: Vec<String> = (0..t.columns.len()).map(before_column).collect();
    let columns = format!("{keys}, chainify_was, {}", before.join(", "));
    let mut out = Vec::new();
    if set_aside {
        out.push(format!("ALTER TABLE {dg} RENAME TO {old}"));
    }
    out.push(log_table(dialect, t));
    out.push(format!(
        "INSERT INTO {dg} ({columns}) SELECT {columns} FROM {old}"
    ));
    out.push(format!("DROP TABLE {old}"));
    out
}

/// `a.k = b.k AND …` over `t`'s key columns.
fn same_key(t: &CatalogTable, a: &str, b: &str) -> String {
    t.primary_key
        .iter()
        .map(|k| format!("{a}.{k} = {b}.{k}"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// How many parameters [`in_layers`] takes.
pub const LAYER_PARAMS: usize = 5;

/// Conditions on alias `s` of `t`'s snapshot table that hold for exactly the rows of one
/// snapshot: rows of the layers from its base to its own layer that no later of those layers
/// replaces, tombstones excluded. Parameters from `first` on ([`LAYER_PARAMS`]): the layer, its
/// base, the base, the layer, the layer (`crate::layers::Layer::params`). The constant
/// `base < layer` lets the engine skip the lookup of newer rows for a base layer, which a
/// full restore reads row by row.
pub fn in_layers(dialect: Dialect, t: &CatalogTable, s: &str, first: usize) -> String {
    let p = |n: usize| placeholder(dialect, first + n);
    let newer = same_key(t, "chainify_newer", s);
    format!(
        "{s}.chainify_cp_block <= {} AND {s}.chainify_cp_block >= {} AND {s}.chainify_cp_gone = 0 AND NOT EXISTS (SELECT 1 FROM {} chainify_newer WHERE {} < {} AND {newer} AND chainify_newer.chainify_cp_block > {s}.chainify_cp_block AND chainify_newer.chainify_cp_block <= {})",
        p(0),
        p(1),
        snapshot_table(&t.name),
        p(2),
        p(3),
        p(4)
    )
}

/// Column of the digest table that holds the before-image of the `i`-th (0-based) column.
pub fn before_column(i: usize) -> String {
    format!("chainify_o{}", i + 1)
}

/// chainify's system tables (migrations/): no trigger belongs on any of them.
pub const SYSTEM_TABLES: [&str; 10] = [
    "chainify_shared_tables",
    "chainify_applied_blocks",
    "chainify_applied_txs",
    "chainify_checkpoints",
    "chainify_checkpoint_tables",
    "chainify_ledger",
    "chainify_votes",
    "chainify_tx_index",
    "chainify_state",
    "chainify_snapshot_layers",
];

/// Dirty-key table of `table`: every key a digested block changed, with the last such block, so
/// that a restore repairs only the keys changed since its checkpoint.
pub fn dirty_table(table: &str) -> String {
    format!("chainify_dk_{table}")
}

/// Placeholder number `n` (1-based) in `dialect`.
pub fn placeholder(dialect: Dialect, n: usize) -> String {
    match dialect {
        Dialect::Postgres => format!("${n}"),
        Dialect::MySql => "?".into(),
        Dialect::Sqlite => format!("?{n}"),
    }
}

/// Placeholders for parameters `1..=count`, comma-separated.
pub fn placeholders(dialect: Dialect, count: usize) -> String {
    (1..=count)
        .map(|n| placeholder(dialect, n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a column is read back so every engine yields the same typed value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReadType {
    /// A 64-bit integer.
    Int,
    /// Text of a decimal (PostgreSQL, MySQL) or the stored number (SQLite), normalized to the
    /// declared scale.
    Decimal(u8),
    /// UTF-8 text.
    Text,
    /// A boolean (an integer 0/1 on MySQL and SQLite).
    Bool,
    /// Bytes.
    Bytes,
}

impl ReadType {
    /// The read type of a portable column type.
    pub fn of(ty: &ColumnType) -> ReadType {
        match ty {
            ColumnType::Int => ReadType::Int,
            ColumnType::Decimal { scale } => ReadType::Decimal(scale.unwrap_or(0)),
            ColumnType::Bool => ReadType::Bool,
            ColumnType::Bytes => ReadType::Bytes,
            // Registration admits only portable types; text is the safe reading otherwise.
            _ => ReadType::Text,
        }
    }
}

/// `expr` cast so that the backend decodes it as `ty`.
fn read_expr(dialect: Dialect, expr: &str, ty: ReadType) -> String {
    match (dialect, ty) {
        (Dialect::Postgres, ReadType::Int) => format!("CAST({expr} AS BIGINT)"),
        (Dialect::Postgres, ReadType::Decimal(_)) => format!("CAST({expr} AS TEXT)"),
        (Dialect::MySql, ReadType::Int | ReadType::Bool) => format!("CAST({expr} AS SIGNED)"),
        (Dialect::MySql, ReadType::Decimal(_)) => format!("CAST({expr} AS CHAR)"),
        _ => expr.to_owned(),
    }
}

/// The generated objects of one shared table.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Artifacts {
    /// Statements that create (or replace) the objects; safe to run again.
    pub install: Vec<String>,
    /// Statements that remove them again.
    pub uninstall: Vec<String>,
    /// The triggers as the catalog must show them ([`trigger_catalog`]).
    pub triggers: Vec<ExpectedTrigger>,
}

/// A digest trigger as [`trigger_catalog`] must read it back.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ExpectedTrigger {
    /// Trigger name.
    pub name: String,
    /// What the catalog holds as its definition: on PostgreSQL the function body, the trigger
    /// type, whether the function's search_path is pinned and whether the trigger fires
    /// unconditionally as made (`body|tgtype|true|true`); on MySQL
    /// the timing, event and `BEGIN … END` body; on SQLite the whole `CREATE TRIGGER`.
    pub definition: String,
}

/// The triggers on the `tables` tables named by parameters `1..=tables`, in one query, as the
/// catalog records them: the table's name, the trigger's name, whether it fires (`A`: always,
/// on PostgreSQL also under `session_replication_role = replica`; anything else counts as
/// disabled), and its definition as in [`ExpectedTrigger`].
pub fn trigger_catalog(dialect: Dialect, tables: usize) -> (String, Vec<ReadType>) {
    let list = placeholders(dialect, tables);
    let sql = match dialect {
        // The body, the trigger's timing and events (`tgtype`), whether the function's
        // search_path is pinned to the table's schema with pg_temp last, and whether it fires
        // as made: no WHEN condition (`tgqual`), no `UPDATE OF` column list (`tgattr`), no
        // arguments, transition tables or constraint, a PL/pgSQL function of the caller's
        // rights. Rules (`pg_rewrite`: DO INSTEAD NOTHING on a digest table drops what the
        // triggers record), row-level security, inheritance children and partitions (their
        // rows fire triggers of their own) come back as unexpected "triggers" named `rule …`,
        // `row level security`, `inheritance child …` and `not a plain table` (also a table
        // attached as a partition, or made an inheritance child, since it was registered).
        Dialect::Postgres => {
            let regclasses: Vec<String> =
                (1..=tables).map(|n| format!("to_regclass(${n})")).collect();
            let list = regclasses.join(", ");
            format!(
                "SELECT CAST(c.relname AS TEXT), CAST(t.tgname AS TEXT), CAST(t.tgenabled AS TEXT), \
                 p.prosrc || '|' || CAST(t.tgtype AS TEXT) || '|' || \
                 CAST(p.proconfig IS NOT DISTINCT FROM ARRAY[format('search_path=%I, pg_temp', current_schema())] AS TEXT) || '|' || \
                 CAST(t.tgqual IS NULL AND cardinality(CAST(t.tgattr AS int2[])) = 0 AND t.tgnargs = 0 \
                      AND t.tgconstraint = 0 AND t.tgoldtable IS NULL AND t.tgnewtable IS NULL \
                      AND NOT p.prosecdef AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql') AS TEXT) \
                 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_class c ON c.oid = t.tgrelid \
                 WHERE t.tgrelid IN ({list}) AND NOT t.tgisinternal \
                 UNION ALL \
                 SELECT CAST(c.relname AS TEXT), 'rule ' || CAST(r.rulename AS TEXT), 'A', '' \
                 FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE r.ev_class IN ({list}) \
                 UNION ALL \
                 SELECT CAST(c.relname AS TEXT), 'row level security', 'A', '' \
                 FROM pg_class c WHERE c.oid IN ({list}) AND (c.relrowsecurity OR c.relforcerowsecurity) \
                 UNION ALL \
                 SELECT CAST(c.relname AS TEXT), 'inheritance child ' || CAST(ch.relname AS TEXT), 'A', '' \
                 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent JOIN pg_class ch ON ch.oid = i.inhrelid \
                 WHERE i.inhparent IN ({list}) \
                 UNION ALL \
                 SELECT CAST(c.relname AS TEXT), 'not a plain table', 'A', '' \
                 FROM pg_class c WHERE c.oid IN ({list}) AND (c.relkind <> 'r' OR c.relispartition \
                      OR EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)) \
                 UNION ALL {SHADOWING}"
            )
        }
        // The definer and the modes the body was read under count too: a trigger recreated
        // with the same text by a definer that does not exist fails every change of its table
        // here alone, and one made under other modes reads its text otherwise. chainify's
        // sessions installed them, so they must match the session's own (the definer's user,
        // not its host: the same user through another host is no change).
        Dialect::MySql => format!(
            "SELECT EVENT_OBJECT_TABLE, TRIGGER_NAME, 'A', CONCAT(ACTION_TIMING, ' ', EVENT_MANIPULATION, ' ', ACTION_STATEMENT, \
             IF(SUBSTRING_INDEX(DEFINER, '@', 1) = SUBSTRING_INDEX(CURRENT_USER(), '@', 1) \
                AND SQL_MODE = @@SESSION.sql_mode \
                AND CHARACTER_SET_CLIENT = @@SESSION.character_set_client \
                AND COLLATION_CONNECTION = @@SESSION.collation_connection, '', \
                CONCAT(' -- definer ', DEFINER, ', sql_mode ', SQL_MODE, ', character set ', CHARACTER_SET_CLIENT, ' ', COLLATION_CONNECTION))) \
             FROM information_schema.TRIGGERS \
             WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE IN ({list})"
        ),
        Dialect::Sqlite => format!(
            "SELECT tbl_name, name, 'A', sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN ({list})"
        ),
    };
    (sql, vec![ReadType::Text; 4])
}

/// PostgreSQL objects a user made that chainify's SQL could resolve to instead of the built-in
/// ones (rows of [`trigger_catalog`] with an empty table name, the object in the name column):
/// a cast between built-in types (`CAST(c AS TEXT)` reads every DECIMAL); an operator chainify's
/// statements use, on the types it uses them on (an exact match beats pg_catalog's
/// `text = text` for two VARCHARs, in client statements, chainify's restores and its digest
/// triggers alike); a function named like a built-in one, on built-in types; a type named
/// like a built-in one; each in a schema on the search path, pg_catalog included (a superuser
/// may make objects there), and unless pg_catalog, which must lead the search path (the last
/// row), has one of the same signature, which then wins. Each could hide a change from the scan
/// or make this organization compute otherwise, and no restore repairs it. Objects of
/// extensions on other types or under other names (pg_trgm's `%` on text, citext, hstore) are
/// not named. `16384` is PostgreSQL's first object id for users.
const SHADOWING: &str = "\
    SELECT '', 'cast (' || format_type(k.castsource, NULL) || ' AS ' || format_type(k.casttarget, NULL) || ')', 'A', '' \
    FROM pg_cast k WHERE k.oid >= 16384 AND k.castsource < 16384 AND k.casttarget < 16384 \
    UNION ALL \
    SELECT '', 'operator ' || CAST(n.nspname AS TEXT) || '.' || CAST(o.oprname AS TEXT) || ' (' \
        || CASE WHEN o.oprleft = 0 THEN 'NONE' ELSE format_type(o.oprleft, NULL) END || ', ' \
        || format_type(o.oprright, NULL) || ')', 'A', '' \
    FROM pg_operator o JOIN pg_namespace n ON n.oid = o.oprnamespace \
    WHERE o.oid >= 16384 AND n.nspname = ANY (current_schemas(true)) \
      AND ((o.oprname IN ('=', '<>', '<', '<=', '>', '>=') \
            AND o.oprleft IN (16, 17, 20, 21, 23, 25, 705, 1042, 1043, 1700, 2276, 2277, 2283, 2776, 5077, 5078, 5079) \
            AND o.oprright IN (16, 17, 20, 21, 23, 25, 705, 1042, 1043, 1700, 2276, 2277, 2283, 2776, 5077, 5078, 5079)) \
        OR (o.oprname IN ('+', '-', '*', '/', '%') \
            AND o.oprleft IN (0, 20, 21, 23, 705, 1700, 2276, 2277, 2283, 2776, 5077, 5078, 5079) \
            AND o.oprright IN (20, 21, 23, 705, 1700, 2276, 2277, 2283, 2776, 5077, 5078, 5079)) \
        OR (o.oprname IN ('||', '~~', '!~~', '~~*', '!~~*') \
            AND o.oprleft IN (17, 25, 705, 1042, 1043, 2276, 2277, 2283, 2776, 5077, 5078, 5079) \
            AND o.oprright IN (17, 25, 705, 1042, 1043, 2276, 2277, 2283, 2776, 5077, 5078, 5079))) \
      AND NOT EXISTS (SELECT 1 FROM pg_operator b WHERE b.oid < 16384 \
                      AND b.oprnamespace = CAST('pg_catalog' AS regnamespace) AND b.oprname = o.oprname \
                      AND b.oprleft = o.oprleft AND b.oprright = o.oprright) \
    UNION ALL \
    SELECT '', 'function ' || CAST(n.nspname AS TEXT) || '.' || CAST(p.proname AS TEXT) || '(' \
        || pg_get_function_identity_arguments(p.oid) || ')', 'A', '' \
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
    WHERE p.oid >= 16384 AND n.nspname = ANY (current_schemas(true)) \
      AND NOT EXISTS (SELECT 1 FROM unnest(CAST(p.proargtypes AS oid[])) a WHERE a >= 16384) \
      AND EXISTS (SELECT 1 FROM pg_proc q WHERE q.oid < 16384 \
                  AND q.pronamespace = CAST('pg_catalog' AS regnamespace) AND q.proname = p.proname) \
      AND NOT EXISTS (SELECT 1 FROM pg_proc q WHERE q.oid < 16384 \
                      AND q.pronamespace = CAST('pg_catalog' AS regnamespace) AND q.proname = p.proname \
                      AND q.proargtypes = p.proargtypes) \
    UNION ALL \
    SELECT '', 'type ' || CAST(n.nspname AS TEXT) || '.' || CAST(t.typname AS TEXT), 'A', '' \
    FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace \
    WHERE t.oid >= 16384 AND n.nspname <> 'pg_catalog' AND n.nspname = ANY (current_schemas(true)) \
      AND NOT (t.typcategory = 'A' AND t.typelem <> 0) \
      AND EXISTS (SELECT 1 FROM pg_type u WHERE u.typnamespace = CAST('pg_catalog' AS regnamespace) \
                  AND u.typname = t.typname) \
    UNION ALL \
    SELECT '', 'search_path ' || current_setting('search_path'), 'A', '' \
    WHERE (SELECT s FROM unnest(current_schemas(true)) WITH ORDINALITY AS x(s, i) \
           WHERE s NOT LIKE 'pg\\_temp\\_%' ORDER BY i LIMIT 1) IS DISTINCT FROM 'pg_catalog'";

/// The digest table of `t`, a log the triggers only append to: a change costs one insert, with
/// no lookup of the key and no index to maintain on PostgreSQL (an upsert a change cost a
/// PostgreSQL server about three times as much CPU). `chainify_seq` orders a key's records as
/// its changes happened: changes of one key are serialized by the row's lock (or the key's
/// unique index) and record after the change, so the later one draws the later number.
fn log_table(dialect: Dialect, t: &CatalogTable) -> String {
    let mut defs = vec![
        match dialect {
            Dialect::Postgres => "chainify_seq BIGINT GENERATED ALWAYS AS IDENTITY",
            Dialect::MySql => "chainify_seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
            Dialect::Sqlite => "chainify_seq INTEGER PRIMARY KEY",
        }
        .to_owned(),
    ];
    defs.extend(
        t.key_columns()
            .map(|c| format!("{} {} NOT NULL", c.name, c.native_type)),
    );
    defs.push("chainify_was SMALLINT NOT NULL".into());
    defs.extend(
        t.columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} {}", before_column(i), c.native_type)),
    );
    let suffix = if dialect == Dialect::MySql {
        " ENGINE=InnoDB"
    } else {
        ""
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}){suffix}",
        digest_table(&t.name),
        defs.join(", ")
    )
}

/// Digest table, snapshot table and triggers for `t` in `dialect`.
pub fn artifacts(dialect: Dialect, t: &CatalogTable) -> Artifacts {
    let name = &t.name;
    let dg = digest_table(name);
    let cp = snapshot_table(name);
    let dk = dirty_table(name);
    let keys: Vec<&str> = t.primary_key.iter().map(String::as_str).collect();
    let key_list = keys.join(", ");
    let key_defs: Vec<String> = t
        .key_columns()
        .map(|c| format!("{} {} NOT NULL", c.name, c.native_type))
        .collect();
    let col_defs: Vec<String> = t
        .columns
        .iter()
        .map(|c| format!("{} {}", c.name, c.native_type))
        .collect();
    let suffix = if dialect == Dialect::MySql {
        " ENGINE=InnoDB"
    } else {
        ""
    };
    let big = if dialect == Dialect::Sqlite {
        "INTEGER"
    } else {
        "BIGINT"
    };
    let before_list: Vec<String> = (0..t.columns.len()).map(before_column).collect();
    let before_list = before_list.join(", ");
    let mut install = vec![
        log_table(dialect, t),
        format!(
            "CREATE TABLE IF NOT EXISTS {cp} (chainify_cp_block {big} NOT NULL, chainify_cp_gone SMALLINT NOT NULL DEFAULT 0, {}, PRIMARY KEY (chainify_cp_block, {key_list}){}){suffix}",
            col_defs.join(", "),
            if dialect == Dialect::MySql {
                format!(
                    ", KEY {} ({key_list}, chainify_cp_block)",
                    snapshot_index(name)
                )
            } else {
                String::new()
            }
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {dk} ({}, chainify_block {big} NOT NULL, PRIMARY KEY ({key_list})){suffix}",
            key_defs.join(", ")
        ),
    ];
    // A key as the trigger records it. SQLite rounds a DECIMAL column to its scale only after
    // the write (below), so a new key is recorded rounded as it will be stored.
    let key_ref = |prefix: &str, k: &str| -> String {
        let scale = t.columns.iter().find_map(|c| match c.ty {
            ColumnType::Decimal { scale: Some(s) } if c.name == k => Some(s),
            _ => None,
        });
        match scale {
            Some(s) if dialect == Dialect::Sqlite => sqlite_round(&format!("{prefix}.{k}"), s),
            _ => format!("{prefix}.{k}"),
        }
    };
    let row = |prefix: &str| -> String {
        keys.iter()
            .map(|k| key_ref(prefix, k))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // What a trigger records for `src` (OLD or NEW): its key, and the before-image when the
    // change removes the row from under this key (OLD), none when it creates it (NEW).
    let all_old: Vec<String> = t
        .columns
        .iter()
        .map(|c| format!("OLD.{}", c.name))
        .collect();
    let all_old = all_old.join(", ");
    let record = |src: &str| -> (String, String) {
        if src == "OLD" {
            (
                format!("{key_list}, chainify_was, {before_list}"),
                format!("{}, 1, {all_old}", row("OLD")),
            )
        } else {
            (
                format!("{key_list}, chainify_was"),
                format!("{}, 0", row(src)),
            )
        }
    };
    let key_moved = |null_safe_ne: &dyn Fn(&str) -> String| -> String {
        keys.iter()
            .map(|k| null_safe_ne(k))
            .collect::<Vec<_>>()
            .join(" OR ")
    };
    let mut uninstall = Vec::new();
    let mut triggers = Vec::new();
    match dialect {
        Dialect::Postgres => {
            let append = |src: &str| {
                let (columns, values) = record(src);
                format!("INSERT INTO {dg} ({columns}) VALUES ({values});")
            };
            let moved = key_moved(&|k| format!("NEW.{k} IS DISTINCT FROM OLD.{k}"));
            let body = format!(
                "\nBEGIN\n\
                 IF TG_OP <> 'INSERT' THEN {} END IF;\n\
                 IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND ({moved})) THEN {} END IF;\n\
                 RETURN NULL;\n\
                 END ",
                append("OLD"),
                append("NEW")
            );
            install.push(format!(
                "CREATE OR REPLACE FUNCTION {dg}_fn() RETURNS trigger LANGUAGE plpgsql AS $chainify${body}$chainify$"
            ));
            // TRUNCATE fires no row triggers: forbid it rather than miss the change.
            let truncate_body = format!(
                "\nBEGIN RAISE EXCEPTION 'chainify: shared table {name} cannot be truncated; use DELETE so the change is recorded'; END "
            );
            install.push(format!(
                "CREATE OR REPLACE FUNCTION {dg}_truncate_fn() RETURNS trigger LANGUAGE plpgsql AS $chainify${truncate_body}$chainify$"
            ));
            // The log has no key: with a publication of every table (change-data capture, a
            // logical replica) PostgreSQL would refuse the digest's DELETE without this.
            install.push(format!("ALTER TABLE {dg} REPLICA IDENTITY FULL"));
            install.push(format!("DROP TRIGGER IF EXISTS {dg} ON {name}"));
            install.push(format!(
                "CREATE TRIGGER {dg} AFTER INSERT OR UPDATE OR DELETE ON {name} FOR EACH ROW EXECUTE FUNCTION {dg}_fn()"
            ));
            install.push(format!("DROP TRIGGER IF EXISTS {dg}_truncate ON {name}"));
            install.push(format!(
                "CREATE TRIGGER {dg}_truncate BEFORE TRUNCATE ON {name} FOR EACH STATEMENT EXECUTE FUNCTION {dg}_truncate_fn()"
            ));
            // Fire also in sessions with `session_replication_role = replica`, which otherwise
            // skips ordinary triggers: a restore tool's session must not escape the digest.
            install.push(format!(
                "ALTER TABLE {name} ENABLE ALWAYS TRIGGER {dg}, ENABLE ALWAYS TRIGGER {dg}_truncate"
            ));
            // Names in the functions resolve in the table's schema, temporary tables last: a
            // session's temporary chainify_dg_… cannot swallow the records.
            install.push(format!(
                "DO $chainify$ BEGIN \
                 EXECUTE format('ALTER FUNCTION %I.{dg}_fn() SET search_path = %I, pg_temp', current_schema(), current_schema()); \
                 EXECUTE format('ALTER FUNCTION %I.{dg}_truncate_fn() SET search_path = %I, pg_temp', current_schema(), current_schema()); \
                 END $chainify$"
            ));
            // AFTER … FOR EACH ROW on INSERT, DELETE and UPDATE (1 + 4 + 8 + 16); BEFORE
            // TRUNCATE for the statement (2 + 32).
            triggers.push(ExpectedTrigger {
                name: dg.clone(),
                definition: format!("{body}|29|true|true"),
            });
            triggers.push(ExpectedTrigger {
                name: format!("{dg}_truncate"),
                definition: format!("{truncate_body}|34|true|true"),
            });
            uninstall.push(format!("DROP TRIGGER IF EXISTS {dg} ON {name}"));
            uninstall.push(format!("DROP TRIGGER IF EXISTS {dg}_truncate ON {name}"));
            uninstall.push(format!("DROP FUNCTION IF EXISTS {dg}_fn()"));
            uninstall.push(format!("DROP FUNCTION IF EXISTS {dg}_truncate_fn()"));
        }
        Dialect::MySql => {
            let append = |src: &str| {
                let (columns, values) = record(src);
                format!("INSERT INTO {dg} ({columns}) VALUES ({values});")
            };
            let moved = key_moved(&|k| format!("NOT (NEW.{k} <=> OLD.{k})"));
            for (suffix, event, body) in [
                ("ai", "INSERT", append("NEW")),
                ("ad", "DELETE", append("OLD")),
                (
                    "au",
                    "UPDATE",
                    format!(
                        "{} IF {moved} THEN {} END IF;",
                        append("OLD"),
                        append("NEW")
                    ),
                ),
            ] {
                install.push(format!("DROP TRIGGER IF EXISTS {dg}_{suffix}"));
                install.push(format!(
                    "CREATE TRIGGER {dg}_{suffix} AFTER {event} ON {name} FOR EACH ROW BEGIN {body} END"
                ));
                uninstall.push(format!("DROP TRIGGER IF EXISTS {dg}_{suffix}"));
                triggers.push(ExpectedTrigger {
                    name: format!("{dg}_{suffix}"),
                    definition: format!("AFTER {event} BEGIN {body} END"),
                });
            }
        }
        Dialect::Sqlite => {
            let append = |src: &str, condition: Option<&str>| {
                let (columns, values) = record(src);
                match condition {
                    None => format!("INSERT INTO {dg} ({columns}) VALUES ({values});"),
                    Some(c) => {
                        format!("INSERT INTO {dg} ({columns}) SELECT {values} WHERE {c};")
                    }
                }
            };
            // SQLite keeps any number in a DECIMAL column as it came (1.005 stays 1.005 in a
            // DECIMAL(10,2)); round it to the declared scale as PostgreSQL and MySQL do on
            // store, so later arithmetic sees the same value everywhere. The decimal 1.005 is
            // the double 1.00499999…, so the value is first nudged away from zero by 4e-16
            // (relative: two to four ulps, more than a decimal's error as a double and far less
            // than half a unit of its 15th digit — 1e-15 moved 6000000000000.01 to .02): that
            // rounds the decimal the user wrote, half away from zero, for the 15 significant
            // digits SQLite keeps exactly. (Nested trigger firing is off by default, so this
            // UPDATE is not recorded twice.)
            let decimals: Vec<(&str, u8)> = t
                .columns
                .iter()
                .filter_map(|c| match c.ty {
                    ColumnType::Decimal { scale: Some(s) } => Some((c.name.as_str(), s)),
                    _ => None,
                })
                .collect();
            let normalize = if decimals.is_empty() {
                String::new()
            } else {
                let sets: Vec<String> = decimals
                    .iter()
                    .map(|(c, s)| format!("{c} = {}", sqlite_round(c, *s)))
                    .collect();
                let differs: Vec<String> = decimals
                    .iter()
                    .map(|(c, s)| format!("{c} IS NOT {}", sqlite_round(c, *s)))
                    .collect();
                let at_key: Vec<String> = keys.iter().map(|k| format!("{k} = NEW.{k}")).collect();
                format!(
                    " UPDATE {name} SET {} WHERE {} AND ({});",
                    sets.join(", "),
                    at_key.join(" AND "),
                    differs.join(" OR ")
                )
            };
            // SQLite stores whatever it is given; the other engines reject values that do
            // not fit the declared type. Reject them here too, before the write, so a bad value
            // aborts the transaction on every engine alike.
            let checks = sqlite_value_checks(t);
            if !checks.is_empty() {
                for (suffix, event) in [("bi", "INSERT"), ("bu", "UPDATE")] {
                    let create = format!(
                        "CREATE TRIGGER {dg}_{suffix} BEFORE {event} ON {name} FOR EACH ROW BEGIN {} END",
                        checks.join(" ")
                    );
                    install.push(format!("DROP TRIGGER IF EXISTS {dg}_{suffix}"));
                    install.push(create.clone());
                    uninstall.push(format!("DROP TRIGGER IF EXISTS {dg}_{suffix}"));
                    triggers.push(ExpectedTrigger {
                        name: format!("{dg}_{suffix}"),
                        definition: create,
                    });
                }
            }
            let moved = key_moved(&|k| format!("{} IS NOT OLD.{k}", key_ref("NEW", k)));
            for (suffix, event, body) in [
                (
                    "ai",
                    "INSERT",
                    format!("{}{normalize}", append("NEW", None)),
                ),
                ("ad", "DELETE", append("OLD", None)),
                (
                    "au",
                    "UPDATE",
                    format!(
                        "{} {}{normalize}",
                        append("OLD", None),
                        append("NEW", Some(&moved))
                    ),
                ),
            ] {
                let create = format!(
                    "CREATE TRIGGER {dg}_{suffix} AFTER {event} ON {name} FOR EACH ROW BEGIN {body} END"
                );
                install.push(format!("DROP TRIGGER IF EXISTS {dg}_{suffix}"));
                install.push(create.clone());
                uninstall.push(format!("DROP TRIGGER IF EXISTS {dg}_{suffix}"));
                triggers.push(ExpectedTrigger {
                    name: format!("{dg}_{suffix}"),
                    definition: create,
                });
            }
        }
    }
    // MySQL creates it with the table.
    if dialect != Dialect::MySql {
        install.push(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {cp} ({key_list}, chainify_cp_block)",
            snapshot_index(name)
        ));
    }
    uninstall.push(format!("DROP TABLE IF EXISTS {dg}"));
    uninstall.push(format!("DROP TABLE IF EXISTS {cp}"));
    uninstall.push(format!("DROP TABLE IF EXISTS {dk}"));
    Artifacts {
        install,
        uninstall,
        triggers,
    }
}

/// SQLite: one `SELECT RAISE(ABORT, …)` per column whose declared type limits its values as
/// PostgreSQL and strict MySQL do: integers only in integer columns, DECIMAL(p, s) below
/// 10^(p-s), VARCHAR(n) up to n characters, booleans 0/1, bytes only in byte columns.
fn sqlite_value_checks(t: &CatalogTable) -> Vec<String> {
    let mut checks = Vec::new();
    for c in &t.columns {
        let v = format!("NEW.{}", c.name);
        let args = crate::catalog::declared_args(&c.native_type);
        let (condition, expected) = match &c.ty {
            // SQLite's integers are all 64-bit: a declared SMALLINT or INTEGER is as narrow as
            // on the other engines only when the width is checked.
            ColumnType::Int => match Limit::of_declared(&c.native_type, &c.ty) {
                Limit::IntBits(bits) if bits < 64 => {
                    let max = (1i64 << (bits - 1)) - 1;
                    (
                        format!(
                            "typeof({v}) NOT IN ('integer', 'null') OR {v} NOT BETWEEN {} AND {max}",
                            -max - 1
                        ),
                        format!("a {bits}-bit integer"),
                    )
                }
                _ => (
                    format!("typeof({v}) NOT IN ('integer', 'null')"),
                    "an integer".to_owned(),
                ),
            },
            // The bound applies after rounding to the scale, as PostgreSQL and MySQL round
            // before they check (99.996 in a DECIMAL(4,2) is 100.00: too large).
            ColumnType::Decimal { scale: Some(s) } => {
                let digits = args
                    .first()
                    .copied()
                    .unwrap_or(15)
                    .saturating_sub(u32::from(*s));
                (
                    format!(
                        "typeof({v}) NOT IN ('integer', 'real', 'null') OR abs({}) >= 1e{digits}",
                        sqlite_round(&v, *s)
                    ),
                    format!("a number below 10^{digits}"),
                )
            }
            ColumnType::Text => match args.first() {
                Some(n) => (
                    format!("typeof({v}) NOT IN ('text', 'null') OR length({v}) > {n}"),
                    format!("text of at most {n} characters"),
                ),
                None => (
                    format!("typeof({v}) NOT IN ('text', 'null')"),
                    "text".to_owned(),
                ),
            },
            ColumnType::Bool => (
                format!("{v} IS NOT NULL AND (typeof({v}) <> 'integer' OR {v} NOT IN (0, 1))"),
                "a boolean".to_owned(),
            ),
            ColumnType::Bytes => (
                format!("typeof({v}) NOT IN ('blob', 'null')"),
                "bytes".to_owned(),
            ),
            _ => continue,
        };
        checks.push(format!(
            "SELECT RAISE(ABORT, 'chainify: column {} of table {} takes {expected}') WHERE {condition};",
            c.name, t.name
        ));
    }
    checks
}

/// SQLite: `column` rounded half away from zero at `scale`, as the decimal it was written as.
/// A value with no more places than `scale` is kept as it is: nudged, one of 15 significant
/// digits near the next power of ten crossed the half unit (999999999.999999 in a
/// DECIMAL(15,6) rounded to 10^9 and was refused as too large, where the others store it; the
/// nudge is 4.4e-16 relative, half a unit of the 15th digit 5e-16 of 999999999999999).
fn sqlite_round(column: &str, scale: u8) -> String {
    format!(
        "(CASE WHEN {column} = round({column}, {scale}) THEN {column} ELSE round({column} * (1 + 4e-16), {scale}) END)"
    )
}

/// Reads every record of `t`'s change log in the order the changes happened, each with the
/// key's current row (all columns NULL when the row is gone). A key's first record holds its
/// image before its first change (the later ones hold images the block itself made), so the
/// reader keeps the first record of each key ([`crate::state::first_changes`]); picking it in
/// the engine takes a window function, which costs MariaDB a temporary table a query.
/// Columns: keys…, every column of `t`, `chainify_was` (1: the key existed before), every column of `t` again
/// (the before-image).
pub fn read_changes(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let name = &t.name;
    let dg = digest_table(name);
    let mut types = Vec::new();
    let mut select = Vec::new();
    for c in t.key_columns() {
        let ty = ReadType::of(&c.ty);
        select.push(read_expr(dialect, &format!("d.{}", c.name), ty));
        types.push(ty);
    }
    for c in &t.columns {
        let ty = ReadType::of(&c.ty);
        select.push(read_expr(dialect, &format!("r.{}", c.name), ty));
        types.push(ty);
    }
    select.push(read_expr(dialect, "d.chainify_was", ReadType::Int));
    types.push(ReadType::Int);
    for (i, c) in t.columns.iter().enumerate() {
        let ty = ReadType::of(&c.ty);
        select.push(read_expr(dialect, &format!("d.{}", before_column(i)), ty));
        types.push(ty);
    }
    let on: Vec<String> = t
        .primary_key
        .iter()
        .map(|k| format!("r.{k} = d.{k}"))
        .collect();
    (
        format!(
            "SELECT {} FROM {dg} d LEFT JOIN {name} r ON {} ORDER BY d.chainify_seq",
            select.join(", "),
            on.join(" AND ")
        ),
        types,
    )
}

/// Opens the digest's database transaction, as statements sent in one text: from here until
/// it ends, no change can be recorded in the digest tables of `tables`, so the digest consumes
/// exactly the changes it then reads with [`read_changes`] (a direct write meanwhile waits, and
/// is the next block's). PostgreSQL locks the tables against every writer (readers go on), and
/// joins each change to its row by the key's index: with no statistics on the change tables,
/// which are empty between blocks, it would hash the whole table instead (0.75 ms for 10 000
/// rows). MySQL locks every change row and the gaps between them by a locking scan in
/// REPEATABLE READ before anything else reads: the snapshot of the reads after it starts only
/// then, so it sees every change the locks admitted (a snapshot taken before them would refuse
/// a locking read of a row changed meanwhile, MariaDB's `innodb_snapshot_isolation`), and the
/// base tables' rows stay unlocked. SQLite needs neither: its block holds the only writer lock.
pub fn begin_digest<'a>(
    dialect: Dialect,
    tables: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let names: Vec<String> = tables.into_iter().map(digest_table).collect();
    match dialect {
        Dialect::Postgres => {
            let mut out: Vec<String> = [
                "BEGIN",
                "SET LOCAL enable_hashjoin = off",
                "SET LOCAL enable_mergejoin = off",
            ]
            .map(String::from)
            .to_vec();
            if !names.is_empty() {
                out.push(format!(
                    "LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE",
                    names.join(", ")
                ));
            }
            out
        }
        Dialect::MySql => {
            let mut out = vec![
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ".to_owned(),
                "BEGIN".to_owned(),
            ];
            out.extend(
                names
                    .iter()
                    .map(|dg| format!("SELECT 1 FROM {dg} FOR UPDATE")),
            );
            out
        }
        Dialect::Sqlite => vec!["BEGIN IMMEDIATE".into()],
    }
}

/// `bytes` as a literal of `dialect` (hex digits only, whatever the session's string settings).
pub fn bytes_literal(dialect: Dialect, bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    match dialect {
        Dialect::Postgres => format!("decode('{hex}', 'hex')"),
        Dialect::MySql | Dialect::Sqlite => format!("X'{hex}'"),
    }
}

/// What a block's digest writes once it has read and hashed the changes.
#[derive(Clone, Debug)]
pub struct DigestWrites<'a> {
    /// The block.
    pub block: i64,
    /// The tables whose recorded changes the digest read (and now consumes).
    pub changed: Vec<&'a CatalogTable>,
    /// Every shared table's accumulator after the block: (table, bytes).
    pub states: Vec<(&'a str, Vec<u8>)>,
    /// Accumulators of blocks below this one go, unless a checkpoint needs them.
    pub forget_states_below: i64,
    /// The block's hash digest.
    pub digest: &'a [u8],
    /// The block's success bits, packed.
    pub success: &'a [u8],
    /// How many transactions the block has.
    pub tx_count: i64,
    /// The ids of the block's transactions that passed validation.
    pub tx_ids: Vec<&'a [u8]>,
    /// Whether per-transaction markers of the block may exist (to clear).
    pub markers: bool,
}

/// One of the digest's writes: its text and the values bound to its parameters (none where the
/// text carries its values as literals).
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// The statement.
    pub sql: String,
    /// The values of its parameters `1..`, in order.
    pub params: Vec<Value>,
}

/// Whether [`digest_writes`] binds its values, a row a statement (SQLite, in process: no round
/// trip to save), rather than writing them as literals into one text.
pub fn binds_digest_writes(dialect: Dialect) -> bool {
    dialect == Dialect::Sqlite
}

/// The values of one statement of [`digest_writes`]: literals in the text, or parameters.
struct Carried {
    dialect: Dialect,
    params: Vec<Value>,
}

impl Carried {
    fn int(&mut self, v: i64) -> String {
        self.carry(Value::Int(v), v.to_string())
    }

    /// A plain name (a table's), quoted as a literal.
    fn name(&mut self, name: &str) -> String {
        debug_assert!(crate::catalog::is_plain_name(name));
        self.carry(Value::Text(name.to_owned()), format!("'{name}'"))
    }

    fn bytes(&mut self, b: &[u8]) -> String {
        let literal = bytes_literal(self.dialect, b);
        self.carry(Value::Bytes(b.to_vec()), literal)
    }

    fn carry(&mut self, value: Value, literal: String) -> String {
        if !binds_digest_writes(self.dialect) {
            return literal;
        }
        self.params.push(value);
        format!("?{}", self.params.len())
    }

    fn write(&mut self, sql: String) -> Write {
        Write {
            sql,
            params: std::mem::take(&mut self.params),
        }
    }
}

/// The digest's writes: the recorded keys become dirty and the records go, set-based in the
/// engine, and the block's accumulators, outcome and transaction ids are recorded.
///
/// On PostgreSQL and MySQL they are sent as one text with literal values (numbers, hex bytes
/// and plain table names only, never a value of a shared table's row): one round trip instead
/// of one per statement and table. SQLite runs in process, with no round trip to save: its
/// writes bind their values, so each text is parsed once per connection (the accumulators alone
/// were 12 KB of hex to parse a block), and write one row each, so none needs a statement
/// journal.
pub fn digest_writes(dialect: Dialect, w: &DigestWrites<'_>) -> Vec<Write> {
    let one_text = !binds_digest_writes(dialect);
    let mut v = Carried {
        dialect,
        params: Vec::new(),
    };
    let mut out = Vec::new();
    let mut names = Vec::new();
    for t in &w.changed {
        debug_assert!(crate::catalog::is_plain_name(&t.name));
        let keys = t.primary_key.join(", ");
        let (dg, dk) = (digest_table(&t.name), dirty_table(&t.name));
        // SQLite reads `ON CONFLICT` after a bare `FROM` as the join's constraint: the WHERE
        // makes it the upsert's.
        let b = v.int(w.block);
        let sql = match dialect {
            Dialect::MySql => format!(
                "INSERT INTO {dk} ({keys}, chainify_block) SELECT DISTINCT {keys}, {b} FROM {dg} ON DUPLICATE KEY UPDATE chainify_block = {b}"
            ),
            // The log holds a key once a change: PostgreSQL's upsert refuses to touch a row
            // twice in one statement.
            _ => format!(
                "INSERT INTO {dk} ({keys}, chainify_block) SELECT DISTINCT {keys}, {b} FROM {dg} WHERE 1 = 1 ON CONFLICT ({keys}) DO UPDATE SET chainify_block = {b}"
            ),
        };
        out.push(v.write(sql));
        out.push(v.write(format!("DELETE FROM {dg}")));
        names.push(t.name.as_str());
    }
    // Bound, a statement a table: the texts do not depend on which tables changed.
    let lists: Vec<Vec<&str>> = if one_text {
        vec![names]
    } else {
        names.into_iter().map(|n| vec![n]).collect()
    };
    for list in lists.into_iter().filter(|l| !l.is_empty()) {
        let b = v.int(w.block);
        let list: Vec<String> = list.into_iter().map(|n| v.name(n)).collect();
        let list = match list.as_slice() {
            [one] => format!("= {one}"),
            _ => format!("IN ({})", list.join(", ")),
        };
        out.push(v.write(format!(
            "UPDATE chainify_shared_tables SET last_changed_block = {b} WHERE table_name {list}"
        )));
    }
    // Bound rows go one statement each: the parameters of a row are taken as it is written.
    let state_rows: Vec<(String, Vec<Value>)> = w
        .states
        .iter()
        .map(|(table, lanes)| {
            let row = format!(
                "({}, {}, {})",
                v.int(w.block),
                v.name(table),
                v.bytes(lanes)
            );
            (row, std::mem::take(&mut v.params))
        })
        .collect();
    // Rows of this block or later can only have been planted (this block's are written here,
    // in its own transaction; later ones have not run): one would stall every digest of its
    // block on the primary key.
    let from = v.int(w.block);
    out.push(v.write(format!("DELETE FROM chainify_state WHERE block >= {from}")));
    write_rows(
        &mut out,
        one_text,
        "INSERT INTO chainify_state (block, table_name, lanes)",
        state_rows,
        "",
    );
    let below = v.int(w.forget_states_below);
    out.push(v.write(format!(
        "DELETE FROM chainify_state WHERE block >= 0 AND block < {below} AND block NOT IN (SELECT block FROM chainify_checkpoints)"
    )));
    // As with the accumulators: a row of this block or later can only have been planted.
    let from = v.int(w.block);
    out.push(v.write(format!(
        "DELETE FROM chainify_applied_blocks WHERE block >= {from}"
    )));
    let row = format!(
        "({}, {}, {}, {})",
        v.int(w.block),
        v.bytes(w.digest),
        v.bytes(w.success),
        v.int(w.tx_count)
    );
    out.push(v.write(format!(
        "INSERT INTO chainify_applied_blocks (block, digest, success, tx_count) VALUES {row}"
    )));
    let id_rows: Vec<(String, Vec<Value>)> = w
        .tx_ids
        .iter()
        .map(|id| {
            let row = format!("({}, {})", v.bytes(id), v.int(w.block));
            (row, std::mem::take(&mut v.params))
        })
        .collect();
    write_rows(
        &mut out,
        one_text,
        "INSERT INTO chainify_tx_index (tx_id, block)",
        id_rows,
        // An id indexed already can only have been planted: validation found it in no
        // earlier block (and refuses one that is), and this block is not applied yet. On the
        // primary key it would fail every digest of the block.
        match dialect {
            Dialect::MySql => " ON DUPLICATE KEY UPDATE block = VALUES(block)",
            Dialect::Postgres | Dialect::Sqlite => {
                " ON CONFLICT (tx_id) DO UPDATE SET block = excluded.block"
            }
        },
    );
    if w.markers {
        let b = v.int(w.block);
        out.push(v.write(format!(
            "DELETE FROM chainify_applied_txs WHERE block = {b}"
        )));
    }
    out
}

/// `rows` of one table inserted by one statement, or (bound) by one statement each.
fn write_rows(
    out: &mut Vec<Write>,
    one_text: bool,
    insert: &str,
    rows: Vec<(String, Vec<Value>)>,
    then: &str,
) {
    if rows.is_empty() {
        return;
    }
    if one_text {
        let rows: Vec<String> = rows.into_iter().map(|(row, _)| row).collect();
        out.push(Write {
            sql: format!("{insert} VALUES {}{then}", rows.join(", ")),
            params: Vec::new(),
        });
    } else {
        out.extend(rows.into_iter().map(|(row, params)| Write {
            sql: format!("{insert} VALUES {row}{then}"),
            params,
        }));
    }
}

/// Every row of `t` in no particular order, read like the digest reads images: what a full scan
/// of the state digest hashes.
pub fn scan(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let (select, types) = column_select(dialect, t);
    (format!("SELECT {select} FROM {}", t.name), types)
}

/// Every row of `t` in key order, read like the digest reads images (tests, tools).
pub fn select_all(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let (select, types) = column_select(dialect, t);
    // Qualified, the sort keys are the table's columns: a bare name would be PostgreSQL's
    // output of that name, the text a decimal is read as (-0.001 before -1.000).
    let order: Vec<String> = t
        .primary_key
        .iter()
        .map(|k| format!("{}.{k}", t.name))
        .collect();
    (
        format!(
            "SELECT {select} FROM {} ORDER BY {}",
            t.name,
            order.join(", ")
        ),
        types,
    )
}

/// `rows` tuples of `width` placeholders numbered from `first`, as the right-hand side of a
/// row-value `IN` in `dialect`.
fn tuple_list(dialect: Dialect, rows: usize, width: usize, first: usize) -> String {
    let mut n = first - 1;
    let tuples: Vec<String> = (0..rows)
        .map(|_| {
            let ps: Vec<String> = (0..width)
                .map(|_| {
                    n += 1;
                    placeholder(dialect, n)
                })
                .collect();
            format!("({})", ps.join(", "))
        })
        .collect();
    match dialect {
        Dialect::MySql => tuples.join(", "),
        _ => format!("VALUES {}", tuples.join(", ")),
    }
}

/// Records the block transactions `held` (index, success) of `block` as applied
/// (`chainify_applied_txs`), as a text of literal numbers to send with a COMMIT.
pub fn markers_literal(block: i64, held: &[(usize, bool)]) -> String {
    let rows: Vec<String> = held
        .iter()
        .map(|&(index, ok)| format!("({block}, {index}, {})", u8::from(ok)))
        .collect();
    format!(
        "INSERT INTO chainify_applied_txs (block, tx_index, success) VALUES {}",
        rows.join(", ")
    )
}

/// Records `rows` block transactions as applied (`chainify_applied_txs`). Parameters per row:
/// the block, the transaction's index, whether it succeeded.
pub fn insert_markers(dialect: Dialect, rows: usize) -> String {
    let values = tuple_list(dialect, rows, 3, 1);
    let values = values.strip_prefix("VALUES ").unwrap_or(&values);
    format!("INSERT INTO chainify_applied_txs (block, tx_index, success) VALUES {values}")
}

/// The key columns of `t`, read like the digest reads them.
fn key_select(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let mut types = Vec::new();
    let mut select = Vec::new();
    for c in t.key_columns() {
        let ty = ReadType::of(&c.ty);
        select.push(read_expr(dialect, &c.name, ty));
        types.push(ty);
    }
    (select.join(", "), types)
}

/// Every column of `t`, read like the digest reads images.
fn column_select(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let types: Vec<ReadType> = t.columns.iter().map(|c| ReadType::of(&c.ty)).collect();
    let select: Vec<String> = t
        .columns
        .iter()
        .zip(&types)
        .map(|(c, ty)| read_expr(dialect, &c.name, *ty))
        .collect();
    (select.join(", "), types)
}

/// The keys of `t` that may differ from its state at the checkpoint of block `$1`: those a
/// digested block after it changed, and those with changes not digested yet (a block cut
/// short, changes made outside chainify).
pub fn dirty_keys(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let (select, types) = key_select(dialect, t);
    (
        format!(
            "SELECT {select} FROM {} WHERE chainify_block > {} UNION SELECT {select} FROM {}",
            dirty_table(&t.name),
            placeholder(dialect, 1),
            digest_table(&t.name)
        ),
        types,
    )
}

/// The rows of one snapshot of `t` ([`in_layers`] parameters), read like the digest reads
/// images.
pub fn snapshot_rows(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let (select, types) = column_select(dialect, t);
    (
        format!(
            "SELECT {select} FROM {} s WHERE {}",
            snapshot_table(&t.name),
            in_layers(dialect, t, "s", 1)
        ),
        types,
    )
}

/// The keys (and tombstones) of `t`'s layer `$1`.
pub fn snapshot_keys(dialect: Dialect, t: &CatalogTable) -> (String, Vec<ReadType>) {
    let (select, types) = key_select(dialect, t);
    (
        format!(
            "SELECT {select} FROM {} WHERE chainify_cp_block = {}",
            snapshot_table(&t.name),
            placeholder(dialect, 1)
        ),
        types,
    )
}

/// Deletes `keys` keys (parameters from `$2` on, one tuple of key values each) from `t`'s
/// layer `$1`.
pub fn delete_snapshot_keys(dialect: Dialect, t: &CatalogTable, keys: usize) -> String {
    let cp = snapshot_table(&t.name);
    let p1 = placeholder(dialect, 1);
    let among = if let [k] = t.primary_key.as_slice() {
        let list: Vec<String> = (2..keys + 2).map(|n| placeholder(dialect, n)).collect();
        format!("{k} IN ({})", list.join(", "))
    } else {
        format!(
            "({}) IN ({})",
            t.primary_key.join(", "),
            tuple_list(dialect, keys, t.primary_key.len(), 2)
        )
    };
    format!("DELETE FROM {cp} WHERE chainify_cp_block = {p1} AND {among}")
}

/// Inserts `rows` rows into `t`'s snapshot table. Parameters per row: the snapshot block, then
/// every column.
pub fn insert_snapshot_rows(dialect: Dialect, t: &CatalogTable, rows: usize) -> String {
    let values = tuple_list(dialect, rows, t.columns.len() + 1, 1);
    let values = values.strip_prefix("VALUES ").unwrap_or(&values);
    format!(
        "INSERT INTO {} (chainify_cp_block, {}) VALUES {values}",
        snapshot_table(&t.name),
        column_list(t)
    )
}

/// After a restore to the checkpoint of block `$1` (given again as `$2`): keys changed after it
/// are changed "at" it now (the restore undid their later changes, and a restore to an older
/// checkpoint must still repair them).
pub fn fold_dirty(dialect: Dialect, t: &CatalogTable) -> String {
    format!(
        "UPDATE {} SET chainify_block = {} WHERE chainify_block > {}",
        dirty_table(&t.name),
        placeholder(dialect, 1),
        placeholder(dialect, 2)
    )
}

/// Forgets dirty keys no kept checkpoint needs: those last changed at or before block `$1`,
/// the oldest kept checkpoint.
pub fn prune_dirty(dialect: Dialect, t: &CatalogTable) -> String {
    format!(
        "DELETE FROM {} WHERE chainify_block <= {}",
        dirty_table(&t.name),
        placeholder(dialect, 1)
    )
}

/// A delta layer of `t` at block `$1`: the rows, and tombstones for the missing keys, of every
/// key recorded as changed after block `$2`. Two statements; nothing travels through the
/// client.
pub fn snapshot_delta(dialect: Dialect, t: &CatalogTable) -> [String; 2] {
    let cp = snapshot_table(&t.name);
    let dk = dirty_table(&t.name);
    let name = &t.name;
    let cols = column_list(t);
    let keys = t.primary_key.join(", ");
    let matching = |a: &str, b: &str| same_key(t, a, b);
    let d_keys = t
        .primary_key
        .iter()
        .map(|k| format!("d.{k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let p = |n| placeholder(dialect, n);
    [
        // Driven from the dirty keys: the table's rows are found by key, never scanned.
        format!(
            "INSERT INTO {cp} (chainify_cp_block, {cols}) SELECT {}, {} FROM {dk} d JOIN {name} r ON {} WHERE d.chainify_block > {}",
            p(1),
            t.columns
                .iter()
                .map(|c| format!("r.{}", c.name))
                .collect::<Vec<_>>()
                .join(", "),
            matching("d", "r"),
            p(2)
        ),
        format!(
            "INSERT INTO {cp} (chainify_cp_block, chainify_cp_gone, {keys}) SELECT {}, 1, {d_keys} FROM {dk} d WHERE d.chainify_block > {} AND NOT EXISTS (SELECT 1 FROM {name} r WHERE {})",
            p(1),
            p(2),
            matching("r", "d")
        ),
    ]
}

/// Folds delta layer `$2` of `t` into the base layer `$1` below it, whose snapshot no checkpoint
/// needs any more, after the base's rows of the delta's keys were deleted
/// ([`snapshot_keys`] of the delta, [`delete_snapshot_keys`] from the base: by key, so the
/// base is never scanned): the delta's rows move into the base, its tombstones go. The base
/// then holds the delta's snapshot. Parameters: `[base, delta]`, then `[delta]`.
pub fn fold_layer(dialect: Dialect, t: &CatalogTable) -> [String; 2] {
    let cp = snapshot_table(&t.name);
    let p = |n| placeholder(dialect, n);
    [
        format!(
            "UPDATE {cp} SET chainify_cp_block = {} WHERE chainify_cp_block = {} AND chainify_cp_gone = 0",
            p(1),
            p(2)
        ),
        format!("DELETE FROM {cp} WHERE chainify_cp_block = {}", p(1)),
    ]
}

/// Copies `t` into its snapshot table under block `$1`: a base layer.
pub fn snapshot(dialect: Dialect, t: &CatalogTable) -> String {
    let cols = column_list(t);
    format!(
        "INSERT INTO {} (chainify_cp_block, {cols}) SELECT {}, {cols} FROM {}",
        snapshot_table(&t.name),
        placeholder(dialect, 1),
        t.name
    )
}

/// The statements that turn `keys` keys of `t` (parameters after the [`LAYER_PARAMS`] of
/// [`in_layers`], one tuple of key values each; [`dirty_keys`]) back into one of its snapshots,
/// touching only the
/// rows that differ: delete rows whose key the snapshot lacks (run children first), update rows
/// whose values differ, insert rows the table lacks (run parents first). The update is `None`
/// for a table with key columns only. A restore thus costs the keys changed since the
/// checkpoint, not a scan of the table.
pub fn restore(
    dialect: Dialect,
    t: &CatalogTable,
    keys: usize,
) -> (String, Option<String>, String) {
    restore_rows(dialect, t, Some(keys))
}

/// The statements of [`restore`] for every row of the table at once (a full restore: no record
/// says which keys differ). Parameters: the snapshot's ([`in_layers`]).
pub fn restore_all(dialect: Dialect, t: &CatalogTable) -> (String, Option<String>, String) {
    restore_rows(dialect, t, None)
}

fn restore_rows(
    dialect: Dialect,
    t: &CatalogTable,
    keys: Option<usize>,
) -> (String, Option<String>, String) {
    let name = &t.name;
    let cp = snapshot_table(name);
    let view = in_layers(dialect, t, "s", 1);
    let among = |alias: &str| -> String {
        let Some(keys) = keys else {
            return "1 = 1".to_owned();
        };
        // A plain IN for a one-column key: MariaDB plans it as index lookups, while a list of
        // one-element row values makes it scan the table.
        if let [k] = t.primary_key.as_slice() {
            let first = LAYER_PARAMS + 1;
            let list: Vec<String> = (first..keys + first)
                .map(|n| placeholder(dialect, n))
                .collect();
            return format!("{alias}.{k} IN ({})", list.join(", "));
        }
        format!(
            "({}) IN ({})",
            t.primary_key
                .iter()
                .map(|k| format!("{alias}.{k}"))
                .collect::<Vec<_>>()
                .join(", "),
            tuple_list(dialect, keys, t.primary_key.len(), LAYER_PARAMS + 1)
        )
    };
    let key_match = |a: &str, b: &str| same_key(t, a, b);
    let delete = format!(
        "DELETE FROM {name} WHERE NOT EXISTS (SELECT 1 FROM {cp} s WHERE {view} AND {}) AND {}",
        key_match("s", name),
        among(name)
    );
    let values: Vec<&str> = t
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| !t.primary_key.iter().any(|k| k == c))
        .collect();
    let update = (!values.is_empty()).then(|| {
        let same = values
            .iter()
            .map(|c| match dialect {
                Dialect::Postgres => format!("{name}.{c} IS NOT DISTINCT FROM s.{c}"),
                Dialect::MySql => format!("{name}.{c} <=> s.{c}"),
                Dialect::Sqlite => format!("{name}.{c} IS s.{c}"),
            })
            .collect::<Vec<_>>()
            .join(" AND ");
        match dialect {
            Dialect::MySql => format!(
                "UPDATE {name} JOIN {cp} s ON {view} AND {} SET {} WHERE NOT ({same}) AND {}",
                key_match("s", name),
                values
                    .iter()
                    .map(|c| format!("{name}.{c} = s.{c}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                among(name)
            ),
            _ => format!(
                "UPDATE {name} SET {} FROM (SELECT * FROM {cp} s WHERE {view} AND {}) s WHERE {} AND NOT ({same})",
                values
                    .iter()
                    .map(|c| format!("{c} = s.{c}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                among("s"),
                key_match("s", name)
            ),
        }
    });
    let cols = column_list(t);
    let insert = format!(
        "INSERT INTO {name} ({cols}) SELECT {} FROM {cp} s WHERE {view} AND {} AND NOT EXISTS (SELECT 1 FROM {name} r WHERE {})",
        t.columns
            .iter()
            .map(|c| format!("s.{}", c.name))
            .collect::<Vec<_>>()
            .join(", "),
        among("s"),
        key_match("r", "s")
    );
    (delete, update, insert)
}

/// Deletes the snapshot of `table` taken at block `$1`.
pub fn drop_snapshot(dialect: Dialect, table: &str) -> String {
    format!(
        "DELETE FROM {} WHERE chainify_cp_block = {}",
        snapshot_table(table),
        placeholder(dialect, 1)
    )
}

fn column_list(t: &CatalogTable) -> String {
    t.columns
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::tests::col;

    fn table() -> CatalogTable {
        CatalogTable {
            name: "acct".into(),
            columns: vec![
                col("bank", "INTEGER"),
                col("id", "BIGINT"),
                col("bal", "DECIMAL(12,2)"),
                col("note", "TEXT"),
            ],
            primary_key: vec!["bank".into(), "id".into()],
            ..CatalogTable::default()
        }
    }

    #[test]
    fn postgres_objects() {
        let a = artifacts(Dialect::Postgres, &table());
        assert_eq!(
            a.install[0],
            "CREATE TABLE IF NOT EXISTS chainify_dg_acct (chainify_seq BIGINT GENERATED ALWAYS AS IDENTITY, bank INTEGER NOT NULL, id BIGINT NOT NULL, chainify_was SMALLINT NOT NULL, chainify_o1 INTEGER, chainify_o2 BIGINT, chainify_o3 DECIMAL(12,2), chainify_o4 TEXT)"
        );
        assert!(a.install[3].contains("IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND (NEW.bank IS DISTINCT FROM OLD.bank OR NEW.id IS DISTINCT FROM OLD.id))"));
        // A change removing a row records the row before it (OLD), one creating it none; both
        // only append.
        assert!(a.install[3].contains("INSERT INTO chainify_dg_acct (bank, id, chainify_was, chainify_o1, chainify_o2, chainify_o3, chainify_o4) VALUES (OLD.bank, OLD.id, 1, OLD.bank, OLD.id, OLD.bal, OLD.note);"));
        assert!(a.install[3].contains(
            "INSERT INTO chainify_dg_acct (bank, id, chainify_was) VALUES (NEW.bank, NEW.id, 0);"
        ));
        assert!(!a.install[3].contains("CONFLICT"));
        assert!(
            a.install
                .iter()
                .any(|s| s == "ALTER TABLE chainify_dg_acct REPLICA IDENTITY FULL")
        );
        // Fires for replica-role sessions; names resolve in the table's schema.
        assert!(
            a.install
                .iter()
                .any(|s| s.contains("ENABLE ALWAYS TRIGGER chainify_dg_acct,"))
        );
        assert!(
            a.install
                .iter()
                .any(|s| s.contains("SET search_path = %I, pg_temp"))
        );
        assert_eq!(a.triggers.len(), 2);
        assert!(a.triggers[0].definition.ends_with("|29|true|true"));
        assert!(
            a.install
                .iter()
                .any(|s| s.contains("BEFORE TRUNCATE ON acct"))
        );
        assert!(
            a.uninstall
                .iter()
                .any(|s| s == "DROP TABLE IF EXISTS chainify_cp_acct")
        );
    }

    #[test]
    fn mysql_objects() {
        let a = artifacts(Dialect::MySql, &table());
        assert!(a.install[0].starts_with(
            "CREATE TABLE IF NOT EXISTS chainify_dg_acct (chainify_seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, bank INTEGER NOT NULL,"
        ));
        assert!(a.install[0].ends_with("chainify_o4 TEXT) ENGINE=InnoDB"));
        let au = a
            .install
            .iter()
            .find(|s| s.starts_with("CREATE TRIGGER chainify_dg_acct_au"))
            .unwrap();
        assert!(au.contains("IF NOT (NEW.bank <=> OLD.bank) OR NOT (NEW.id <=> OLD.id) THEN INSERT INTO chainify_dg_acct (bank, id, chainify_was) VALUES (NEW.bank, NEW.id, 0); END IF;"), "{au}");
        assert!(
            a.triggers
                .iter()
                .any(|t| t.definition.starts_with("AFTER UPDATE BEGIN "))
        );
    }

    #[test]
    fn sqlite_objects_round_decimals() {
        let a = artifacts(Dialect::Sqlite, &table());
        let ai = a
            .install
            .iter()
            .find(|s| s.starts_with("CREATE TRIGGER chainify_dg_acct_ai"))
            .unwrap();
        assert!(ai.contains("UPDATE acct SET bal = (CASE WHEN bal = round(bal, 2) THEN bal ELSE round(bal * (1 + 4e-16), 2) END) WHERE bank = NEW.bank AND id = NEW.id AND (bal IS NOT (CASE WHEN bal = round(bal, 2) THEN bal ELSE round(bal * (1 + 4e-16), 2) END));"), "{ai}");
        let ad = a
            .install
            .iter()
            .find(|s| s.starts_with("CREATE TRIGGER chainify_dg_acct_ad"))
            .unwrap();
        assert!(!ad.contains("round"));
        let bi = a
            .install
            .iter()
            .find(|s| s.starts_with("CREATE TRIGGER chainify_dg_acct_bi BEFORE INSERT"))
            .unwrap();
        // The bound applies after rounding (99999999.995 rounds to 10^10 and is too large).
        assert!(bi.contains("SELECT RAISE(ABORT, 'chainify: column bal of table acct takes a number below 10^10') WHERE typeof(NEW.bal) NOT IN ('integer', 'real', 'null') OR abs((CASE WHEN NEW.bal = round(NEW.bal, 2) THEN NEW.bal ELSE round(NEW.bal * (1 + 4e-16), 2) END)) >= 1e10;"), "{bi}");
        // A declared INTEGER is 32-bit on the other engines; SQLite checks the width.
        assert!(
            bi.contains("OR NEW.bank NOT BETWEEN -2147483648 AND 2147483647"),
            "{bi}"
        );
        assert!(
            bi.contains("typeof(NEW.id) NOT IN ('integer', 'null')"),
            "{bi}"
        );
    }

    #[test]
    fn digest_writes_are_set_based_and_literal_except_in_process() {
        let t = table();
        let w = DigestWrites {
            block: 7,
            changed: vec![&t],
            states: vec![("acct", vec![0x01, 0xab])],
            forget_states_below: -249,
            digest: &[0xff, 0x00],
            success: &[0b101],
            tx_count: 3,
            tx_ids: vec![&[0x12], &[0x34]],
            markers: true,
        };
        let texts = |d: Dialect, w: &DigestWrites<'_>| -> Vec<String> {
            digest_writes(d, w)
                .into_iter()
                .map(|w| {
                    assert_eq!(w.params, [], "{}: literal values", w.sql);
                    w.sql
                })
                .collect()
        };
        assert_eq!(
            texts(Dialect::Postgres, &w),
            [
                "INSERT INTO chainify_dk_acct (bank, id, chainify_block) SELECT DISTINCT bank, id, 7 FROM chainify_dg_acct WHERE 1 = 1 ON CONFLICT (bank, id) DO UPDATE SET chainify_block = 7",
                "DELETE FROM chainify_dg_acct",
                "UPDATE chainify_shared_tables SET last_changed_block = 7 WHERE table_name = 'acct'",
                "DELETE FROM chainify_state WHERE block >= 7",
                "INSERT INTO chainify_state (block, table_name, lanes) VALUES (7, 'acct', decode('01ab', 'hex'))",
                "DELETE FROM chainify_state WHERE block >= 0 AND block < -249 AND block NOT IN (SELECT block FROM chainify_checkpoints)",
                "DELETE FROM chainify_applied_blocks WHERE block >= 7",
                "INSERT INTO chainify_applied_blocks (block, digest, success, tx_count) VALUES (7, decode('ff00', 'hex'), decode('05', 'hex'), 3)",
                "INSERT INTO chainify_tx_index (tx_id, block) VALUES (decode('12', 'hex'), 7), (decode('34', 'hex'), 7) ON CONFLICT (tx_id) DO UPDATE SET block = excluded.block",
                "DELETE FROM chainify_applied_txs WHERE block = 7",
            ]
        );
        let mysql = texts(
            Dialect::MySql,
            &DigestWrites {
                changed: vec![],
                tx_ids: vec![],
                markers: false,
                ..w.clone()
            },
        );
        assert_eq!(
            mysql,
            [
                "DELETE FROM chainify_state WHERE block >= 7",
                "INSERT INTO chainify_state (block, table_name, lanes) VALUES (7, 'acct', X'01ab')",
                "DELETE FROM chainify_state WHERE block >= 0 AND block < -249 AND block NOT IN (SELECT block FROM chainify_checkpoints)",
                "DELETE FROM chainify_applied_blocks WHERE block >= 7",
                "INSERT INTO chainify_applied_blocks (block, digest, success, tx_count) VALUES (7, X'ff00', X'05', 3)",
            ]
        );
        assert_eq!(
            texts(Dialect::MySql, &w)[0],
            "INSERT INTO chainify_dk_acct (bank, id, chainify_block) SELECT DISTINCT bank, id, 7 FROM chainify_dg_acct ON DUPLICATE KEY UPDATE chainify_block = 7"
        );
        // SQLite binds every value, one row a statement, so the texts recur from block to block.
        let sqlite = digest_writes(Dialect::Sqlite, &w);
        let bytes = |b: &[u8]| Value::Bytes(b.to_vec());
        let expected: Vec<(&str, Vec<Value>)> = vec![
            (
                "INSERT INTO chainify_dk_acct (bank, id, chainify_block) SELECT DISTINCT bank, id, ?1 FROM chainify_dg_acct WHERE 1 = 1 ON CONFLICT (bank, id) DO UPDATE SET chainify_block = ?1",
                vec![Value::Int(7)],
            ),
            ("DELETE FROM chainify_dg_acct", vec![]),
            (
                "UPDATE chainify_shared_tables SET last_changed_block = ?1 WHERE table_name = ?2",
                vec![Value::Int(7), Value::Text("acct".into())],
            ),
            (
                "DELETE FROM chainify_state WHERE block >= ?1",
                vec![Value::Int(7)],
            ),
            (
                "INSERT INTO chainify_state (block, table_name, lanes) VALUES (?1, ?2, ?3)",
                vec![
                    Value::Int(7),
                    Value::Text("acct".into()),
                    bytes(&[0x01, 0xab]),
                ],
            ),
            (
                "DELETE FROM chainify_state WHERE block >= 0 AND block < ?1 AND block NOT IN (SELECT block FROM chainify_checkpoints)",
                vec![Value::Int(-249)],
            ),
            (
                "DELETE FROM chainify_applied_blocks WHERE block >= ?1",
                vec![Value::Int(7)],
            ),
            (
                "INSERT INTO chainify_applied_blocks (block, digest, success, tx_count) VALUES (?1, ?2, ?3, ?4)",
                vec![Value::Int(7), bytes(&[0xff, 0]), bytes(&[5]), Value::Int(3)],
            ),
            (
                "INSERT INTO chainify_tx_index (tx_id, block) VALUES (?1, ?2) ON CONFLICT (tx_id) DO UPDATE SET block = excluded.block",
                vec![bytes(&[0x12]), Value::Int(7)],
            ),
            (
                "INSERT INTO chainify_tx_index (tx_id, block) VALUES (?1, ?2) ON CONFLICT (tx_id) DO UPDATE SET block = excluded.block",
                vec![bytes(&[0x34]), Value::Int(7)],
            ),
            (
                "DELETE FROM chainify_applied_txs WHERE block = ?1",
                vec![Value::Int(7)],
            ),
        ];
        let got: Vec<(&str, Vec<Value>)> = sqlite
            .iter()
            .map(|w| (w.sql.as_str(), w.params.clone()))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(bytes_literal(Dialect::Sqlite, &[]), "X''");
        assert_eq!(
            markers_literal(7, &[(0, true), (12, false)]),
            "INSERT INTO chainify_applied_txs (block, tx_index, success) VALUES (7, 0, 1), (7, 12, 0)"
        );
    }

    #[test]
    fn read_back_and_consume() {
        let (sql, types) = read_changes(Dialect::MySql, &table());
        assert_eq!(
            sql,
            "SELECT CAST(d.bank AS SIGNED), CAST(d.id AS SIGNED), CAST(r.bank AS SIGNED), CAST(r.id AS SIGNED), CAST(r.bal AS CHAR), r.note, CAST(d.chainify_was AS SIGNED), CAST(d.chainify_o1 AS SIGNED), CAST(d.chainify_o2 AS SIGNED), CAST(d.chainify_o3 AS CHAR), d.chainify_o4 FROM chainify_dg_acct d LEFT JOIN acct r ON r.bank = d.bank AND r.id = d.id ORDER BY d.chainify_seq"
        );
        assert_eq!(types.len(), 11);
        assert_eq!(types[4], ReadType::Decimal(2));
        // The digest holds the change tables against writers before it reads them.
        assert_eq!(
            begin_digest(Dialect::Postgres, ["acct", "b"]).join("; "),
            "BEGIN; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; LOCK TABLE chainify_dg_acct, chainify_dg_b IN SHARE ROW EXCLUSIVE MODE"
        );
        assert_eq!(
            begin_digest(Dialect::MySql, ["acct", "b"]).join("; "),
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; BEGIN; SELECT 1 FROM chainify_dg_acct FOR UPDATE; SELECT 1 FROM chainify_dg_b FOR UPDATE"
        );
        let (delete, update, insert) = restore(Dialect::Sqlite, &table(), 2);
        assert_eq!(
            delete,
            "DELETE FROM acct WHERE NOT EXISTS (SELECT 1 FROM chainify_cp_acct s WHERE s.chainify_cp_block <= ?1 AND s.chainify_cp_block >= ?2 AND s.chainify_cp_gone = 0 AND NOT EXISTS (SELECT 1 FROM chainify_cp_acct chainify_newer WHERE ?3 < ?4 AND chainify_newer.bank = s.bank AND chainify_newer.id = s.id AND chainify_newer.chainify_cp_block > s.chainify_cp_block AND chainify_newer.chainify_cp_block <= ?5) AND s.bank = acct.bank AND s.id = acct.id) AND (acct.bank, acct.id) IN (VALUES (?6, ?7), (?8, ?9))"
        );
        assert_eq!(
            update.as_deref(),
            Some(
                "UPDATE acct SET bal = s.bal, note = s.note FROM (SELECT * FROM chainify_cp_acct s WHERE s.chainify_cp_block <= ?1 AND s.chainify_cp_block >= ?2 AND s.chainify_cp_gone = 0 AND NOT EXISTS (SELECT 1 FROM chainify_cp_acct chainify_newer WHERE ?3 < ?4 AND chainify_newer.bank = s.bank AND chainify_newer.id = s.id AND chainify_newer.chainify_cp_block > s.chainify_cp_block AND chainify_newer.chainify_cp_block <= ?5) AND (s.bank, s.id) IN (VALUES (?6, ?7), (?8, ?9))) s WHERE s.bank = acct.bank AND s.id = acct.id AND NOT (acct.bal IS s.bal AND acct.note IS s.note)"
            )
        );
        assert_eq!(
            insert,
            "INSERT INTO acct (bank, id, bal, note) SELECT s.bank, s.id, s.bal, s.note FROM chainify_cp_acct s WHERE s.chainify_cp_block <= ?1 AND s.chainify_cp_block >= ?2 AND s.chainify_cp_gone = 0 AND NOT EXISTS (SELECT 1 FROM chainify_cp_acct chainify_newer WHERE ?3 < ?4 AND chainify_newer.bank = s.bank AND chainify_newer.id = s.id AND chainify_newer.chainify_cp_block > s.chainify_cp_block AND chainify_newer.chainify_cp_block <= ?5) AND (s.bank, s.id) IN (VALUES (?6, ?7), (?8, ?9)) AND NOT EXISTS (SELECT 1 FROM acct r WHERE r.bank = s.bank AND r.id = s.id)"
        );
        let (_, update, _) = restore(Dialect::MySql, &table(), 1);
        assert_eq!(
            update.as_deref(),
            Some(
                "UPDATE acct JOIN chainify_cp_acct s ON s.chainify_cp_block <= ? AND s.chainify_cp_block >= ? AND s.chainify_cp_gone = 0 AND NOT EXISTS (SELECT 1 FROM chainify_cp_acct chainify_newer WHERE ? < ? AND chainify_newer.bank = s.bank AND chainify_newer.id = s.id AND chainify_newer.chainify_cp_block > s.chainify_cp_block AND chainify_newer.chainify_cp_block <= ?) AND s.bank = acct.bank AND s.id = acct.id SET acct.bal = s.bal, acct.note = s.note WHERE NOT (acct.bal <=> s.bal AND acct.note <=> s.note) AND (acct.bank, acct.id) IN ((?, ?))"
            )
        );
        // A delta layer: the rows of the keys changed after the previous checkpoint, and
        // tombstones for those gone; set-based, nothing through the client.
        let [rows, gone] = snapshot_delta(Dialect::Postgres, &table());
        assert_eq!(
            rows,
            "INSERT INTO chainify_cp_acct (chainify_cp_block, bank, id, bal, note) SELECT $1, r.bank, r.id, r.bal, r.note FROM chainify_dk_acct d JOIN acct r ON d.bank = r.bank AND d.id = r.id WHERE d.chainify_block > $2"
        );
        assert_eq!(
            gone,
            "INSERT INTO chainify_cp_acct (chainify_cp_block, chainify_cp_gone, bank, id) SELECT $1, 1, d.bank, d.id FROM chainify_dk_acct d WHERE d.chainify_block > $2 AND NOT EXISTS (SELECT 1 FROM acct r WHERE r.bank = d.bank AND r.id = d.id)"
        );
        let [moved, rest] = fold_layer(Dialect::MySql, &table());
        assert_eq!(
            moved,
            "UPDATE chainify_cp_acct SET chainify_cp_block = ? WHERE chainify_cp_block = ? AND chainify_cp_gone = 0"
        );
        assert_eq!(
            rest,
            "DELETE FROM chainify_cp_acct WHERE chainify_cp_block = ?"
        );
        assert_eq!(
            insert_markers(Dialect::Postgres, 2),
            "INSERT INTO chainify_applied_txs (block, tx_index, success) VALUES ($1, $2, $3), ($4, $5, $6)"
        );
        assert_eq!(
            insert_markers(Dialect::MySql, 1),
            "INSERT INTO chainify_applied_txs (block, tx_index, success) VALUES (?, ?, ?)"
        );
        let (dirty, types) = dirty_keys(Dialect::Postgres, &table());
        assert_eq!(
            dirty,
            "SELECT CAST(bank AS BIGINT), CAST(id AS BIGINT) FROM chainify_dk_acct WHERE chainify_block > $1 UNION SELECT CAST(bank AS BIGINT), CAST(id AS BIGINT) FROM chainify_dg_acct"
        );
        assert_eq!(types.len(), 2);
    }
}
