//! The sums the proxy reads back from its own ledger as it serves: the status page's days,
//! and what other processes spent of the clients' budgets of a day and a month.

use super::store::Store;
use super::LedgerError;
use crate::budget::Amounts;
use crate::db::Val;

impl Store {
    /// Tokens (prompt and output) and GPU-seconds per UTC day and owner, from the daily
    /// roll-up, for the days from `from_ms` on.
    pub(crate) fn daily(
        &mut self,
        from_ms: i64,
    ) -> Result<Vec<(i64, String, i64, f64)>, LedgerError> {
        let q = "SELECT bucket_ms, owner, CAST(sum(prompt_tokens + output_tokens) AS BIGINT), \
                 CAST(sum(gpu_prefill_s + gpu_decode_s) AS DOUBLE PRECISION) FROM owner_daily \
                 WHERE bucket_ms >= $1 GROUP BY bucket_ms, owner ORDER BY bucket_ms, owner";
        let rows = self.db().rows(q, &[from_ms.into()])?;
        let day = |r: &crate::db::Row| -> Result<_, LedgerError> {
            Ok((r.int(0)?, r.text(1)?, r.int(2)?, r.float(3)?))
        };
        rows.iter().map(day).collect()
    }

    /// What each client's requests took — their number, the tokens and GPU time charged (what
    /// was reported, on rows that record no charge), their output tokens — of the raw rows
    /// from `from_ms` up to `until_ms`, of processes other than `process`.
    pub fn spent(
        &mut self,
        from_ms: i64,
        until_ms: i64,
        process: &str,
    ) -> Result<Vec<(String, Amounts)>, LedgerError> {
        let q = "SELECT client, \
                 CAST(sum(COALESCE(charged_tokens, prompt_tokens + output_tokens)) AS BIGINT), \
                 CAST(sum(COALESCE(charged_gpu_s, gpu_prefill_s + gpu_decode_s)) \
                 AS DOUBLE PRECISION), CAST(count(*) AS BIGINT), \
                 CAST(sum(output_tokens) AS BIGINT) FROM requests \
                 WHERE at_ms >= $1 AND at_ms < $2 AND process <> $3 GROUP BY client";
        let p = [from_ms.into(), until_ms.into(), Val::from(process)];
        let rows = self.db().rows(q, &p)?;
        let client = |r: &crate::db::Row| -> Result<_, LedgerError> {
            let amounts = Amounts {
                requests: r.int(3)? as f64,
                tokens: r.int(1)? as f64,
                output_tokens: r.int(4)? as f64,
                gpu_ms: r.float(2)? * 1000.0,
            };
            Ok((r.text(0)?, amounts))
        };
        rows.iter().map(client).collect()
    }
}
