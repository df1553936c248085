//! The store's tests on a SQLite file: claims, leases, commits, a batch's end.

use super::*;
use crate::db::Conn;
use BatchState::*;

fn db() -> (tempfile::TempDir, Conn) {
    let dir = tempfile::tempdir().unwrap();
    let url = crate::db::LedgerUrl::Sqlite(dir.path().join("usage.db"));
    (dir, crate::ledger::Store::open(&url).unwrap().into_conn())
}

fn batch_of(db: &mut Conn, lines: u64) -> String {
    let b = BatchRow {
        id: "batch_1".into(),
        client: "ann".into(),
        status: Validating,
        ..BatchRow::default()
    };
    insert_batch(db, &b).unwrap();
    let lines: Vec<Line> = (1..=lines)
        .map(|n| Line {
            line: n,
            custom_id: format!("c{n}"),
            model: "a".into(),
            body: "{}".into(),
        })
        .collect();
    assert!(db.tx(|tx| start(tx, &b.id, &lines, 0)).unwrap());
    assert!(
        !db.tx(|tx| start(tx, &b.id, &lines, 0)).unwrap(),
        "started once"
    );
    b.id
}

#[test]
fn each_line_is_claimed_by_one_owner_until_its_lease_lapses() {
    let (_dir, mut db) = db();
    let id = batch_of(&mut db, 5);
    let got = claim(&mut db, &id, 1000, "a", 2000, 2, false).unwrap();
    assert_eq!(got.iter().map(|p| p.line).collect::<Vec<_>>(), [1, 2]);
    let got = claim(&mut db, &id, 1000, "b", 2000, 10, false).unwrap();
    assert_eq!(got.iter().map(|p| p.line).collect::<Vec<_>>(), [3, 4, 5]);
    assert!(claim(&mut db, &id, 1500, "c", 9000, 10, false)
        .unwrap()
        .is_empty());
    assert_eq!(left(&mut db, &id, 1500).unwrap(), (5, 5));
    // a renews; b's claims lapse and go to c, whose commit counts and b's does not.
    renew(&mut db, "a", 5000).unwrap();
    let got = claim(&mut db, &id, 2500, "c", 9000, 10, false).unwrap();
    assert_eq!(got.iter().map(|p| p.line).collect::<Vec<_>>(), [3, 4, 5]);
    let done = Outcome::Done("{}".into());
    assert!(!db.tx(|tx| commit(tx, &id, 3, "b", 1, &done)).unwrap());
    assert!(db.tx(|tx| commit(tx, &id, 3, "c", 1, &done)).unwrap());
    assert!(db.tx(|tx| commit(tx, &id, 1, "a", 1, &done)).unwrap());
    // A run to be made again is pending from its time on.
    let later = Outcome::Again {
        not_before: 4000,
        counted: true,
    };
    assert!(db.tx(|tx| commit(tx, &id, 2, "a", 1, &later)).unwrap());
    assert!(claim(&mut db, &id, 3999, "a", 9000, 10, false)
        .unwrap()
        .is_empty());
    assert_eq!(
        claim(&mut db, &id, 4000, "a", 9000, 10, false).unwrap()[0].attempts,
        1
    );
    let b = batch(&mut db, &id).unwrap().unwrap();
    assert_eq!((b.total, b.completed, b.failed), (5, 2, 0));
    // What is left fails as such; the results come in the lines' order.
    fail_left(&mut db, &id, &|c| format!("gone {c}")).unwrap();
    let results = results(&mut db, &id).unwrap();
    let done: Vec<bool> = results.iter().map(|r| r.0).collect();
    assert_eq!(done, [true, false, true, false, false]);
    assert_eq!(results[1].1, "gone c2");
    let b = batch(&mut db, &id).unwrap().unwrap();
    assert_eq!((b.completed, b.failed), (2, 3));
    assert_eq!(left(&mut db, &id, 0).unwrap(), (0, 0));
}

#[test]
fn a_batch_ends_once_and_lines_released_are_pending_again() {
    let (_dir, mut db) = db();
    let id = batch_of(&mut db, 2);
    claim(&mut db, &id, 0, "a", 10, 2, false).unwrap();
    release(&mut db, Some("a"), Some(&id)).unwrap();
    assert_eq!(claim(&mut db, &id, 0, "b", 10, 2, false).unwrap().len(), 2);
    assert!(
        !advance(&mut db, &id, Completed, 7).unwrap(),
        "not from in_progress"
    );
    assert!(advance(&mut db, &id, Finalizing, 7).unwrap());
    let end = |db: &mut Conn| finish(db, &id, Completed, (Some("f"), None), None, 8);
    assert!(end(&mut db).unwrap());
    assert!(!end(&mut db).unwrap(), "ended once");
    let b = batch(&mut db, &id).unwrap().unwrap();
    assert_eq!(
        (
            b.status,
            b.finalizing_at,
            b.completed_at,
            b.output_file_id.as_deref()
        ),
        (Completed, Some(7), Some(8), Some("f"))
    );
    assert_eq!(by_status(&mut db).unwrap(), [("completed".to_string(), 1)]);
}
