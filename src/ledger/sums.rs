//! The sums the proxy reads back from its own ledger as it serves: the status page's days,
//! and what other processes spent of the clients' budgets of a day and a month.

use super::store::{pg, Store};
use crate::budget::Amounts;

impl Store {
    /// Tokens (prompt and output) and GPU-seconds per UTC day and owner, from the daily
    /// roll-up, for the days from `from_ms` on.
    pub fn daily(&mut self, from_ms: i64) -> Result<Vec<(i64, String, i64, f64)>, String> {
        let q = "SELECT bucket_ms, owner, CAST(sum(prompt_tokens + output_tokens) AS BIGINT), \
                 CAST(sum(gpu_prefill_s + gpu_decode_s) AS DOUBLE PRECISION) FROM owner_daily \
                 WHERE bucket_ms >= $1 GROUP BY bucket_ms, owner ORDER BY bucket_ms, owner";
        let mut out = Vec::new();
        match self {
            Store::Sqlite(conn, _) => {
                let mut st = conn.prepare(q).map_err(|e| e.to_string())?;
                let mut rows = st.query([from_ms]).map_err(|e| e.to_string())?;
                while let Some(r) = rows.next().map_err(|e| e.to_string())? {
                    let day = (r.get(0), r.get(1), r.get(2), r.get(3));
                    let e = |e: rusqlite::Error| e.to_string();
                    out.push((
                        day.0.map_err(e)?,
                        day.1.map_err(e)?,
                        day.2.map_err(e)?,
                        day.3.map_err(e)?,
                    ));
                }
            }
            Store::Postgres(client, _) => {
                for r in client.query(q, &[&from_ms]).map_err(pg)? {
                    out.push((
                        r.try_get(0).map_err(pg)?,
                        r.try_get(1).map_err(pg)?,
                        r.try_get(2).map_err(pg)?,
                        r.try_get(3).map_err(pg)?,
                    ));
                }
            }
        }
        Ok(out)
    }

    /// What each client's requests took — their number, the tokens and GPU time charged (what
    /// was reported, on rows that record no charge), their output tokens — of the raw rows
    /// from `from_ms` up to `until_ms`, of processes other than `process`.
    pub fn spent(
        &mut self,
        from_ms: i64,
        until_ms: i64,
        process: &str,
    ) -> Result<Vec<(String, Amounts)>, String> {
        let q = "SELECT client, \
                 CAST(sum(COALESCE(charged_tokens, prompt_tokens + output_tokens)) AS BIGINT), \
                 CAST(sum(COALESCE(charged_gpu_s, gpu_prefill_s + gpu_decode_s)) \
                 AS DOUBLE PRECISION), CAST(count(*) AS BIGINT), \
                 CAST(sum(output_tokens) AS BIGINT) FROM requests \
                 WHERE at_ms >= $1 AND at_ms < $2 AND process <> $3 GROUP BY client";
        let mut out = Vec::new();
        match self {
            Store::Sqlite(conn, _) => {
                let e = |e: rusqlite::Error| e.to_string();
                let mut st = conn.prepare(q).map_err(e)?;
                let mut rows = st
                    .query(rusqlite::params![from_ms, until_ms, process])
                    .map_err(e)?;
                while let Some(r) = rows.next().map_err(e)? {
                    out.push((
                        r.get(0).map_err(e)?,
                        r.get(1).map_err(e)?,
                        r.get(2).map_err(e)?,
                        r.get(3).map_err(e)?,
                        r.get(4).map_err(e)?,
                    ));
                }
            }
            Store::Postgres(client, _) => {
                for r in client
                    .query(q, &[&from_ms, &until_ms, &process])
                    .map_err(pg)?
                {
                    out.push((
                        r.try_get(0).map_err(pg)?,
                        r.try_get(1).map_err(pg)?,
                        r.try_get(2).map_err(pg)?,
                        r.try_get(3).map_err(pg)?,
                        r.try_get(4).map_err(pg)?,
                    ));
                }
            }
        }
        Ok(out.into_iter().map(amounts).collect())
    }
}

/// A row of [`Store::spent`] (client, tokens, GPU-seconds, requests, output tokens) as the
/// budgets count it.
fn amounts(row: (String, i64, f64, i64, i64)) -> (String, Amounts) {
    let (client, tokens, gpu_s, requests, output) = row;
    let amounts = Amounts {
        requests: requests as f64,
        tokens: tokens as f64,
        output_tokens: output as f64,
        gpu_ms: gpu_s * 1000.0,
    };
    (client, amounts)
}
