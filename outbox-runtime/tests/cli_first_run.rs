//! The `outbox` command line's first run, as a newcomer meets it: an unmigrated database,
//! no database given, a misspelled consumer or table, change data capture on a server as
//! installed. Every mistake names its fix.

use std::process::{Command, Output};

use outbox_runtime::inbox::InboxAdmin;
use outbox_runtime::{Error, Outbox};
use sqlx::PgPool;

mod common;

use common::{billing_inbox, outbox_cli, park, Parked};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every command but `migrate`, on a database without the outbox's tables: exit 2, the
/// table named, and the command that creates it.
#[sqlx::test(migrations = false)]
async fn every_command_on_an_unmigrated_database_says_run_outbox_migrate(pool: PgPool) {
    let id = uuid::Uuid::nil().to_string();
    let commands: &[&[&str]] = &[
        &["status"],
        &["status", "--json"],
        &["failed", "list"],
        &["retrying"],
        &["retry", "--all-failed"],
        &["retry", &id],
        &["discard", &id, "--reason", "r", "--yes"],
        &["replay", "--event-type", "order.confirmed"],
        &["purge", "--older-than", "7d"],
        &["reconcile", "--since=-infinity", "--until", "now"],
        &["relay", "--brokers", "127.0.0.1:1"],
    ];
    for args in commands {
        let out = outbox_cli(&pool, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("table \"public\".\"outbox\" does not exist")
                && err.contains("run `outbox migrate`")
                && !err.contains("at line"),
            "{args:?}: {err}"
        );
    }
}

/// The inbox commands on a database without the inbox's tables: exit 2, the table named,
/// and that the consumer's own binary creates it.
#[sqlx::test(migrations = false)]
async fn inbox_commands_on_an_unmigrated_database_name_the_inbox_migrator(pool: PgPool) {
    let commands: &[&[&str]] =
        &[&["parked"], &["parked", "--json"], &["retry", "1"], &["discard", "1", "--reason", "r", "--yes"]];
    for args in commands {
        let mut all = vec!["inbox", "--consumer", "billing"];
        all.extend_from_slice(args);
        let out = outbox_cli(&pool, &all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("table \"public\".\"inbox")
                && err.contains("does not exist")
                && err.contains("inbox.migrator()"),
            "{args:?}: {err}"
        );
    }
}

/// The library says the same to its own callers: `ops()` and `InboxAdmin` return
/// `NotMigrated` and `InboxNotMigrated`, not a raw SQL error.
#[sqlx::test(migrations = false)]
async fn the_library_names_a_missing_table_too(pool: PgPool) {
    let ops = Outbox::default_ref().ops();
    for result in [
        ops.status(&pool).await.map(drop),
        ops.failed(&pool).await.map(drop),
        ops.retrying(&pool, 10).await.map(drop),
        ops.check_migrated(&pool).await,
    ] {
        match result {
            Err(Error::NotMigrated { table }) => assert_eq!(table, "\"public\".\"outbox\""),
            other => panic!("expected NotMigrated, got {other:?}"),
        }
    }
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");
    for result in
        [admin.parked().await.map(drop), admin.request_retry(1).await, admin.discard(1, "r").await.map(drop)]
    {
        match result {
            Err(Error::InboxNotMigrated { table }) => {
                assert!(table.starts_with("\"public\".\"inbox"), "{table}")
            }
            other => panic!("expected InboxNotMigrated, got {other:?}"),
        }
    }
}

/// A `--table` or `--schema` naming no outbox table, close to one that exists, gets the
/// flags that name it.
#[sqlx::test(migrations = false)]
async fn a_misspelled_table_is_refused_with_the_close_one(pool: PgPool) {
    Outbox::default_ref().migrator().run(&pool).await.expect("migrate");
    let out = outbox_cli(&pool, &["--table", "outbx", "status"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("table \"public\".\"outbx\" does not exist")
            && err.contains("did you mean `--table outbox`? (outbox tables in this database: public.outbox); if not, run `outbox migrate`")
,
        "{err}"
    );
    two_consumers(&pool).await;
    let out = outbox_cli(&pool, &["inbox", "--consumer", "billing", "--inbox-table", "inbx", "parked"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("did you mean `--inbox-table inbox`?") && err.contains("inbox.migrator()"), "{err}");
    let out = outbox_cli(&pool, &["--schema", "publik", "failed", "list"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("did you mean `--schema public --table outbox`?"), "{err}");
}

/// No `--database-url` and no `DATABASE_URL`: refused (exit 2), not a surprising default
/// database; a URL in the environment is never printed, `--help` included.
#[test]
fn no_database_given_is_refused_and_a_url_is_never_printed() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env_remove("DATABASE_URL")
        .arg("status")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(stderr(&out).trim(), "outbox: no database given: set --database-url or DATABASE_URL");
    // An empty one (an unset shell variable exported) is none, not "cannot connect to ''".
    let empty = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env("DATABASE_URL", "")
        .arg("status")
        .output()
        .expect("run");
    assert_eq!(empty.status.code(), Some(2), "{empty:?}");
    assert_eq!(stderr(&empty).trim(), "outbox: no database given: set --database-url or DATABASE_URL");
    let help = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env("DATABASE_URL", "postgres://app:s3cret@127.0.0.1:1/none")
        .arg("--help")
        .output()
        .expect("run");
    let text = format!("{}{}", String::from_utf8_lossy(&help.stdout), stderr(&help));
    assert!(text.contains("--database-url") && !text.contains("s3cret"), "{text}");
}

/// An inbox with applied rows of `billing` and a parked one of `shipping`.
async fn two_consumers(pool: &PgPool) {
    let inbox = outbox_runtime::inbox::Inbox::new(
        pool.clone(),
        outbox_runtime::inbox::InboxConfig::new("billing", "127.0.0.1:1", ["orders"]),
        outbox_runtime::inbox::Handlers::new(),
    )
    .expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, bucket) \
         SELECT 'billing', id, 'order.confirmed', 1, 'orders', 0, 0, inbox_bucket(id) FROM gen_random_uuid() AS id",
    )
    .execute(pool)
    .await
    .expect("applied");
    sqlx::query(
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, status, reason) \
         VALUES ('shipping', 'orders', 0, 0, 'k', '{}', '', 'parked', 'handler failed: boom')",
    )
    .execute(pool)
    .await
    .expect("parked");
}

/// A misspelled `--consumer` is refused (exit 2) with the consumers there are and the
/// closest one, instead of "no parked messages" and exit 0.
#[sqlx::test(migrations = false)]
async fn an_unknown_consumer_is_refused_with_the_known_ones(pool: PgPool) {
    two_consumers(&pool).await;
    for args in [&["parked"][..], &["retry", "1"], &["discard", "1", "--reason", "r", "--yes"]] {
        let mut all = vec!["inbox", "--consumer", "bilingg"];
        all.extend_from_slice(args);
        let out = outbox_cli(&pool, &all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert_eq!(
            stderr(&out).trim(),
            "outbox: unknown consumer `bilingg`: it has no row in this inbox's tables; did you mean `billing`? \
             (consumers in this inbox: billing, shipping)"
        );
    }
    let far = outbox_cli(&pool, &["inbox", "--consumer", "payments", "parked"]);
    assert_eq!(far.status.code(), Some(2));
    assert!(!stderr(&far).contains("did you mean"), "{}", stderr(&far));
    let known = outbox_cli(&pool, &["inbox", "--consumer", "billing", "parked"]);
    assert_eq!(known.status.code(), Some(0), "a known consumer with nothing parked: {known:?}");
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "x").expect("admin");
    assert_eq!(admin.consumers().await.expect("consumers"), ["billing", "shipping"]);
}

/// Retrying or discarding a message held behind an earlier one names that one (id,
/// status, topic, partition, offset, event type, reason) and the command releasing it: in
/// the CLI (exit 4), `InboxAdmin` and `Inbox::retry_parked` / `discard_parked` alike.
#[sqlx::test(migrations = false)]
async fn a_held_message_names_the_one_holding_it(pool: PgPool) {
    let inbox = billing_inbox(&pool).await;
    let rows = [(7_i64, "parked", "handler failed: boom"), (8, "held", "held behind 1")].map(
        |(offset, status, reason)| Parked {
            partition: 3,
            offset,
            key: "k",
            event_type: "order.confirmed",
            version: 1,
            status,
            reason,
        },
    );
    park(&pool, &rows).await;
    let expected = "message 2 is held behind parked message 1 of its key: parked, topic orders, partition 3, \
                    offset 7, event type order.confirmed, reason: handler failed: boom. Release that one first: \
                    `outbox inbox --consumer billing retry 1` once its cause is fixed, or \
                    `outbox inbox --consumer billing discard 1 --reason R --yes`";
    let out = outbox_cli(&pool, &["inbox", "--consumer", "billing", "retry", "2"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(stderr(&out).contains(expected), "{}", stderr(&out));
    let out =
        outbox_cli(&pool, &["inbox", "--consumer", "billing", "discard", "2", "--reason", "r", "--yes"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(stderr(&out).contains(expected) && !stderr(&out).contains("PAYLOAD-MARKER"), "{}", stderr(&out));
    let admin = inbox.admin();
    for conflict in [
        admin.request_retry(2).await.map(drop),
        admin.discard(2, "r").await.map(drop),
        inbox.retry_parked(2).await.map(drop),
        inbox.discard_parked(2, "r").await.map(drop),
    ] {
        match conflict {
            Err(Error::Conflict(message)) => assert!(message.contains(expected), "{message}"),
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_parked WHERE status IN ('parked', 'held')")
            .fetch_one(&pool)
            .await
            .expect("n");
    assert_eq!(open, 2, "nothing changed");
}

/// `outbox cdc status` without a slot sends the operator to `setup`, and on a server below
/// `wal_level = logical` (PostgreSQL as installed) says first that it must change, since
/// setup would only fail there (before, it said "run `outbox cdc setup`" alone).
#[sqlx::test(migrations = false)]
async fn cdc_status_without_a_slot_names_the_wal_level_it_needs(pool: PgPool) {
    Outbox::default_ref().migrator().run(&pool).await.expect("migrate");
    let level: String = sqlx::query_scalar("SHOW wal_level").fetch_one(&pool).await.expect("wal_level");
    let out = outbox_cli(&pool, &["cdc", "status", "--slot", "outbox_no_such_slot"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"outbox_no_such_slot\" does not exist") && err.contains("`outbox cdc setup`"),
        "{err}"
    );
    if level == "logical" {
        assert!(!err.contains("wal_level"), "{err}");
    } else {
        assert!(err.contains(&format!("wal_level is {level}")), "{err}");
        assert!(err.contains("ALTER SYSTEM SET wal_level = logical"), "{err}");
    }
}
