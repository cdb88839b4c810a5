//! The operator console over HTTP (its browser tests are in `console_browser`): safe
//! defaults (loopback without a token, the token required and never printed but once,
//! foreign `Host`s refused), every write route enumerated from the router refused in
//! read-only mode and from another site, the CSRF token, a dry run before every change, a
//! double submit carried out once, payloads hidden unless allowed and then redacted with
//! big integers exact, markup in reasons and payloads escaped, no secret in any answer; an
//! action through the console gives what the CLI's gives on the same rows.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;

use outbox_runtime::console::{Console, ConsoleConfig};
use outbox_runtime::{CancellationToken, Outbox};
use sqlx::PgPool;
use uuid::Uuid;

#[path = "../common/mod.rs"]
mod common;
mod inbox_lists;
mod live;
mod overview;
mod parity;
mod safety;
mod time_lists;

use common::{billing_inbox, park, seed, Parked};

/// A console on a free port of 127.0.0.1, served by this test's runtime until the test ends.
async fn serve(pool: &PgPool, config: ConsoleConfig) -> (SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("addr");
    let console = Console::new(pool.clone(), Outbox::default_ref(), config.bind(addr)).expect("console");
    let stop = CancellationToken::new();
    tokio::spawn(console.serve(listener, stop.clone()));
    (addr, stop)
}

/// An answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request written by hand (so that `Host`, `Origin` and `Sec-Fetch-Site` are
/// exactly what a test says), on a blocking thread while the runtime serves.
async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut text = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        text.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        text.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    text.push_str("\r\n");
    text.push_str(body);
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream.write_all(text.as_bytes()).expect("write");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).expect("read");
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let mut lines = head.lines();
        let status =
            lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        // Chunked bodies are read as they come: the tests look for text in them.
        Answer { status, headers, body: body.to_owned() }
    })
    .await
    .expect("request")
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, &[], "").await
}

/// The CLI's console process: stopped (SIGTERM) and waited for when dropped, whatever the
/// test's outcome.
struct Running(Option<std::process::Child>);

impl Running {
    /// Stops it; what it wrote to standard error.
    fn stop(mut self) -> String {
        let mut child = self.0.take().expect("running");
        let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        let _ = child.wait();
        stderr
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

/// `outbox console --bind 127.0.0.1:0 ARGS` on the database `url`, with `env`: the process,
/// its standard output after the first line, and that line (the URL to open).
fn cli_console(
    url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Running, std::process::ChildStdout, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--database-url", url, "console", "--bind", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let mut stdout = child.stdout.take().expect("stdout");
    let running = Running(Some(child));
    let mut first = String::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).expect("read") == 1 && byte[0] != b'\n' {
        first.push(byte[0] as char);
    }
    (running, stdout, first)
}

/// The outbox's four seeded events, and consumer `billing`'s inbox with one parked message.
async fn seed_both(pool: &PgPool) -> Vec<Uuid> {
    let ids = seed(pool).await;
    billing_inbox(pool).await;
    let parked = Parked {
        partition: 0,
        offset: 1,
        key: "k",
        event_type: "e",
        version: 1,
        status: "parked",
        reason: "r",
    };
    park(pool, &[parked]).await;
    ids
}

/// The CSRF token of a page (its forms carry it, and its `csrf-token` meta element).
fn csrf(page: &str) -> String {
    let needle = "<meta name=\"csrf-token\" content=\"";
    let at = page.find(needle).expect("a page with a CSRF token") + needle.len();
    page[at..].split('"').next().expect("value").to_owned()
}

/// Whether `page` holds `text` as HTML-escaped text (numeric or named entities).
fn holds_escaped(page: &str, text: &str) -> bool {
    let numeric =
        text.replace('&', "&#38;").replace('<', "&#60;").replace('>', "&#62;").replace('"', "&#34;");
    let named = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    page.contains(&numeric) || page.contains(&named)
}

async fn status_of(pool: &PgPool, event_id: Uuid) -> String {
    sqlx::query_scalar("SELECT status FROM outbox WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .expect("row")
}

/// Waits (up to 10 s) until the console process's sessions have left the test's database,
/// so that it can be dropped: a killed process's backends end a moment after it.
async fn left_alone(pool: &PgPool) {
    for _ in 0..100 {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'console-under-test'",
        )
        .fetch_one(pool)
        .await
        .expect("sessions");
        if others == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
