//! Rendering an analysed statement for one engine.
//!
//! chainify's portable SQL uses `$1..$n` placeholders and case-insensitive identifiers. Engines
//! differ on both: PostgreSQL takes `$n`, SQLite `?NNN`, MySQL/MariaDB only positional `?` (so a
//! parameter used twice is bound twice), and MySQL table names are case-sensitive on Linux. The
//! statement is rendered from its *tokens*, not from the AST, so the text the engine runs is the
//! text that was analysed, with only placeholders and identifier case changed; string literals and
//! comments are untouched. (MySQL sessions run with `ANSI_QUOTES`, so `"name"` is an identifier
//! everywhere.)

use sqlparser::dialect::GenericDialect;
use sqlparser::tokenizer::{Location, Token, Tokenizer};

use crate::analyze::placeholder_index;

/// A SQL engine family.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
    /// SQLite.
    Sqlite,
}

/// A statement ready to prepare on one engine.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Rendered {
    /// The SQL text for the engine.
    pub sql: String,
    /// For each placeholder the engine will bind, in bind order, the 0-based index of the
    /// statement's parameter it takes (`$2` → 1). For MySQL a parameter may appear several times.
    pub bind_order: Vec<usize>,
}

/// Renders portable SQL for `dialect`. Fails only on text that does not tokenize or uses a
/// placeholder other than `$n` (which analysis already rejects).
pub fn render(sql: &str, dialect: Dialect) -> Result<Rendered, String> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| format!("does not tokenize: {e}"))?;
    // Tokens are copied from the source text (token Display does not round-trip literals and
    // comments exactly); only placeholders and identifiers are rewritten.
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let offset = |loc: Location| -> Option<usize> {
        let start = *line_starts.get(usize::try_from(loc.line).ok()?.checked_sub(1)?)?;
        let col = usize::try_from(loc.column).ok()?.checked_sub(1)?;
        let line = &sql[start..];
        Some(start + line.char_indices().nth(col).map_or(line.len(), |(i, _)| i))
    };
    let mut out = String::with_capacity(sql.len() + 8);
    let mut bind_order = Vec::new();
    let mut highest = 0;
    for t in tokens {
        let source = match (offset(t.span.start), offset(t.span.end)) {
            (Some(a), Some(b)) if a <= b && b <= sql.len() => &sql[a..b],
            _ => return Err("cannot locate a token in the SQL text".into()),
        };
        match t.token {
            Token::Placeholder(p) => {
                let n = placeholder_index(&p)
                    .ok_or_else(|| format!("placeholder {p} is not $1..$n"))?;
                highest = highest.max(n);
                match dialect {
                    Dialect::Postgres => out.push_str(&format!("${n}")),
                    Dialect::Sqlite => out.push_str(&format!("?{n}")),
                    Dialect::MySql => {
                        out.push('?');
                        bind_order.push(n - 1);
                    }
                }
            }
            Token::Word(_) => out.push_str(&source.to_lowercase()),
            _ => out.push_str(source),
        }
    }
    if dialect != Dialect::MySql {
        // Numbered placeholders bind each parameter once, by number.
        bind_order = (0..highest).collect();
    }
    Ok(Rendered {
        sql: out,
        bind_order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEND: &str = "UPDATE Checking SET bal = bal - $3 WHERE custid = $1 AND bal >= $3";

    #[test]
    fn placeholders_per_dialect() {
        let pg = render(SEND, Dialect::Postgres).unwrap();
        assert_eq!(
            pg.sql,
            "update checking set bal = bal - $3 where custid = $1 and bal >= $3"
        );
        assert_eq!(pg.bind_order, vec![0, 1, 2]);
        let lite = render(SEND, Dialect::Sqlite).unwrap();
        assert_eq!(
            lite.sql,
            "update checking set bal = bal - ?3 where custid = ?1 and bal >= ?3"
        );
        assert_eq!(lite.bind_order, vec![0, 1, 2]);
        let my = render(SEND, Dialect::MySql).unwrap();
        assert_eq!(
            my.sql,
            "update checking set bal = bal - ? where custid = ? and bal >= ?"
        );
        assert_eq!(my.bind_order, vec![2, 0, 2]);
    }

    #[test]
    fn literals_comments_and_quoted_names() {
        let sql = "SELECT \"Bal\" FROM t WHERE name = 'It''s $1 O''Brien' -- $2 stays\n AND k = $1";
        let r = render(sql, Dialect::MySql).unwrap();
        assert_eq!(
            r.sql,
            "select \"bal\" from t where name = 'It''s $1 O''Brien' -- $2 stays\n and k = ?"
        );
        assert_eq!(r.bind_order, vec![0]);
    }

    fn tokens(sql: &str) -> Vec<Token> {
        Tokenizer::new(&GenericDialect {}, sql).tokenize().unwrap()
    }

    proptest::proptest! {
        /// Rendering changes placeholders and identifier case only: every other token, including
        /// literals with quotes, dollars, newlines and multi-byte text, comes out unchanged, and
        /// MySQL's bind order names the parameters in textual order.
        #[test]
        fn only_placeholders_and_case_change(text in "[a-zA-Zé東'$0-9 \n-]{0,20}", n in 1usize..4) {
            let literal = format!("'{}'", text.replace('\'', "''"));
            let sql = format!("SELECT Bal, {literal} FROM \"Tbl\" /* é */ WHERE k = ${n} OR k < $1");
            let original = tokens(&sql);
            for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
                let r = render(&sql, dialect).unwrap();
                let rendered = tokens(&r.sql);
                proptest::prop_assert_eq!(rendered.len(), original.len());
                let mut seen = Vec::new();
                for (a, b) in original.iter().zip(&rendered) {
                    match (a, b) {
                        (Token::Placeholder(p), _) => seen.push(placeholder_index(p).unwrap() - 1),
                        (Token::Word(x), Token::Word(y)) => proptest::prop_assert_eq!(x.value.to_lowercase(), y.value.clone()),
                        _ => proptest::prop_assert_eq!(a, b),
                    }
                }
                if dialect == Dialect::MySql {
                    proptest::prop_assert_eq!(&r.bind_order, &seen);
                }
            }
        }
    }

    #[test]
    fn bad_placeholders_are_named() {
        assert!(
            render("SELECT ?", Dialect::Postgres)
                .unwrap_err()
                .contains("placeholder ?")
        );
        assert!(
            render("SELECT 'x", Dialect::Postgres)
                .unwrap_err()
                .contains("does not tokenize")
        );
    }
}
