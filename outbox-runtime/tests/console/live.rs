//! The live overview: however many consoles are open, the overview is read once per
//! interval and shared between their streams (counted in the database's own statistics:
//! the scans of the relays table, which every reading of the overview makes).

use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;

use super::*;

/// Scans of `outbox_relays` so far.
async fn relay_scans(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'outbox_relays'",
    )
    .fetch_one(pool)
    .await
    .expect("statistics")
}

/// The `overview` events one client of `/live` receives in `time`.
fn live_events(addr: SocketAddr, time: Duration) -> usize {
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
    }
    String::from_utf8_lossy(&raw).matches("event: overview").count()
}

/// The scans of the relays table made by a console on a pool of its own while `clients`
/// read its live stream for `time` (0 clients: one page load instead), its pool closed so
/// that its connections' statistics reach the database; and the events the clients got.
async fn scans_while(pool: &PgPool, clients: usize, time: Duration) -> (i64, usize) {
    let own = PgPoolOptions::new()
        .max_connections(4)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("a pool");
    let before = relay_scans(pool).await;
    let (addr, stop) = serve(&own, ConsoleConfig::default()).await;
    let events = if clients == 0 {
        assert_eq!(get(addr, "/?format=json").await.status, 200);
        0
    } else {
        let readers: Vec<_> =
            (0..clients).map(|_| tokio::task::spawn_blocking(move || live_events(addr, time))).collect();
        let mut events = 0;
        for reader in readers {
            events += reader.await.expect("reader");
        }
        events
    };
    stop.cancel();
    own.close().await;
    // A backend reports its statistics as it exits.
    for _ in 0..100 {
        if relay_scans(pool).await > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every connection's, not only the first to exit.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (relay_scans(pool).await - before, events)
}

#[sqlx::test(migrations = false)]
async fn open_consoles_share_one_reading_of_the_overview_per_interval(pool: PgPool) {
    seed(&pool).await;
    let (per_reading, _) = scans_while(&pool, 0, Duration::ZERO).await;
    assert!(per_reading > 0, "a reading of the overview scans the relays table");
    // Four consoles for 7 s: each is sent the overview at once and 5 s later.
    let (scans, events) = scans_while(&pool, 4, Duration::from_secs(7)).await;
    let readings = scans / per_reading;
    eprintln!("{events} overviews sent, {readings} read ({scans} scans, {per_reading} a reading)");
    assert_eq!(events, 8, "each of the 4 streams sent 2");
    assert!((1..=3).contains(&readings), "{readings} readings of the overview for {events} sent");
}
