//! The sums the proxy reads back from its own ledger as it serves: the status page's days,
//! and what other processes spent of the clients' budgets of a day and a month.

use super::store::Store;
use super::LedgerError;
use crate::db::Val;

impl Store {
    /// Tokens (prompt and output) and GPU-seconds per UTC day and owner, from the daily
    /// roll-up, for the days from `from_ms` on.
    pub fn daily(&mut self, from_ms: i64) -> Result<Vec<(i64, String, i64, f64)>, LedgerError> {
        let q = "SELECT bucket_ms, owner, CAST(sum(prompt_tokens + output_tokens) AS BIGINT), \
                 CAST(sum(gpu_prefill_s + gpu_decode_s) AS DOUBLE PRECISION) FROM owner_daily \
                 WHERE bucket_ms >= $1 GROUP BY bucket_ms, owner ORDER BY bucket_ms, owner";
        let rows = self.db().rows(q, &[from_ms.into()])?;
        let day = |r: &crate::db::Row| -> Result<_, LedgerError> {
            Ok((r.int(0)?, r.text(1)?, r.int(2)?, r.float(3)?))
        };
        rows.iter().map(day).collect()
    }

    /// Tokens and GPU-seconds charged per client (what was reported, on rows that record no
    /// charge) of the raw rows from `from_ms` up to `until_ms`, of processes other than
    /// `process`.
    pub fn spent(
        &mut self,
        from_ms: i64,
        until_ms: i64,
        process: &str,
    ) -> Result<Vec<(String, i64, f64)>, LedgerError> {
        let q = "SELECT client, \
                 CAST(sum(COALESCE(charged_tokens, prompt_tokens + output_tokens)) AS BIGINT), \
                 CAST(sum(COALESCE(charged_gpu_s, gpu_prefill_s + gpu_decode_s)) \
                 AS DOUBLE PRECISION) FROM requests \
                 WHERE at_ms >= $1 AND at_ms < $2 AND process <> $3 GROUP BY client";
        let p = [from_ms.into(), until_ms.into(), Val::from(process)];
        let rows = self.db().rows(q, &p)?;
        let client = |r: &crate::db::Row| -> Result<_, LedgerError> {
            Ok((r.text(0)?, r.int(1)?, r.float(2)?))
        };
        rows.iter().map(client).collect()
    }
}
