//! The ledger's schema, one migration per version, written once for both databases (the
//! types and statements here mean the same in SQLite and PostgreSQL).
//!
//! A database records the versions applied to it in `ledger_schema`; at start the missing
//! ones are applied in order, in one transaction. A database that holds a version this build
//! does not know was written by a newer Switchboard: it is refused, never altered.

/// Each version's statements, in order: `MIGRATIONS[0]` makes version 1.
pub(crate) const MIGRATIONS: &[&[&str]] = &[
    &[
        // One row per request that reached a model endpoint. `process` and `seq` name the row
        // where it was made, so a batch written again (its commit's outcome unknown) is found.
        "CREATE TABLE requests (
        process TEXT NOT NULL,
        seq BIGINT NOT NULL,
        at_ms BIGINT NOT NULL,
        request_id TEXT NOT NULL,
        client TEXT NOT NULL,
        alias TEXT NOT NULL,
        backend TEXT NOT NULL,
        api TEXT NOT NULL,
        status BIGINT NOT NULL,
        prompt_tokens BIGINT NOT NULL,
        cached_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        gpu_prefill_s DOUBLE PRECISION NOT NULL,
        gpu_decode_s DOUBLE PRECISION NOT NULL,
        ttft_ms BIGINT,
        duration_ms BIGINT NOT NULL,
        queue_ms BIGINT NOT NULL,
        cancelled BIGINT NOT NULL,
        preempted BIGINT NOT NULL,
        fell_back BIGINT NOT NULL,
        PRIMARY KEY (process, seq)
    )",
        "CREATE INDEX requests_at ON requests (at_ms)",
        ROLLUP_HOURLY,
        ROLLUP_DAILY,
    ],
    &[
        // What the request's client was charged against its budgets: tokens and GPU-seconds as
        // believed (a usage no more than the request could cost), not as reported. NULL on rows
        // of no client and on rows version 1 wrote (their usage stands for it).
        "ALTER TABLE requests ADD COLUMN charged_tokens BIGINT",
        "ALTER TABLE requests ADD COLUMN charged_gpu_s DOUBLE PRECISION",
    ],
    &[
        // The Batch API's state (`crate::batches`): files (their contents are kept beside the
        // database), batches, and each batch's lines with their results, committed with their
        // state. Times in Unix seconds, as the API shows them.
        "CREATE TABLE batch_files (
        id TEXT PRIMARY KEY,
        client TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL
    )",
        "CREATE INDEX batch_files_client ON batch_files (client, created_at)",
        "CREATE TABLE batches (
        id TEXT PRIMARY KEY,
        client TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        metadata TEXT,
        errors TEXT,
        output_file_id TEXT,
        error_file_id TEXT,
        created_at BIGINT NOT NULL,
        in_progress_at BIGINT,
        expires_at BIGINT NOT NULL,
        finalizing_at BIGINT,
        completed_at BIGINT,
        failed_at BIGINT,
        expired_at BIGINT,
        cancelling_at BIGINT,
        cancelled_at BIGINT,
        total BIGINT NOT NULL,
        completed BIGINT NOT NULL,
        failed BIGINT NOT NULL
    )",
        "CREATE INDEX batches_client ON batches (client, created_at)",
        "CREATE INDEX batches_status ON batches (status)",
        // state: pending (to run, not before `not_before` ms), running (claimed by the process
        // `owner` until `lease_until` ms, renewed while it runs), done (answered 2xx), failed.
        "CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL,
        line BIGINT NOT NULL,
        custom_id TEXT NOT NULL,
        model TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts BIGINT NOT NULL,
        not_before BIGINT NOT NULL,
        owner TEXT,
        lease_until BIGINT,
        result TEXT,
        PRIMARY KEY (batch_id, line)
    )",
        "CREATE INDEX batch_lines_state ON batch_lines (batch_id, state)",
        // Files' contents where several processes share the database (PostgreSQL); a SQLite
        // ledger's are files beside it.
        "CREATE TABLE batch_file_contents (id TEXT PRIMARY KEY, content BYTEA NOT NULL)",
    ],
    &[
        // A client's usage (`GET /v1/usage`) is read from its own raw rows, not from every
        // client's of the range.
        "CREATE INDEX requests_client ON requests (client, at_ms)",
    ],
    &[
        // Who owns a request's usage when not its client (NULL): one key of
        // `server.api_keys_env` (the proxy's `config::key_owner`), as `GET /v1/usage` and the status
        // page show it to that key. A key's raw rows are read through `requests_owner` (of the
        // rows with an owner only, so a client's own are read through `requests_client`).
        // Roll-ups per owner beside the clients' (which stay as they were, so a process of an
        // earlier version writes on while others are upgraded), begun with the clients' sums as
        // their own.
        "ALTER TABLE requests ADD COLUMN owner TEXT",
        "CREATE INDEX requests_owner ON requests (owner, at_ms) WHERE owner IS NOT NULL",
        OWNER_HOURLY,
        OWN_HOURLY,
        OWNER_DAILY,
        OWN_DAILY,
    ],
];

/// The columns of a clients' roll-up table: sums per bucket, client and alias.
macro_rules! rollup_columns {
    () => {
        "(
    bucket_ms BIGINT NOT NULL,
    client TEXT NOT NULL,
    alias TEXT NOT NULL,
    requests BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    gpu_prefill_s DOUBLE PRECISION NOT NULL,
    gpu_decode_s DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (bucket_ms, client, alias)
)"
    };
}

const ROLLUP_HOURLY: &str = concat!("CREATE TABLE usage_hourly ", rollup_columns!());
const ROLLUP_DAILY: &str = concat!("CREATE TABLE usage_daily ", rollup_columns!());

/// The columns of an owners' roll-up table (version 5): sums per bucket, client, owner (the
/// client where it owns its usage) and alias.
macro_rules! owned_rollup_columns {
    () => {
        "(
    bucket_ms BIGINT NOT NULL,
    client TEXT NOT NULL,
    owner TEXT NOT NULL,
    alias TEXT NOT NULL,
    requests BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    gpu_prefill_s DOUBLE PRECISION NOT NULL,
    gpu_decode_s DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (bucket_ms, client, owner, alias)
)"
    };
}

/// A clients' roll-up's sums copied to the owners' `$to`, as their client's.
macro_rules! owned_copy {
    ($to:literal, $from:literal) => {
        concat!(
            "INSERT INTO ",
            $to,
            " (bucket_ms, client, owner, alias, requests, errors, prompt_tokens, \
             cached_tokens, output_tokens, gpu_prefill_s, gpu_decode_s) SELECT bucket_ms, \
             client, client, alias, requests, errors, prompt_tokens, cached_tokens, \
             output_tokens, gpu_prefill_s, gpu_decode_s FROM ",
            $from
        )
    };
}

const OWNER_HOURLY: &str = concat!("CREATE TABLE owner_hourly ", owned_rollup_columns!());
const OWNER_DAILY: &str = concat!("CREATE TABLE owner_daily ", owned_rollup_columns!());
const OWN_HOURLY: &str = owned_copy!("owner_hourly", "usage_hourly");
const OWN_DAILY: &str = owned_copy!("owner_daily", "usage_daily");

/// The roll-ups' sums, as their columns are named.
pub(crate) const SUMS: [&str; 7] = [
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "gpu_prefill_s",
    "gpu_decode_s",
];

/// The newest version this build writes.
pub const LATEST: i64 = MIGRATIONS.len() as i64;

/// Made before anything is read, so a new database and an old one read alike.
pub(crate) const VERSIONS: &str =
    "CREATE TABLE IF NOT EXISTS ledger_schema (version BIGINT NOT NULL)";

/// The roll-up tables, the width of their buckets in milliseconds (UTC hours and days), and
/// whether they sum per owner (else per client).
pub(crate) const ROLLUPS: [(&str, i64, bool); 4] = [
    ("usage_hourly", 3_600_000, false),
    ("usage_daily", 86_400_000, false),
    ("owner_hourly", 3_600_000, true),
    ("owner_daily", 86_400_000, true),
];

/// Why a database at `at` is refused: it holds a version newer than this build's.
pub(crate) fn too_new(at: &str, version: i64) -> String {
    format!(
        "the ledger at {at} has schema version {version}, written by a newer Switchboard \
         (this build knows versions up to {LATEST}); refused, and left as it is"
    )
}
