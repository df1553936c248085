//! The store: what the proxy keeps and counts. One database seam ([`db`]: SQLite embedded,
//! PostgreSQL shared, one URL) under the usage ledger ([`ledger`]: rows, roll-ups, reports,
//! the budgets' sums), the Batch API's state ([`batches`]: files, batches, their lines and the
//! runner that ends them), the clients' day and month budgets ([`budget`]) on their
//! [`calendar`], and the limits as data ([`limits`]: a resource over a window, one value per
//! kind in a [`kinds::PerKind`]). Each takes its settings as the narrow types here
//! ([`ledger::Settings`], [`batches::Bounds`], [`db::LedgerUrl`]) that the proxy's config
//! validates into; nothing here reads a config file or names the proxy.

pub mod batches;
pub mod budget;
pub mod calendar;
pub mod db;
pub mod kinds;
pub mod ledger;
pub mod limits;
