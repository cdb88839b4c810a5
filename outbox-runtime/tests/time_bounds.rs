//! Time bounds filter exactly as they read, to the nanosecond, wherever one is taken: an
//! action's filter (`retry_failed`, `discard_failed`), a replay, a reconciliation, and the
//! `--since`/`--until` of the command line. PostgreSQL keeps microseconds; a bound between
//! two of them once went to PostgreSQL as float seconds and was rounded to the nearest, so
//! a `since` 300 ns after an event took it and an `until` 300 ns after one left it out.
//! Event times are generated microseconds apart (ties included), bounds up to 999 ns off
//! them, every count compared with the rows read whole (seed printed).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_runtime::ops::{ActionFilter, ReplayFilter};
use outbox_runtime::Outbox;
use sqlx::PgPool;

mod common;

use common::{append_pings, near, outbox_cli, stdout};

/// 2026-01-01T00:30:00Z in microseconds: every event is within 40 µs after it, in one hour.
const BASE_MICROS: i64 = 1_767_227_400_000_000;

fn at(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).expect("after 1970"))
}

/// (creation time in microseconds, failed) of each of `n` events, given at random.
async fn random_events(pool: &PgPool, n: usize, rng: &mut fastrand::Rng) -> Vec<(i64, bool)> {
    let ids: Vec<String> = (0..n).map(|i| format!("agg-{i}")).collect();
    append_pings(pool, &ids).await;
    let rows: Vec<(i64, bool)> = (0..n).map(|_| (BASE_MICROS + rng.i64(0..40), rng.bool())).collect();
    for (offset, (micros, failed)) in rows.iter().enumerate() {
        sqlx::query(
            "UPDATE outbox SET created_at = timestamptz 'epoch' + $2 * interval '1 microsecond', \
                    status = CASE WHEN $3 THEN 'failed' ELSE 'published' END, \
                    published_at = CASE WHEN $3 THEN NULL ELSE now() END, \
                    last_error = CASE WHEN $3 THEN 'Broker: Message size too large' END \
             WHERE id = (SELECT min(id) FROM outbox) + $1",
        )
        .bind(i64::try_from(offset).expect("offset"))
        .bind(micros)
        .bind(failed)
        .execute(pool)
        .await
        .expect("row");
    }
    rows
}

/// The seed (`OUTBOX_TEST_SEED`, or a new one), printed for `test`, and its generator.
fn seeded(test: &str) -> (u64, fastrand::Rng) {
    let seed = std::env::var("OUTBOX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("{test}: OUTBOX_TEST_SEED={seed}");
    (seed, fastrand::Rng::with_seed(seed))
}

#[sqlx::test(migrations = false)]
async fn bounds_between_microseconds_filter_as_they_read(pool: PgPool) {
    let (seed, mut rng) = seeded("time bounds");
    let rows = random_events(&pool, 60, &mut rng).await;
    let ops = Outbox::default_ref().ops();
    let (mut between, mut compared) = (0, 0);
    for round in 0..60 {
        let from = rng.i64(0..40);
        let (from, to) = (at(BASE_MICROS + from), at(BASE_MICROS + rng.i64(from + 1..=41)));
        let (since, until) = (near(&mut rng, from), near(&mut rng, to));
        if until <= since {
            continue; // refused, as an empty window (tested with the filters)
        }
        compared += 1;
        between +=
            usize::from(since.duration_since(UNIX_EPOCH).expect("after 1970").subsec_nanos() % 1000 != 0);
        let inside = |micros: i64| at(micros) >= since && at(micros) < until;
        let all = rows.iter().filter(|(micros, _)| inside(*micros)).count() as u64;
        let failed = rows.iter().filter(|(micros, failed)| *failed && inside(*micros)).count() as u64;
        let context = format!("seed {seed}, round {round}: [{since:?}, {until:?})");

        let filter = ActionFilter::default().since(since).until(until);
        let retry = ops.retry_failed(&pool, &filter, "test", true).await.expect("retry dry run");
        assert_eq!(retry.matched, failed, "retry_failed, {context}");
        let discard =
            ops.discard_failed(&pool, &filter, "test", "test", true).await.expect("discard dry run");
        assert_eq!(discard.matched, failed, "discard_failed, {context}");

        let replay = ReplayFilter { since: Some(since), until: Some(until), ..ReplayFilter::default() };
        let report = ops.replay(&pool, &replay, true).await.expect("replay dry run");
        assert_eq!((report.matched, report.replayable), (all, all - failed), "replay, {context}");

        let reconciled = ops.reconcile(&pool, since, until, None).await.expect("reconcile");
        let appended: i64 = reconciled.rows.iter().map(|r| r.appended).sum();
        let unpublished: i64 = reconciled.rows.iter().map(|r| r.unpublished).sum();
        assert_eq!((appended, unpublished), (all as i64, failed as i64), "reconcile, {context}");
    }
    assert!(
        compared > 50 && between > 25,
        "{compared} windows compared, {between} with bounds between microseconds"
    );
}

/// The command line reads `--since` and `--until` as PostgreSQL prints them, exact to the
/// microsecond: a time read through float seconds could land a fraction of one later.
#[sqlx::test(migrations = false)]
async fn the_command_line_takes_a_printed_time_to_its_microsecond(pool: PgPool) {
    let (seed, mut rng) = seeded("time bounds, command line");
    let rows = random_events(&pool, 40, &mut rng).await;
    // Every time the events have, as PostgreSQL prints it: a bound at each must take the
    // events at that very microsecond (since) or leave them out (until).
    let printed: Vec<(i64, String)> = sqlx::query_as(
        "SELECT DISTINCT (extract(epoch FROM created_at) * 1000000)::int8, created_at::text FROM outbox ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("times");
    assert!(printed.len() > 10, "{} distinct times", printed.len());
    for (micros, text) in &printed {
        let failed_from = rows.iter().filter(|(m, failed)| *failed && m >= micros).count();
        let failed_before = rows.iter().filter(|(m, failed)| *failed && m < micros).count();
        for (flag, expected) in [("--since", failed_from), ("--until", failed_before)] {
            let out = outbox_cli(&pool, &["failed", "retry", flag, text, "--dry-run", "--json"]);
            // Exit 1 when nothing matched.
            let code = out.status.code();
            assert!(
                code == Some(0) || code == Some(1),
                "{flag} {text}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
            assert_eq!(report["matched"], expected, "seed {seed}: {flag} {text}");
        }
    }
}

/// `micros` after 1970, or before it when negative.
fn at_signed(micros: i64) -> SystemTime {
    let span = Duration::from_micros(micros.unsigned_abs());
    if micros < 0 {
        UNIX_EPOCH - span
    } else {
        UNIX_EPOCH + span
    }
}

/// Bounds far from 1970 are exact too: 1900 and 2300, more than 2^53 µs away, where one
/// float product of the whole count of microseconds would land a microsecond off; and
/// bounds beyond PostgreSQL's times are earlier or later than every event.
#[sqlx::test(migrations = false)]
async fn bounds_far_from_1970_are_exact(pool: PgPool) {
    // 1900-01-01T00:00:00Z and a microsecond after; 2300-01-01T00:00:00Z and a microsecond after.
    let times =
        [-2_208_988_800_000_000_i64, -2_208_988_799_999_999, 10_413_792_000_000_000, 10_413_792_000_000_001];
    append_pings(&pool, &times.map(|t| t.to_string())).await;
    for (offset, micros) in times.iter().enumerate() {
        sqlx::query(
            "UPDATE outbox SET created_at = timestamptz 'epoch' + ($2 / 1000000) * interval '1 second' \
                                            + ($2 % 1000000) * interval '1 microsecond', \
                    status = 'failed', last_error = 'Broker: Message size too large' \
             WHERE id = (SELECT min(id) FROM outbox) + $1",
        )
        .bind(i64::try_from(offset).expect("offset"))
        .bind(micros)
        .execute(&pool)
        .await
        .expect("row");
    }
    let stored: Vec<i64> =
        sqlx::query_scalar("SELECT (extract(epoch FROM created_at) * 1000000)::int8 FROM outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("stored");
    assert_eq!(stored, times, "the rows hold the times given");
    let ops = Outbox::default_ref().ops();
    let nano = Duration::from_nanos(1);
    for micros in times {
        for bound in [at_signed(micros) - nano, at_signed(micros), at_signed(micros) + nano] {
            let from = times.iter().filter(|t| at_signed(**t) >= bound).count() as u64;
            let since = ops
                .retry_failed(&pool, &ActionFilter::default().since(bound), "t", true)
                .await
                .expect("since");
            assert_eq!(since.matched, from, "since {bound:?}");
            let until = ops
                .retry_failed(&pool, &ActionFilter::default().until(bound), "t", true)
                .await
                .expect("until");
            assert_eq!(until.matched, times.len() as u64 - from, "until {bound:?}");
        }
    }
    // Before and after anything PostgreSQL stores (316,000 years either way): every event
    // is after the one and before the other, never an error.
    let ages = Duration::from_secs(10_000_000_000_000);
    for (bound, after) in [(UNIX_EPOCH - ages, 4), (UNIX_EPOCH + ages, 0)] {
        let since =
            ops.retry_failed(&pool, &ActionFilter::default().since(bound), "t", true).await.expect("since");
        let until =
            ops.retry_failed(&pool, &ActionFilter::default().until(bound), "t", true).await.expect("until");
        assert_eq!((since.matched, until.matched), (after, 4 - after), "{bound:?}");
    }
}
