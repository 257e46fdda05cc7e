//! Feeds arbitrary text to the parser and analyser (over a schema with composite keys, unique
//! constraints and cascading foreign keys) and binds it with a few parameter types: nothing may
//! panic, whatever the input.
#![no_main]

use std::sync::OnceLock;

use chainify_core::tx::{Statement, Transaction};
use chainify_core::Value;
use chainify_sql::{Analyzer, Schema};
use libfuzzer_sys::fuzz_target;

const SCHEMA: &str = "
CREATE TABLE accounts (custid BIGINT PRIMARY KEY, name TEXT UNIQUE);
CREATE TABLE checking (custid BIGINT PRIMARY KEY REFERENCES accounts (custid) ON DELETE CASCADE, bal BIGINT);
CREATE TABLE lines (a INT, b TEXT, c DECIMAL(8,2), v INT, PRIMARY KEY (a, b, c),
                    FOREIGN KEY (a) REFERENCES accounts (custid));";

fn analyzer() -> &'static Analyzer {
    static A: OnceLock<Analyzer> = OnceLock::new();
    A.get_or_init(|| Analyzer::new(Schema::from_sql(SCHEMA).expect("fuzz schema parses")))
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else { return };
    let params = vec![Value::Int(-1), Value::Text("7".into()), Value::Null, Value::Bool(true)];
    for n in 0..=params.len() {
        let tx = Transaction { statements: vec![Statement::new(sql, params[..n].to_vec())] };
        let _ = analyzer().analyze(&tx);
    }
});
