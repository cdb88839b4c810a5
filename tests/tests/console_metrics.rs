//! The console's background reads never fail silently: the live overview and a consumer's
//! lag, each read again and again while consoles are open, count every failure in
//! `outbox_console_read_errors_total` (by stage), once per reading however many consoles
//! share it, read through a debugging recorder
//! installed for this test binary (one test: the recorder is global to it).

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use outbox_runtime::console::{Console, ConsoleConfig};
use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig, LagReader};
use outbox_runtime::{CancellationToken, Outbox};
use outbox_tests::metrics_kit::{snapshot, snapshotter};
use outbox_tests::migrate;
use sqlx::PgPool;

/// The events named `event` that one client of `/live` receives within `time`, and the
/// `failed` events with them.
fn live_events(addr: SocketAddr, time: Duration) -> (usize, usize) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(stream, "GET /live HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n").expect("write");
    stream.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    let (deadline, mut raw, mut buf) = (Instant::now() + time, Vec::new(), [0u8; 8192]);
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("reading the stream: {e}"),
        }
        let text = String::from_utf8_lossy(&raw);
        if text.contains("event: overview") || text.contains("event: failed") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw);
    (text.matches("event: overview").count(), text.matches("event: failed").count())
}

/// The failed reads counted since the last call, (live, lag): one snapshot, which drains
/// the recorder's counters.
fn read_errors() -> (f64, f64) {
    let counted = snapshot();
    let stage = |stage: &str| {
        counted
            .get(&format!("outbox_console_read_errors_total{{stage={stage}}}"))
            .map_or(0.0, |v| v.iter().sum())
    };
    (stage("live"), stage("lag"))
}

#[sqlx::test(migrations = false)]
async fn failed_background_reads_are_counted_by_stage(pool: PgPool) {
    snapshotter();
    migrate(&pool).await;
    let inbox =
        Inbox::new(pool.clone(), InboxConfig::new("billing", "127.0.0.1:1", ["orders"]), Handlers::new())
            .expect("inbox");
    inbox.migrator().run(&pool).await.expect("inbox migrations");
    // A consumer the overview lists (and asks the brokers the lag of).
    sqlx::query(
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, status, reason) \
         VALUES ('billing', 'orders', 0, 1, 'k', '{}', 'x', 'parked', 'handler failed')",
    )
    .execute(&pool)
    .await
    .expect("parked");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("addr");
    // Brokers nobody listens at: every read of the lag fails, within its timeout.
    let lag = LagReader::new("127.0.0.1:1").timeout(Duration::from_millis(500));
    let config = ConsoleConfig::default().bind(addr).inbox("public", "inbox").lag(lag);
    let console = Console::new(pool.clone(), Outbox::default_ref(), config).expect("console");
    let stop = CancellationToken::new();
    tokio::spawn(console.serve(listener, stop.clone()));
    snapshot(); // from 0

    let read = || tokio::task::spawn_blocking(move || live_events(addr, Duration::from_secs(10)));
    let mut lag_errors = 0.0;
    assert_eq!(read().await.expect("stream"), (1, 0), "the overview, read");
    let (live, lag) = read_errors();
    assert_eq!(live, 0.0);
    lag_errors += lag;

    // The overview cannot be read: the relays table is gone.
    sqlx::query("ALTER TABLE outbox_relays RENAME TO outbox_relays_away").execute(&pool).await.expect("away");
    // Past the shared reading's half interval, three consoles at once: one failed reading,
    // shared as a good one is, and counted once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let streams = [read(), read(), read()];
    for stream in streams {
        assert_eq!(stream.await.expect("stream"), (0, 1), "each stream says the overview failed");
    }
    let (live, lag) = read_errors();
    assert_eq!(live, 1.0, "one failed reading for three streams");
    lag_errors += lag;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(read().await.expect("stream"), (0, 1), "read again, and failed again");
    let (live, lag) = read_errors();
    assert_eq!(live, 1.0, "each failed reading counted");
    lag_errors += lag;

    sqlx::query("ALTER TABLE outbox_relays_away RENAME TO outbox_relays").execute(&pool).await.expect("back");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(read().await.expect("stream"), (1, 0), "read again once it can be");
    // The lag, read in the background for the overviews above: every read fails.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (live, lag) = read_errors();
        assert_eq!(live, 0.0, "nothing failed since");
        lag_errors += lag;
        if lag_errors >= 1.0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(lag_errors >= 1.0, "a failed read of the lag counted ({lag_errors})");
    stop.cancel();
}
