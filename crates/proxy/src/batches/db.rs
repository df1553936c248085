//! The Batch API's way to its database, SQLite or PostgreSQL, behind one small interface: a
//! statement run with values bound (`$1`, `$2`, … in both), rows read back as values, and a
//! transaction around a closure. The statements are written once for both (the types and SQL
//! the store uses mean the same in each).

use postgres::types::{ToSql, Type};

use crate::ledger::store::pg;

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
    /// NULL, of the column's type (PostgreSQL binds a NULL with its type).
    NoInt,
    NoText,
}

impl From<i64> for Val {
    fn from(v: i64) -> Val {
        Val::Int(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Val {
        Val::Text(v.to_string())
    }
}

impl From<&String> for Val {
    fn from(v: &String) -> Val {
        Val::Text(v.clone())
    }
}

impl From<Option<i64>> for Val {
    fn from(v: Option<i64>) -> Val {
        v.map_or(Val::NoInt, Val::Int)
    }
}

impl From<Option<&str>> for Val {
    fn from(v: Option<&str>) -> Val {
        v.map_or(Val::NoText, |s| Val::Text(s.to_string()))
    }
}

/// A row read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Val>);

impl Row {
    pub fn int(&self, i: usize) -> Result<i64, String> {
        self.opt_int(i)?
            .ok_or_else(|| format!("column {i} is NULL"))
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, String> {
        match self.0.get(i) {
            Some(Val::Int(v)) => Ok(Some(*v)),
            Some(Val::NoInt | Val::NoText) => Ok(None),
            other => Err(format!("column {i} is no integer: {other:?}")),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, String> {
        self.opt_text(i)?
            .ok_or_else(|| format!("column {i} is NULL"))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, String> {
        match self.0.get(i) {
            Some(Val::Text(v)) => Ok(Some(v.clone())),
            Some(Val::NoInt | Val::NoText) => Ok(None),
            other => Err(format!("column {i} is no text: {other:?}")),
        }
    }

    pub fn bytes(&self, i: usize) -> Result<Vec<u8>, String> {
        match self.0.get(i) {
            Some(Val::Bytes(v)) => Ok(v.clone()),
            other => Err(format!("column {i} is no bytes: {other:?}")),
        }
    }
}

/// What the store runs its statements on: a connection or a transaction, of either database.
pub trait Db {
    /// Runs `sql` with `params`; the rows it changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String>;
    /// The rows `sql` with `params` reads.
    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String>;
}

/// An open database.
pub enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Sqlite(_) => "Conn(sqlite)",
            Conn::Postgres(_) => "Conn(postgres)",
        })
    }
}

impl Conn {
    /// `f` in one transaction: committed when it returns `Ok`, rolled back otherwise.
    pub fn tx<T>(&mut self, f: impl FnOnce(&mut dyn Db) -> Result<T, String>) -> Result<T, String> {
        match self {
            Conn::Sqlite(c) => {
                let mut tx = c.transaction().map_err(|e| e.to_string())?;
                let out = f(&mut tx)?;
                tx.commit().map_err(|e| e.to_string())?;
                Ok(out)
            }
            Conn::Postgres(c) => {
                let mut tx = c.transaction().map_err(pg)?;
                let out = f(&mut tx)?;
                tx.commit().map_err(pg)?;
                Ok(out)
            }
        }
    }

    /// Whether it is a PostgreSQL database (several processes may share it).
    pub fn shared(&self) -> bool {
        matches!(self, Conn::Postgres(_))
    }

    /// Whether the connection is lost for good (PostgreSQL's, its server gone).
    pub fn is_closed(&self) -> bool {
        matches!(self, Conn::Postgres(c) if c.is_closed())
    }
}

impl Db for Conn {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        match self {
            Conn::Sqlite(c) => lite_exec(c, sql, params),
            Conn::Postgres(c) => c.execute(sql, &pg_params(params)).map_err(pg),
        }
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String> {
        match self {
            Conn::Sqlite(c) => lite_rows(c, sql, params),
            Conn::Postgres(c) => pg_rows(c.query(sql, &pg_params(params)).map_err(pg)?),
        }
    }
}

impl Db for rusqlite::Transaction<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        lite_exec(self, sql, params)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String> {
        lite_rows(self, sql, params)
    }
}

impl Db for postgres::Transaction<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        self.execute(sql, &pg_params(params)).map_err(pg)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, String> {
        pg_rows(self.query(sql, &pg_params(params)).map_err(pg)?)
    }
}

fn lite_value(v: &Val) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match v {
        Val::Int(i) => Value::Integer(*i),
        Val::Text(s) => Value::Text(s.clone()),
        Val::Bytes(b) => Value::Blob(b.clone()),
        Val::NoInt | Val::NoText => Value::Null,
    }
}

fn lite_exec(c: &rusqlite::Connection, sql: &str, params: &[Val]) -> Result<u64, String> {
    let mut stmt = c.prepare_cached(sql).map_err(|e| e.to_string())?;
    let n = stmt
        .execute(rusqlite::params_from_iter(params.iter().map(lite_value)))
        .map_err(|e| e.to_string())?;
    Ok(n as u64)
}

fn lite_rows(c: &rusqlite::Connection, sql: &str, params: &[Val]) -> Result<Vec<Row>, String> {
    use rusqlite::types::ValueRef;
    let mut stmt = c.prepare_cached(sql).map_err(|e| e.to_string())?;
    let width = stmt.column_count();
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params.iter().map(lite_value)))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(|e| e.to_string())? {
        let mut row = Vec::with_capacity(width);
        for i in 0..width {
            row.push(match r.get_ref(i).map_err(|e| e.to_string())? {
                ValueRef::Null => Val::NoText,
                ValueRef::Integer(v) => Val::Int(v),
                ValueRef::Real(v) => Val::Int(v as i64),
                ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => Val::Bytes(b.to_vec()),
            });
        }
        out.push(Row(row));
    }
    Ok(out)
}

fn pg_params(params: &[Val]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|v| -> &(dyn ToSql + Sync) {
            match v {
                Val::Int(i) => i,
                Val::Text(s) => s,
                Val::Bytes(b) => b,
                Val::NoInt => &None::<i64>,
                Val::NoText => &None::<String>,
            }
        })
        .collect()
}

fn pg_rows(rows: Vec<postgres::Row>) -> Result<Vec<Row>, String> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut row = Vec::with_capacity(r.len());
        for (i, col) in r.columns().iter().enumerate() {
            let t = col.type_();
            let v = if *t == Type::INT8 {
                r.try_get::<_, Option<i64>>(i)
                    .map(|v| v.map_or(Val::NoInt, Val::Int))
            } else if *t == Type::INT4 {
                r.try_get::<_, Option<i32>>(i)
                    .map(|v| v.map_or(Val::NoInt, |v| Val::Int(v.into())))
            } else if *t == Type::BYTEA {
                r.try_get::<_, Option<Vec<u8>>>(i)
                    .map(|v| v.map_or(Val::NoText, Val::Bytes))
            } else {
                r.try_get::<_, Option<String>>(i)
                    .map(|v| v.map_or(Val::NoText, Val::Text))
            };
            row.push(v.map_err(pg)?);
        }
        out.push(Row(row));
    }
    Ok(out)
}
