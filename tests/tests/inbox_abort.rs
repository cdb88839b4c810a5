//! A consumer process that dies on any panic, as a service built with `panic = "abort"`
//! does (the `abort-consumer` binary), against records whose header names no safe Rust
//! client can write: not UTF-8, and a NUL inside a name (`ce_id\0…` with the record's own
//! id, and a foreign `trace\0id`). The inbox reads header names as bytes through
//! librdkafka's C API: the process lives, the three records are parked with their reasons
//! and the credits around them apply. Before, reading the first name panicked inside
//! rdkafka (caught by `catch_unwind`, which `panic = "abort"` does not have), and names
//! with a NUL read up to it (`ce_id`, `trace`), so those records applied as if clean.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_tests::inbox_kit::effects::{applied_amounts, credit_headers, parked, setup};
use outbox_tests::raw::RawRecord;
use outbox_tests::{database_url, eventually, Credit};
use sqlx::PgPool;
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_abort-consumer");

/// The control: the binary's hook aborts on a panic that `catch_unwind` would catch.
#[test]
fn the_consumer_binary_aborts_on_any_panic() {
    let out = Command::new(BIN).arg("--panic").output().expect("run abort-consumer");
    assert_eq!(out.status.signal(), Some(6), "SIGABRT: {out:?}");
}

/// A credit on partition 0 with `extra` headers appended to its own.
fn credit_with(account: &str, amount: i64, extra: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> RawRecord {
    let id = Uuid::now_v7();
    let mut record =
        RawRecord::text(0, account, &Credit::json(account, amount), &credit_headers(id, Some(account), None));
    for (name, value) in extra {
        // `{id}` in a value stands for the record's own event id.
        let value =
            value.map(|v| String::from_utf8(v).expect("text").replace("{id}", &id.to_string()).into_bytes());
        record.headers.push((name, value));
    }
    record
}

#[sqlx::test(migrations = false)]
async fn header_names_of_any_bytes_are_parked_and_the_aborting_consumer_lives(pool: PgPool) {
    let s = setup(&pool, 1).await;
    s.credit(0, "before", 1);
    let bad = [
        credit_with("not-utf8", 2, vec![(vec![0xff, 0xfe, b'x'], Some(b"v".to_vec()))]),
        credit_with("nul-in-ours", 3, vec![(b"ce_id\0shadow".to_vec(), Some(b"{id}".to_vec()))]),
        credit_with("nul-in-foreign", 4, vec![(b"trace\0id".to_vec(), Some(b"t".to_vec()))]),
    ];
    for record in &bad {
        s.producer.send(&s.topic, record);
    }
    s.credit(0, "after", 5);
    s.producer.flush();

    let mut child = Command::new(BIN)
        .args([database_url(&pool).as_str(), s.kafka.bootstrap(), &s.topic, "abort"])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn abort-consumer");
    let settled = eventually(Duration::from_secs(60), || async {
        applied_amounts(&pool).await.len() == 2 && parked(&pool).await.len() == 3
    })
    .await;
    let alive = child.try_wait().expect("child status");
    let (amounts, parked) = (applied_amounts(&pool).await, parked(&pool).await);
    let _ = child.kill();
    let _ = child.wait();

    assert_eq!(alive, None, "the consumer lives (applied {amounts:?}, parked {parked:?})");
    assert!(settled, "two credits apply and three records park: applied {amounts:?}, parked {parked:?}");
    assert_eq!(amounts, vec![1, 5]);
    let reasons: Vec<&str> = parked.iter().map(|(_, _, reason)| reason.as_str()).collect();
    assert!(reasons[0].contains("not UTF-8"), "{reasons:?}");
    assert!(reasons[1].contains("ce_id\\0shadow") && reasons[1].contains("NUL"), "{reasons:?}");
    assert!(reasons[2].contains("trace\\0id") && reasons[2].contains("NUL"), "{reasons:?}");
}
