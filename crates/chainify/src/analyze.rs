//! `chainify analyze --schema SCHEMA.sql BLOCK.json`: a contract other tools rely on.
//!
//! Output: one JSON object `{"transactions": [{"reads": …, "writes": …, "error": null | "…",
//! "code": null | "SQLnnn"}, …], "conflicts": [[i, j], …]}` where `conflicts` lists every pair
//! i < j of transactions whose sets conflict (not transitively reduced); a rejected transaction
//! has `error` set (the text, for people), `code` set (the rejection's stable code, for tools:
//! `chainify_sql::RejectKind`, table in docs/design/portable-sql.md), empty sets, and takes part
//! in no pair. The key-set format is documented in `chainify_sql::json`.
//! Exit code 0 whenever both files are well-formed; non-zero with a message naming the problem
//! otherwise.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use chainify_core::tx::{Statement, Transaction};
use chainify_sql::json::{rwset_json, value_from_json};
use chainify_sql::{Analyzer, Schema};
use serde_json::{Value as Json, json};

/// Parses the block file's JSON into transactions, naming the position of any shape error.
pub(crate) fn parse_block(text: &str) -> anyhow::Result<Vec<Transaction>> {
    let json: Json = serde_json::from_str(text).context("block is not valid JSON")?;
    let Json::Array(txs) = json else {
        bail!("block must be a JSON array of transactions")
    };
    txs.iter()
        .enumerate()
        .map(|(i, tx)| {
            let Json::Array(stmts) = tx else {
                bail!("transaction {i} must be a JSON array of statements")
            };
            let statements = stmts
                .iter()
                .enumerate()
                .map(|(j, s)| {
                    let at = || format!("transaction {i}, statement {j}");
                    let Json::Object(o) = s else {
                        bail!(
                            "{}: must be an object {{\"sql\": …, \"params\": […]}}",
                            at()
                        )
                    };
                    if let Some(k) = o
                        .keys()
                        .find(|k| !matches!(k.as_str(), "sql" | "params" | "expect_rows"))
                    {
                        bail!(
                            "{}: unknown field {k:?} (expected sql, params, expect_rows)",
                            at()
                        );
                    }
                    let sql = o
                        .get("sql")
                        .and_then(Json::as_str)
                        .with_context(|| format!("{}: \"sql\" must be a string", at()))?;
                    let params = match o.get("params") {
                        None => Vec::new(),
                        Some(Json::Array(p)) => p
                            .iter()
                            .enumerate()
                            .map(|(k, v)| {
                                value_from_json(v).map_err(|e| {
                                    anyhow::anyhow!("{}, parameter ${}: {e}", at(), k + 1)
                                })
                            })
                            .collect::<anyhow::Result<_>>()?,
                        Some(_) => bail!("{}: \"params\" must be an array", at()),
                    };
                    let expect_rows = match o.get("expect_rows") {
                        None | Some(Json::Null) => None,
                        Some(v) => Some(v.as_u64().with_context(|| {
                            format!("{}: \"expect_rows\" must be a non-negative integer", at())
                        })?),
                    };
                    Ok(Statement {
                        sql: sql.to_owned(),
                        params,
                        expect_rows,
                    })
                })
                .collect::<anyhow::Result<_>>()?;
            Ok(Transaction { statements })
        })
        .collect()
}

/// Analyses the block and builds the output object.
pub(crate) fn analyze_block(schema: Schema, txs: &[Transaction]) -> Json {
    let analyzer = Analyzer::new(schema);
    let results: Vec<_> = txs.iter().map(|tx| analyzer.analyze(tx)).collect();
    let sets: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|a| &a.rwset))
        .collect();
    let conflicts = chainify_sched::conflict_pairs(&sets);
    let transactions: Vec<Json> = results
        .iter()
        .map(|r| match r {
            Ok(a) => {
                let (reads, writes) = rwset_json(&a.rwset);
                json!({ "reads": reads, "writes": writes, "error": null, "code": null })
            }
            Err(e) => json!({
                "reads": {},
                "writes": {},
                "error": e.to_string(),
                "code": e.code(),
            }),
        })
        .collect();
    json!({ "transactions": transactions, "conflicts": conflicts })
}

pub(crate) fn run(schema_path: &Path, block_path: &Path) -> anyhow::Result<()> {
    let schema_sql = std::fs::read_to_string(schema_path)
        .with_context(|| format!("cannot read {}", schema_path.display()))?;
    let schema =
        Schema::from_sql(&schema_sql).with_context(|| format!("{}", schema_path.display()))?;
    let block = std::fs::read_to_string(block_path)
        .with_context(|| format!("cannot read {}", block_path.display()))?;
    let txs = parse_block(&block).with_context(|| format!("{}", block_path.display()))?;
    let out = analyze_block(schema, &txs);
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &out)?;
    writeln!(stdout)?;
    Ok(())
}
