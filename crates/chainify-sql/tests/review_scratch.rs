#![allow(clippy::unwrap_used)]
use chainify_core::Value;
use chainify_core::tx::{Statement, Transaction};
use chainify_sql::render::Dialect;
use chainify_sql::{Analyzer, Schema};

fn parse_param(s: &str) -> Value {
    let (k, v) = s.split_once(':').unwrap_or((s, ""));
    match k {
        "n" => Value::Null,
        "i" => Value::Int(v.parse().unwrap()),
        "d" => Value::Decimal(v.parse().unwrap()),
        "t" => Value::Text(v.replace("\\n", "\n")),
        "b" => Value::Bool(v == "true"),
        "x" => Value::Bytes(
            (0..v.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
                .collect(),
        ),
        _ => panic!("bad param {s}"),
    }
}

#[test]
fn review() {
    let schema = std::fs::read_to_string("/tmp/review2/schema.sql").unwrap();
    let a = Analyzer::new(Schema::from_sql(&schema).unwrap());
    let cases = std::fs::read_to_string(
        std::env::var("REVIEW_CASES").unwrap_or("/tmp/review2/cases.txt".into()),
    )
    .unwrap();
    let mut out = String::new();
    for block in cases.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.starts_with('#'));
        let Some(sql) = lines.next() else { continue };
        let params: Vec<Value> = lines
            .filter(|l| !l.trim().is_empty())
            .map(parse_param)
            .collect();
        println!("=== {sql}   params={params:?}");
        let tx = Transaction {
            statements: vec![Statement::new(sql, params.clone())],
        };
        let res = std::panic::catch_unwind(|| a.analyze(&tx));
        match res {
            Err(_) => println!("  PANIC"),
            Ok(Err(e)) => {
                println!("  REFUSED: {e}");
                out.push_str(&format!(
                    "{}\n",
                    serde_json::json!({"sql": sql, "refused": e.to_string()})
                ));
            }
            Ok(Ok(an)) => {
                let ps: Vec<serde_json::Value> = params
                    .iter()
                    .map(|p| match p {
                        Value::Null => serde_json::json!(["n", null]),
                        Value::Int(i) => serde_json::json!(["i", i.to_string()]),
                        Value::Decimal(d) => serde_json::json!(["d", d.to_string()]),
                        Value::Text(t) => serde_json::json!(["t", t]),
                        Value::Bool(b) => serde_json::json!(["b", b]),
                        Value::Bytes(b) => serde_json::json!([
                            "x",
                            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
                        ]),
                    })
                    .collect();
                let t = &an.typed[0];
                out.push_str(&format!("{}\n", serde_json::json!({"sql": sql, "params": ps,
                    "pg": t.rendered(Dialect::Postgres).sql, "my": t.rendered(Dialect::MySql).sql,
                    "my_binds": t.rendered(Dialect::MySql).bind_order, "lite": t.rendered(Dialect::Sqlite).sql})));
                for d in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
                    let r = an.typed[0].rendered(d);
                    println!("  {d:?}: {}", r.sql);
                    if d == Dialect::MySql {
                        println!("    binds: {:?}", r.bind_order);
                    }
                }
            }
        }
    }
    std::fs::write("/tmp/review2/rendered.jsonl", out).unwrap();
}
