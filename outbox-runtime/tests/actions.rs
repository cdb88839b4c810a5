//! Operators' actions by filter against a real database, through the library and the
//! `outbox` command line: failed events retried and discarded (`outbox.ops()`), parked
//! messages retried and discarded (`InboxAdmin`). Each matches 3 rows of 5; the dry run
//! changes nothing; a row that starts matching after the action's snapshot is left alone
//! (a trigger on the audit table makes one match in the action's own first transaction);
//! the counts printed are the rows changed; every action leaves its audit row.

use std::time::{Duration, SystemTime};

use outbox_runtime::inbox::InboxAdmin;
use outbox_runtime::ops::ActionFilter;
use outbox_runtime::Outbox;
use sqlx::PgPool;

mod common;

use common::{append_pings, billing_inbox, outbox_cli, park, stdout, Parked};

/// Six events: five failed (1 to 5) and one pending (6), with these types and errors.
async fn five_failed(pool: &PgPool) -> Vec<uuid::Uuid> {
    let ids = append_pings(pool, &(1..=6).map(|i| format!("agg-{i}")).collect::<Vec<_>>()).await;
    sqlx::query(
        "UPDATE outbox o SET event_type = v.t, last_error = v.e, status = v.s, failed_at = now() - v.age * interval '1 minute' \
         FROM (VALUES (1, 'invoice.issued', 'Broker: Message size too large', 'failed', 90), \
                      (2, 'invoice.issued', 'topic invoices does not exist', 'failed', 10), \
                      (3, 'order.placed', 'Broker: MESSAGE SIZE TOO LARGE', 'failed', 10), \
                      (4, 'invoice.issued', 'message size too large', 'failed', 10), \
                      (5, 'order.shipped', 'message size too large', 'failed', 10), \
                      (6, 'invoice.issued', NULL, 'pending', 0)) AS v(id, t, e, s, age) \
         WHERE o.id = v.id",
    )
    .execute(pool)
    .await
    .expect("states");
    ids
}

async fn statuses(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM outbox ORDER BY id").fetch_all(pool).await.expect("statuses")
}

/// In the action's first transaction (with its audit row): event 6 fails matching the
/// filter (after the snapshot: it must not be swept in) and event 4 is discarded (no
/// longer in the matched state: skipped).
async fn meddle_after_the_snapshot(pool: &PgPool, audit: &str, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION meddle() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {sql}; RETURN NULL; END $$"
    )))
    .execute(pool)
    .await
    .expect("function");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER meddle AFTER INSERT ON {audit} FOR EACH ROW EXECUTE FUNCTION meddle()"
    )))
    .execute(pool)
    .await
    .expect("trigger");
}

#[sqlx::test(migrations = false)]
async fn failed_events_are_retried_by_filter_exactly_as_matched(pool: PgPool) {
    let ids = five_failed(&pool).await;
    let ops = Outbox::default_ref().ops();
    let filter = ActionFilter::default()
        .event_type("invoice.issued")
        .event_type("order.placed")
        .reason_contains("size too large");
    let dry = ops.retry_failed(&pool, &filter, "alice", true).await.expect("dry run");
    assert_eq!((dry.matched, dry.applied, dry.skipped), (3, 0, 0));
    assert_eq!(dry.first, [ids[0], ids[2], ids[3]].map(|id| id.to_string()));
    assert_eq!(
        statuses(&pool).await,
        ["failed", "failed", "failed", "failed", "failed", "pending"],
        "dry run"
    );
    let audits: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_audit").fetch_one(&pool).await.expect("n");
    assert_eq!(audits, 0, "a dry run is not recorded");
    // A time window: event 1 failed 90 minutes ago.
    let recent = filter.clone().since(SystemTime::now() - Duration::from_secs(1800));
    assert_eq!(ops.retry_failed(&pool, &recent, "alice", true).await.expect("dry").matched, 2);

    meddle_after_the_snapshot(
        &pool,
        "outbox_audit",
        "UPDATE outbox SET status = 'failed', last_error = 'size too large' WHERE id = 6; \
         UPDATE outbox SET status = 'discarded' WHERE id = 4",
    )
    .await;
    let done = ops.retry_failed(&pool, &filter, "alice", false).await.expect("retry");
    assert_eq!((done.matched, done.applied, done.skipped), (3, 2, 1));
    assert_eq!(statuses(&pool).await, ["pending", "failed", "pending", "discarded", "failed", "failed"]);
    let audit: (String, String, i64, i64, i64, serde_json::Value) = sqlx::query_as(
        "SELECT actor, action, matched, applied, skipped, filter FROM outbox_audit WHERE id = $1",
    )
    .bind(done.audit_id.expect("audit id"))
    .fetch_one(&pool)
    .await
    .expect("audit");
    assert_eq!((audit.0.as_str(), audit.1.as_str(), audit.2, audit.3, audit.4), ("alice", "retry", 3, 2, 1));
    assert_eq!(audit.5["event_types"], serde_json::json!(["invoice.issued", "order.placed"]));
    assert_eq!(audit.5["reason_contains"], "size too large");

    // Again: only what matches now (event 6, failed since), then nothing.
    sqlx::query("DROP TRIGGER meddle ON outbox_audit").execute(&pool).await.expect("drop");
    let again = ops.retry_failed(&pool, &filter, "alice", false).await.expect("again");
    assert_eq!((again.matched, again.applied), (1, 1));
    let third = ops.retry_failed(&pool, &filter, "alice", false).await.expect("third");
    assert_eq!((third.matched, third.applied, third.skipped), (0, 0, 0));
    let audits: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_audit").fetch_one(&pool).await.expect("n");
    assert_eq!(audits, 3, "every action is recorded, one that found nothing too");
}

#[sqlx::test(migrations = false)]
async fn the_cli_counts_first_and_acts_with_yes(pool: PgPool) {
    five_failed(&pool).await;
    let filter =
        ["--event-type", "invoice.issued", "--event-type", "order.placed", "--reason-contains", "SIZE too"];
    let run = |extra: &[&str]| {
        let mut args = vec!["failed", "discard", "--reason", "resent by hand"];
        args.extend_from_slice(&filter);
        args.extend_from_slice(extra);
        outbox_cli(&pool, &args)
    };
    let unconfirmed = run(&[]);
    assert_eq!(unconfirmed.status.code(), Some(2), "{unconfirmed:?}");
    assert!(stdout(&unconfirmed).starts_with("3 failed event(s) matched: "), "{}", stdout(&unconfirmed));
    assert!(
        String::from_utf8_lossy(&unconfirmed.stderr).contains("add --yes to discard the 3 failed event(s)")
    );
    let dry = run(&["--dry-run", "--yes"]);
    assert_eq!(dry.status.code(), Some(0), "{dry:?}");
    assert!(stdout(&dry).contains("dry run: nothing changed"), "{}", stdout(&dry));
    assert_eq!(statuses(&pool).await, ["failed", "failed", "failed", "failed", "failed", "pending"]);

    let done = run(&["--yes", "--actor", "bob", "--json"]);
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&done)).expect("json");
    let changed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE status = 'discarded' AND last_error = 'discarded: resent by hand'",
    )
    .fetch_one(&pool)
    .await
    .expect("n");
    assert_eq!((report["matched"].as_i64(), report["applied"].as_i64()), (Some(3), Some(changed)));
    assert_eq!(changed, 3);
    let actor: String =
        sqlx::query_scalar("SELECT actor FROM outbox_audit").fetch_one(&pool).await.expect("audit");
    assert_eq!(actor, "bob");
    let none = run(&["--yes"]);
    assert_eq!(none.status.code(), Some(1), "nothing left to discard: {none:?}");
    let both = outbox_cli(&pool, &["failed", "retry", &uuid::Uuid::nil().to_string(), "--topic", "t"]);
    assert_eq!(both.status.code(), Some(2), "an id and a filter together");
    let neither = outbox_cli(&pool, &["failed", "retry"]);
    assert_eq!(neither.status.code(), Some(2), "neither an id nor a filter");
}

/// Consumer `billing`: heads of keys k1 to k5 parked (k1 with a message held behind it).
async fn five_parked(pool: &PgPool) -> InboxAdmin {
    let inbox = billing_inbox(pool).await;
    let rows = [
        (0_i64, "k1", "invoice.issued", "parked", "no handler for event type invoice.issued version 2"),
        (1, "k2", "invoice.issued", "parked", "handler failed: ledger closed"),
        (2, "k3", "invoice.issued", "parked", "no handler for event type invoice.issued version 2"),
        (3, "k4", "order.placed", "parked", "no handler for event type order.placed version 1"),
        (4, "k5", "invoice.issued", "parked", "No Handler for event type invoice.issued version 2"),
        (5, "k1", "invoice.issued", "held", "held behind parked message 1"),
    ]
    .map(|(offset, key, event_type, status, reason)| Parked {
        partition: 0,
        offset,
        key,
        event_type,
        version: 2,
        status,
        reason,
    });
    park(pool, &rows).await;
    inbox.admin()
}

async fn parked_rows(pool: &PgPool) -> Vec<(i64, String, bool)> {
    sqlx::query_as("SELECT id, status, retry_requested_at IS NOT NULL FROM inbox_parked ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("rows")
}

#[sqlx::test(migrations = false)]
async fn parked_messages_are_retried_and_discarded_by_filter(pool: PgPool) {
    let admin = five_parked(&pool).await;
    let filter = ActionFilter::default().event_type("invoice.issued").reason_contains("no handler");
    let dry = admin.retry_matching(&filter, "carol", true).await.expect("dry");
    assert_eq!((dry.matched, dry.first.clone()), (3, vec!["1".to_owned(), "3".to_owned(), "5".to_owned()]));
    assert!(parked_rows(&pool).await.iter().all(|(_, _, requested)| !requested), "a dry run changes nothing");

    // After the snapshot, k2's head starts matching: not swept in; k5's head is
    // discarded meanwhile: skipped.
    meddle_after_the_snapshot(
        &pool,
        "inbox_audit",
        "UPDATE inbox_parked SET reason = 'no handler for it' WHERE id = 2; \
         UPDATE inbox_parked SET status = 'discarded' WHERE id = 5",
    )
    .await;
    let done = admin.retry_matching(&filter, "carol", false).await.expect("retry");
    assert_eq!((done.matched, done.applied, done.skipped), (3, 2, 1));
    let requested: Vec<i64> = parked_rows(&pool)
        .await
        .into_iter()
        .filter(|(_, _, requested)| *requested)
        .map(|(id, ..)| id)
        .collect();
    assert_eq!(requested, [1, 3], "the heads matched, not the message held behind 1, not 2");
    let audit: (String, String, String, i64, i64, i64) = sqlx::query_as(
        "SELECT consumer, actor, action, matched, applied, skipped FROM inbox_audit WHERE id = $1",
    )
    .bind(done.audit_id.expect("audit"))
    .fetch_one(&pool)
    .await
    .expect("audit");
    assert_eq!(audit, ("billing".into(), "carol".into(), "retry".into(), 3, 2, 1));
    sqlx::query("DROP TRIGGER meddle ON inbox_audit").execute(&pool).await.expect("drop");
    // Again: k2's head matches now; 1 and 3 already wait for the consumer.
    let again = admin.retry_matching(&filter, "carol", false).await.expect("again");
    assert_eq!((again.matched, again.applied, again.first), (1, 1, vec!["2".to_owned()]));
    let third = admin.retry_matching(&filter, "carol", false).await.expect("third");
    assert_eq!((third.matched, third.applied), (0, 0), "nothing new");

    // Discard by filter, in id order: k1's head (the message held behind it does not
    // match: it goes to the running consumer next), k2's (matching since) and k3's; k4 is
    // another type, k5's was discarded already.
    let discarded = admin.discard_matching(&filter, "refunded", "carol", false).await.expect("discard");
    assert_eq!((discarded.matched, discarded.applied, discarded.skipped), (3, 3, 0));
    let rows: Vec<(String, bool)> = parked_rows(&pool).await.into_iter().map(|(_, s, r)| (s, r)).collect();
    let expected = [
        ("discarded", false),
        ("discarded", false),
        ("discarded", false),
        ("parked", false),
        ("discarded", false),
        ("held", true),
    ];
    assert_eq!(rows, expected.map(|(s, r)| (s.to_owned(), r)));
    let absorbed: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox WHERE outcome = 'discarded'")
        .fetch_one(&pool)
        .await
        .expect("n");
    assert_eq!(absorbed, 3, "a redelivery of each is absorbed");
}

#[sqlx::test(migrations = false)]
async fn the_cli_retries_parked_messages_by_filter(pool: PgPool) {
    five_parked(&pool).await;
    let inbox_cli = |extra: &[&str]| {
        let mut args = vec!["inbox", "--consumer", "billing", "retry", "--event-type", "invoice.issued"];
        args.extend_from_slice(&["--reason-contains", "No handler"]);
        args.extend_from_slice(extra);
        outbox_cli(&pool, &args)
    };
    let counted = inbox_cli(&[]);
    assert_eq!(counted.status.code(), Some(2), "{counted:?}");
    assert_eq!(stdout(&counted).lines().next(), Some("3 parked message(s) matched: 1, 3, 5"));
    assert!(parked_rows(&pool).await.iter().all(|(_, _, requested)| !requested), "nothing without --yes");
    let done = inbox_cli(&["--yes"]);
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    let requested = parked_rows(&pool).await.iter().filter(|(_, _, requested)| *requested).count();
    assert_eq!(requested, 3);
    assert!(
        stdout(&done).contains(&format!("retry requested: {requested}; skipped: 0")),
        "{}",
        stdout(&done)
    );
    let audits: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_audit WHERE applied = 3")
        .fetch_one(&pool)
        .await
        .expect("n");
    assert_eq!(audits, 1);
    let again = inbox_cli(&["--yes"]);
    assert_eq!(again.status.code(), Some(1), "nothing new to retry: {again:?}");
}

/// A filtered discard goes in id order per key: a head, then the message held behind it
/// when that matches too.
#[sqlx::test(migrations = false)]
async fn a_filtered_discard_takes_a_key_in_order(pool: PgPool) {
    let admin = five_parked(&pool).await;
    let k1 = ActionFilter::default().event_type("invoice.issued").topic("orders").until(SystemTime::now());
    let done = admin.discard_matching(&k1, "refunded", "dave", false).await.expect("discard");
    assert_eq!((done.matched, done.applied, done.skipped), (5, 5, 0));
    let statuses: Vec<String> = parked_rows(&pool).await.into_iter().map(|(_, s, _)| s).collect();
    assert_eq!(statuses, ["discarded", "discarded", "discarded", "parked", "discarded", "discarded"]);
    let other_topic = ActionFilter::default().topic("invoices");
    assert_eq!(admin.discard_matching(&other_topic, "r", "dave", true).await.expect("dry").matched, 0);
}

/// A database migrated before the time of failure was kept: `outbox migrate`, not a raw
/// "column does not exist"; times are read by PostgreSQL, and a bad one is named.
#[sqlx::test(migrations = false)]
async fn an_outbox_without_the_latest_migration_says_run_migrate(pool: PgPool) {
    five_failed(&pool).await;
    sqlx::query("ALTER TABLE outbox DROP COLUMN failed_at").execute(&pool).await.expect("v3");
    let out = outbox_cli(&pool, &["failed", "retry", "--topic", "test", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("run `outbox migrate`"), "{out:?}");
    sqlx::query("ALTER TABLE outbox ADD COLUMN failed_at timestamptz").execute(&pool).await.expect("v4");
    let until = outbox_cli(&pool, &["failed", "retry", "--until", "2000-01-01", "--dry-run"]);
    assert_eq!(
        (until.status.code(), stdout(&until).trim()),
        (Some(1), "0 failed event(s) matched\ndry run: nothing changed")
    );
    let bad = outbox_cli(&pool, &["failed", "retry", "--since", "yesterday-ish", "--dry-run"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid --since \"yesterday-ish\""), "{bad:?}");
}

/// A filtered discard never hands the consumer a message it is about to discard: key kA's
/// head, the matching message held behind it and the matching one behind an unmatched
/// third are all discarded before the third is handed over; on key kB, a matching message
/// held behind an unmatched head is discarded (it will never apply) and nothing of kB is
/// handed over. Every retry request ever set is logged by a trigger with the matched
/// messages still open behind it: earlier code handed kA's third over while its sixth was
/// still to be discarded (the consumer would apply it), and before that skipped kB's.
#[sqlx::test(migrations = false)]
async fn a_filtered_discard_hands_over_only_what_it_does_not_discard(pool: PgPool) {
    let inbox = billing_inbox(&pool).await;
    let rows = [
        (0_i64, "kA", "invoice.issued", "parked"),
        (1, "kA", "invoice.issued", "held"),
        (2, "kA", "order.placed", "held"),
        (3, "kB", "order.placed", "parked"),
        (4, "kB", "invoice.issued", "held"),
        (5, "kA", "invoice.issued", "held"),
    ]
    .map(|(offset, key, event_type, status)| Parked {
        partition: 0,
        offset,
        key,
        event_type,
        version: 1,
        status,
        reason: "r",
    });
    park(&pool, &rows).await;
    sqlx::raw_sql(
        "CREATE TABLE requested (id bigint NOT NULL, matched_behind bigint NOT NULL); \
         CREATE FUNCTION log_request() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN INSERT INTO requested VALUES (NEW.id, (SELECT count(*) FROM inbox_parked q \
                WHERE q.hold_key = NEW.hold_key AND q.id > NEW.id AND q.status IN ('parked', 'held') \
                AND q.event_type = 'invoice.issued')); RETURN NEW; END $$; \
         CREATE TRIGGER log_request AFTER UPDATE ON inbox_parked FOR EACH ROW \
           WHEN (NEW.retry_requested_at IS NOT NULL AND OLD.retry_requested_at IS NULL) EXECUTE FUNCTION log_request();",
    )
    .execute(&pool)
    .await
    .expect("trigger");
    let filter = ActionFilter::default().event_type("invoice.issued");
    let done = inbox.admin().discard_matching(&filter, "refunded", "erin", false).await.expect("discard");
    assert_eq!((done.matched, done.applied, done.skipped), (4, 4, 0), "{done:?}");
    let statuses: Vec<String> = parked_rows(&pool).await.into_iter().map(|(_, s, _)| s).collect();
    assert_eq!(statuses, ["discarded", "discarded", "held", "parked", "discarded", "discarded"]);
    let requested: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, matched_behind FROM requested").fetch_all(&pool).await.expect("log");
    assert_eq!(
        requested,
        [(3, 0)],
        "only kA's third message was ever handed to the consumer, and only once no matched message \
         was left behind it (the consumer would have applied kA's sixth)"
    );
}

/// An empty filter value (an unset shell variable) is refused, not a filter that matches
/// every row.
#[sqlx::test(migrations = false)]
async fn an_empty_filter_value_is_refused(pool: PgPool) {
    let admin = five_parked(&pool).await;
    for filter in [
        ActionFilter::default().reason_contains(""),
        ActionFilter::default().topic(" "),
        ActionFilter::default().event_type(""),
    ] {
        let refused = admin.discard_matching(&filter, "r", "erin", false).await.expect_err("refused");
        assert!(matches!(refused, outbox_runtime::Error::Config(_)), "{refused:?}");
    }
    assert!(parked_rows(&pool).await.iter().all(|(_, s, _)| s != "discarded"), "nothing discarded");
}

/// Every action of the command line is recorded in the audit table, by id too, keeping
/// what each by-id command takes: `failed retry ID` and `retry --aggregate` take failed
/// events, `discard ID` a failed or pending one (not a published one), the inbox's by id a
/// parked message that is first of its key (one held behind another is refused, naming
/// it, and records nothing). A command that changes nothing records nothing.
#[sqlx::test(migrations = false)]
async fn actions_by_id_are_audited_and_keep_what_they_take(pool: PgPool) {
    let ids = common::seed(&pool).await; // a failed, a pending behind it, b pending, c published
    let audit = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (String, String, Option<String>, i64, i64, i64, serde_json::Value)>(
                sqlx::AssertSqlSafe(format!(
                "SELECT actor, action, reason, matched, applied, skipped, filter FROM {table} ORDER BY id"
            )),
            )
            .fetch_all(&pool)
            .await
            .expect("audit")
        }
    };
    let row = |actor: &str, action: &str, reason: Option<&str>, id: serde_json::Value| {
        let filter = serde_json::json!({ "ids": [id] });
        (actor.to_owned(), action.to_owned(), reason.map(str::to_owned), 1, 1, 0, filter)
    };
    let refail = || sqlx::query("UPDATE outbox SET status = 'failed' WHERE id = 1").execute(&pool);

    let out = outbox_cli(&pool, &["failed", "retry", &ids[0].to_string(), "--actor", "bo", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!((report["applied"].as_u64(), report["audit_id"].as_i64()), (Some(1), Some(1)), "{report}");
    refail().await.expect("fail again");
    let out = outbox_cli(&pool, &["retry", "--aggregate", "a", "--actor", "cy"]);
    assert_eq!(
        (out.status.code(), stdout(&out).trim()),
        (Some(0), "1 failed event(s) put back up for publication")
    );
    let none = outbox_cli(&pool, &["retry", "--aggregate", "b", "--actor", "cy"]);
    assert_eq!(none.status.code(), Some(1), "b has no failed event: {none:?}");
    let out = outbox_cli(
        &pool,
        &["discard", &ids[2].to_string(), "--reason", "never needed", "--yes", "--actor", "di"],
    );
    assert_eq!(out.status.code(), Some(0), "a pending event is discarded by id: {out:?}");
    let out = outbox_cli(&pool, &["failed", "discard", &ids[3].to_string(), "--reason", "x", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "a published one is not: {out:?}");
    assert_eq!(statuses(&pool).await, ["pending", "pending", "discarded", "published"]);
    assert_eq!(
        audit("outbox_audit").await,
        [
            row("bo", "retry", None, ids[0].to_string().into()),
            row("cy", "retry", None, ids[0].to_string().into()),
            row("di", "discard", Some("never needed"), ids[2].to_string().into()),
        ]
    );

    billing_inbox(&pool).await;
    let parked = |offset, key, status| Parked {
        partition: 0,
        offset,
        key,
        event_type: "e",
        version: 1,
        status,
        reason: "r",
    };
    park(&pool, &[parked(1, "k", "parked"), parked(2, "k", "held"), parked(3, "l", "parked")]).await;
    let inbox = |args: &[&str]| outbox_cli(&pool, &[&["inbox", "--consumer", "billing"][..], args].concat());
    let held = inbox(&["retry", "2", "--actor", "ed"]);
    assert_eq!(held.status.code(), Some(4), "held behind 1: {held:?}");
    let out = inbox(&["retry", "3", "--actor", "ed", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = inbox(&["discard", "1", "--reason", "poison", "--yes", "--actor", "fa"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("1 held behind it go to the running consumer"), "{}", stdout(&out));
    assert_eq!(
        audit("inbox_audit").await,
        [row("ed", "retry", None, 3.into()), row("fa", "discard", Some("poison"), 1.into())]
    );
    let consumers: Vec<Option<String>> =
        sqlx::query_scalar("SELECT consumer FROM inbox_audit").fetch_all(&pool).await.expect("consumers");
    assert_eq!(consumers, [Some("billing".to_owned()), Some("billing".to_owned())]);
}
