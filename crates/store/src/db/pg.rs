//! The seam's PostgreSQL side: values bound with their types (a NULL too), rows read back by
//! their columns' types.

use postgres::types::{ToSql, Type};
use postgres::GenericClient;

use super::{Db, DbError, Row, Val};

impl Db for postgres::Transaction<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, DbError> {
        exec(self, sql, params)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, DbError> {
        rows(self, sql, params)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        Ok(self.batch_execute(sql)?)
    }
}

pub(super) fn exec(c: &mut impl GenericClient, sql: &str, params: &[Val]) -> Result<u64, DbError> {
    Ok(c.execute(sql, &bound(params))?)
}

pub(super) fn rows(
    c: &mut impl GenericClient,
    sql: &str,
    params: &[Val],
) -> Result<Vec<Row>, DbError> {
    let read = c.query(sql, &bound(params))?;
    read.iter().map(row).collect()
}

fn bound(params: &[Val]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|v| -> &(dyn ToSql + Sync) {
            match v {
                Val::Int(i) => i,
                Val::Float(f) => f,
                Val::Text(s) => s,
                Val::Bytes(b) => b,
                Val::NoInt => &None::<i64>,
                Val::NoFloat => &None::<f64>,
                Val::NoText => &None::<String>,
            }
        })
        .collect()
}

fn row(r: &postgres::Row) -> Result<Row, DbError> {
    let mut row = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let t = col.type_();
        let v = if *t == Type::INT8 {
            r.try_get::<_, Option<i64>>(i)
                .map(|v| v.map_or(Val::NoInt, Val::Int))
        } else if *t == Type::INT4 {
            r.try_get::<_, Option<i32>>(i)
                .map(|v| v.map_or(Val::NoInt, |v| Val::Int(v.into())))
        } else if *t == Type::FLOAT8 {
            r.try_get::<_, Option<f64>>(i)
                .map(|v| v.map_or(Val::NoFloat, Val::Float))
        } else if *t == Type::BYTEA {
            r.try_get::<_, Option<Vec<u8>>>(i)
                .map(|v| v.map_or(Val::NoText, Val::Bytes))
        } else {
            r.try_get::<_, Option<String>>(i)
                .map(|v| v.map_or(Val::NoText, Val::Text))
        };
        row.push(v?);
    }
    Ok(Row(row))
}
