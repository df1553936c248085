//! The seam's SQLite side: `$n` placeholders read as SQLite's `?n` (bound by their number),
//! values bound and read back.

use std::borrow::Cow;

use rusqlite::types::{Value, ValueRef};

use super::{Db, DbError, Row, Val};

impl Db for rusqlite::Transaction<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, DbError> {
        exec(self, sql, params)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, DbError> {
        rows(self, sql, params)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        Ok(self.execute_batch(sql)?)
    }
}

/// `sql` with each `$n` outside a string literal written `?n`: SQLite reads `$1` as a name
/// and numbers names in the order they first appear, `?1` by its number, as PostgreSQL does.
pub(super) fn numbered(sql: &str) -> Cow<'_, str> {
    if !sql.contains('$') {
        return Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => quoted = !quoted,
            '$' if !quoted && chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push('?');
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    Cow::Owned(out)
}

fn value(v: &Val) -> Value {
    match v {
        Val::Int(i) => Value::Integer(*i),
        Val::Float(f) => Value::Real(*f),
        Val::Text(s) => Value::Text(s.clone()),
        Val::Bytes(b) => Value::Blob(b.clone()),
        Val::NoInt | Val::NoFloat | Val::NoText => Value::Null,
    }
}

pub(super) fn exec(c: &rusqlite::Connection, sql: &str, params: &[Val]) -> Result<u64, DbError> {
    let mut stmt = c.prepare_cached(&numbered(sql))?;
    let n = stmt.execute(rusqlite::params_from_iter(params.iter().map(value)))?;
    Ok(n as u64)
}

pub(super) fn rows(
    c: &rusqlite::Connection,
    sql: &str,
    params: &[Val],
) -> Result<Vec<Row>, DbError> {
    let mut stmt = c.prepare_cached(&numbered(sql))?;
    let width = stmt.column_count();
    let mut rows = stmt.query(rusqlite::params_from_iter(params.iter().map(value)))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut row = Vec::with_capacity(width);
        for i in 0..width {
            row.push(match r.get_ref(i)? {
                ValueRef::Null => Val::NoText,
                ValueRef::Integer(v) => Val::Int(v),
                ValueRef::Real(v) => Val::Float(v),
                ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => Val::Bytes(b.to_vec()),
            });
        }
        out.push(Row(row));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn placeholders_are_numbered_outside_string_literals_only() {
        assert_eq!(
            numbered("SELECT $2, '$1', $10 FROM t WHERE a = $1"),
            "SELECT ?2, '$1', ?10 FROM t WHERE a = ?1"
        );
        assert_eq!(numbered("SELECT 1"), "SELECT 1");
        assert_eq!(numbered("SELECT '$' || $1"), "SELECT '$' || ?1");
    }
}
