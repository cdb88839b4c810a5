//! The operator console over HTTP (its browser tests are in `console_browser`): safe
//! defaults (loopback without a token, the token required and never printed but once,
//! foreign `Host`s refused), every write route enumerated from the router refused in
//! read-only mode and from another site, the CSRF token, a dry run before every change, a
//! double submit carried out once, payloads hidden unless allowed and then redacted with
//! big integers exact, markup in reasons and payloads escaped, no secret in any answer; an
//! action through the console gives what the CLI's gives on the same rows.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;

use outbox_runtime::console::{redact_keys, Console, ConsoleConfig, WRITE_ROUTES};
use outbox_runtime::{CancellationToken, Error, Outbox};
use sqlx::PgPool;
use uuid::Uuid;

mod common;

use common::{append_pings, billing_inbox, database_url, outbox_cli, park, seed, stdout, Parked};

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

#[sqlx::test(migrations = false)]
async fn a_console_beyond_loopback_needs_a_token_and_the_token_is_checked(pool: PgPool) {
    seed(&pool).await;
    let outbox = Outbox::default_ref();
    let wide = ConsoleConfig::default().bind("0.0.0.0:18090".parse().expect("addr"));
    let refused = Console::new(pool.clone(), outbox, wide.clone()).expect_err("no token");
    assert!(
        matches!(&refused, Error::Config(m) if m.contains("0.0.0.0:18090") && m.contains("token")),
        "{refused}"
    );
    for bad in ["short", "has spaces in it, long enough", "semi;colon;long;enough;x"] {
        assert!(Console::new(pool.clone(), outbox, wide.clone().token(bad)).is_err(), "{bad:?}");
    }
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--database-url", &database_url(&pool), "console", "--bind", "0.0.0.0:0"])
        .output()
        .expect("run");
    assert_eq!(cli.status.code(), Some(2), "{cli:?}");

    let token = outbox_runtime::console::generate_token();
    let (addr, stop) = serve(&pool, ConsoleConfig::default().token(&token)).await;
    assert_eq!(get(addr, "/").await.status, 401);
    assert_eq!(get(addr, "/events?format=json").await.status, 401);
    assert_eq!(get(addr, "/login?token=0123456789abcdef0123").await.status, 401);
    let login = get(addr, &format!("/login?token={token}")).await;
    assert_eq!(login.status, 303);
    let cookie = login.header("set-cookie").expect("a cookie").to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = cookie.split(';').next().expect("pair").to_owned();
    let page = request(addr, "GET", "/", &[("Cookie", &session)], "").await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains(&token), "the token is never in a page");
    let bearer = format!("Bearer {token}");
    assert_eq!(request(addr, "GET", "/failures", &[("Authorization", &bearer)], "").await.status, 200);
    // With a token, any Host (the machine's own addresses, a proxy's name) is fine.
    assert_eq!(
        request(addr, "GET", "/", &[("Cookie", &session), ("Host", "10.1.2.3:8089")], "").await.status,
        200
    );
    stop.cancel();
}

#[sqlx::test(migrations = false)]
async fn the_cli_prints_the_login_url_once_and_never_logs_the_token(pool: PgPool) {
    seed(&pool).await;
    let url = format!("{}?application_name=console-under-test", database_url(&pool));
    let (running, mut stdout, first) = cli_console(&url, &["--generate-token"], &[("RUST_LOG", "trace")]);
    let token = first.split("token=").nth(1).expect("the login URL").to_owned();
    assert!(first.starts_with("outbox console: http://127.0.0.1:") && token.len() >= 16, "{first}");
    let stderr = running.stop();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("the rest of its output");
    rest.push_str(&stderr);
    assert!(!rest.contains(&token), "printed once, logged never: {rest}");
    left_alone(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn every_write_route_is_refused_read_only_and_from_another_site(pool: PgPool) {
    let ids = seed_both(&pool).await;
    let writable = ConsoleConfig::default().inbox("public", "inbox");
    let (addr, stop) = serve(&pool, writable.clone()).await;
    let token = csrf(&get(addr, &format!("/events/{}", ids[0])).await.body);
    let (ro, ro_stop) = serve(&pool, writable.read_only(true)).await;
    let read_only_page = get(ro, &format!("/events/{}", ids[0])).await;
    let ro_token = csrf(&read_only_page.body);
    assert!(!read_only_page.body.contains("<form method=\"post\""), "no write form in a read-only console");
    assert_eq!(WRITE_ROUTES.len(), 4);
    for (route, _) in WRITE_ROUTES {
        let path = route.replace("{consumer}", "billing");
        let outbox_route = path.contains("/outbox/");
        let id = if outbox_route { format!("event_id={}", ids[0]) } else { "parked_id=1".to_owned() };
        let body = format!("csrf={token}&key=k1&confirm=yes&{id}&reason=gone");
        // With the read-only console's own CSRF token: refused for being read-only alone.
        let ro_body = body.replace(&token, &ro_token);
        let refused = request(ro, "POST", &path, &[("Sec-Fetch-Site", "same-origin")], &ro_body).await;
        assert_eq!(refused.status, 403, "{path} read-only: {}", refused.body);
        assert_eq!(refused.body, "this console is read-only: it changes nothing");
        for headers in [
            vec![("Sec-Fetch-Site", "cross-site")],
            vec![("Sec-Fetch-Site", "same-site")],
            vec![("Origin", "http://evil.example")],
            vec![("Origin", "null")],
        ] {
            let refused = request(addr, "POST", &path, &headers, &body).await;
            assert_eq!(refused.status, 403, "{path} with {headers:?}: {}", refused.body);
        }
        let no_csrf = body.replace(&token, "0");
        let refused = request(addr, "POST", &path, &[("Sec-Fetch-Site", "same-origin")], &no_csrf).await;
        assert_eq!(refused.status, 403, "{path} without its CSRF token");
        // A page of another site that rebinds its name to 127.0.0.1 sends its own Host.
        let host = [("Host", "attacker.example:80")];
        assert_eq!(request(addr, "POST", &path, &host, &body).await.status, 421);
    }
    assert_eq!(status_of(&pool, ids[0]).await, "failed", "nothing changed");
    let requested: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox_parked WHERE retry_requested_at IS NOT NULL OR status <> 'parked'",
    )
    .fetch_one(&pool)
    .await
    .expect("parked");
    assert_eq!(requested, 0, "nothing changed in the inbox");
    let audited: i64 =
        sqlx::query_scalar("SELECT (SELECT count(*) FROM outbox_audit) + (SELECT count(*) FROM inbox_audit)")
            .fetch_one(&pool)
            .await
            .expect("audit");
    assert_eq!(audited, 0);
    // The same request, same-origin and with its token, is carried out: the refusals above
    // were for the reason each tested. (`Origin: null` is what Chromium sends for a form of
    // a page whose referrer policy is `no-referrer`, as the console's are; `Sec-Fetch-Site`
    // decides.)
    let body = format!("csrf={token}&key=k1&confirm=yes&event_id={}", ids[0]);
    let same_origin = [("Sec-Fetch-Site", "same-origin"), ("Origin", "null")];
    let done = request(addr, "POST", "/actions/outbox/retry", &same_origin, &body).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(status_of(&pool, ids[0]).await, "pending");
    stop.cancel();
    ro_stop.cancel();
}

#[sqlx::test(migrations = false)]
async fn a_group_retry_shows_its_count_first_and_a_double_submit_acts_once(pool: PgPool) {
    let ids = seed(&pool).await;
    // A second failure of the same cause (numbers left out), in another aggregate.
    sqlx::query(
        "UPDATE outbox SET status = 'failed', last_error = 'Broker: Message size too large (1048577 bytes)' WHERE event_id = $1",
    )
    .bind(ids[2])
    .execute(&pool)
    .await
    .expect("fail b");
    sqlx::query(
        "UPDATE outbox SET last_error = 'Broker: Message size too large (2000000 bytes)' WHERE event_id = $1",
    )
    .bind(ids[0])
    .execute(&pool)
    .await
    .expect("same cause");
    let (addr, stop) = serve(&pool, ConsoleConfig::default().actor("alice")).await;
    let failures = get(addr, "/failures").await;
    assert_eq!(failures.status, 200);
    assert!(holds_escaped(&failures.body, "Broker: Message size too large (<n> bytes)"), "{}", failures.body);
    let token = csrf(&failures.body);
    let groups: serde_json::Value =
        serde_json::from_str(&get(addr, "/failures?format=json").await.body).expect("json");
    let cause = groups["outbox"][0]["cause"].as_str().expect("a cause").to_owned();
    let form = |extra: &str| {
        format!(
            "csrf={token}&key=the-form&topic=test&cause={}{extra}",
            cause
                .replace(' ', "+")
                .replace('(', "%28")
                .replace(')', "%29")
                .replace('<', "%3C")
                .replace('>', "%3E")
        )
    };
    let same = [("Sec-Fetch-Site", "same-origin"), ("Origin", "")];
    let dry = request(addr, "POST", "/actions/outbox/retry", &same[..1], &form("")).await;
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert!(dry.body.contains("would take <strong id=\"matched\">2</strong>"), "{}", dry.body);
    assert_eq!(status_of(&pool, ids[0]).await, "failed", "a dry run changes nothing");
    let done = request(addr, "POST", "/actions/outbox/retry", &same[..1], &form("&confirm=yes")).await;
    assert!(done.body.contains("changed <strong id=\"applied\">2</strong>"), "{}", done.body);
    assert_eq!(
        (status_of(&pool, ids[0]).await, status_of(&pool, ids[2]).await),
        ("pending".into(), "pending".into())
    );
    // The same form again (a double click, a reload): the first result, nothing done again.
    sqlx::query("UPDATE outbox SET status = 'failed' WHERE event_id = $1")
        .bind(ids[0])
        .execute(&pool)
        .await
        .expect("fails again");
    let again =
        request(addr, "POST", "/actions/outbox/retry", &same[..1], &form("&confirm=yes&format=json")).await;
    let again: serde_json::Value = serde_json::from_str(&again.body).expect("json");
    assert_eq!((again["repeated"].as_bool(), again["report"]["applied"].as_u64()), (Some(true), Some(2)));
    assert_eq!(status_of(&pool, ids[0]).await, "failed", "the repeated submit did not act");
    // One page's forms share their key (an event's retry and discard): another action sent
    // with it is its own, not the first one's result.
    let discard =
        format!("csrf={token}&key=the-form&confirm=yes&format=json&event_id={}&reason=gone", ids[0]);
    let other = request(addr, "POST", "/actions/outbox/discard", &same[..1], &discard).await;
    let other: serde_json::Value = serde_json::from_str(&other.body).expect("json");
    assert_eq!(
        (
            other["repeated"].as_bool(),
            other["report"]["action"].as_str(),
            other["report"]["applied"].as_u64()
        ),
        (Some(false), Some("discard"), Some(1)),
        "{other}"
    );
    assert_eq!(status_of(&pool, ids[0]).await, "discarded");
    let audit: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT actor, matched, applied FROM outbox_audit ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("audit");
    assert_eq!(
        audit,
        [("alice".to_owned(), 2, 2), ("alice".to_owned(), 1, 1)],
        "one row per action, none for the repeat"
    );
    let page = get(addr, "/audit?format=json").await;
    assert!(page.body.contains("\"actor\":\"alice\""), "{}", page.body);
    // A confirmed form needs its key; a discard needs its reason.
    let keyless = form("&confirm=yes").replace("key=the-form", "key=");
    assert_eq!(request(addr, "POST", "/actions/outbox/retry", &same[..1], &keyless).await.status, 400);
    let reasonless = format!("csrf={token}&key=k2&confirm=yes&event_id={}", ids[0]);
    assert_eq!(request(addr, "POST", "/actions/outbox/discard", &same[..1], &reasonless).await.status, 400);
    stop.cancel();
}

#[sqlx::test(migrations = false)]
async fn payloads_are_hidden_unless_allowed_then_redacted_exact_and_markup_stays_text(pool: PgPool) {
    let ids = seed(&pool).await;
    let hostile = "<script>alert(1)</script>";
    sqlx::query(
        "UPDATE outbox SET payload = '{\"card\": \"4111\", \"n\": 123456789012345678901234567890, \"note\": \"<script>alert(1)</script>\"}', \
                last_error = $2, headers = jsonb_build_object('x-note', $2::text) WHERE event_id = $1",
    )
    .bind(ids[0])
    .bind(hostile)
    .execute(&pool)
    .await
    .expect("payload");
    let (hidden, stop_hidden) = serve(&pool, ConsoleConfig::default()).await;
    let page = get(hidden, &format!("/events/{}", ids[0])).await;
    assert_eq!(page.status, 200);
    assert!(
        !page.body.contains("4111") && !page.body.contains("123456789012345678901234567890"),
        "hidden by default"
    );
    assert!(!page.body.contains(hostile) && holds_escaped(&page.body, hostile), "escaped: {}", page.body);
    let json = get(hidden, &format!("/events/{}?format=json", ids[0])).await.body;
    assert!(!json.contains("4111"), "hidden in JSON too");
    for (name, value) in [
        ("content-security-policy", "default-src 'none'; script-src 'self'"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ] {
        assert!(page.header(name).is_some_and(|v| v.starts_with(value)), "{name}: {:?}", page.header(name));
    }
    let shown = ConsoleConfig::default().show_payloads(true, 1024).redactor(redact_keys(["card"]));
    let (addr, stop) = serve(&pool, shown).await;
    let page = get(addr, &format!("/events/{}", ids[0])).await.body;
    assert!(page.contains("123456789012345678901234567890"), "big integers exact: {page}");
    assert!(holds_escaped(&page, "\"card\": \"[redacted]\""), "{page}");
    assert!(!page.contains("4111") && !page.contains(hostile), "{page}");
    let cut = ConsoleConfig::default().show_payloads(true, 10);
    let (small, stop_small) = serve(&pool, cut).await;
    let json: serde_json::Value =
        serde_json::from_str(&get(small, &format!("/events/{}?format=json", ids[0])).await.body)
            .expect("json");
    assert_eq!(
        (json["payload"]["truncated"].as_bool(), json["payload"]["text"].as_str().map(str::len)),
        (Some(true), Some(10))
    );
    stop.cancel();
    stop_hidden.cancel();
    stop_small.cancel();
}

#[sqlx::test(migrations = false)]
async fn no_answer_carries_a_secret(pool: PgPool) {
    let ids = seed_both(&pool).await;
    // The CLI's own console, given a database URL with a password and Kafka settings with
    // a SASL password in the environment: neither may reach a page.
    let url = database_url(&pool).replace("postgres://postgres@", "postgres://postgres:CANARY-DB-PASSWORD@")
        + "?application_name=console-under-test";
    let canaries = [
        ("KAFKA_BROKERS", "sasl://user:CANARY-KAFKA-PASSWORD@127.0.0.1:9092"),
        ("OUTBOX_KAFKA_SASL_PASSWORD", "CANARY-SASL"),
    ];
    let (child, _stdout, first) =
        cli_console(&url, &["--inbox-table", "inbox", "--count-cap", "100"], &canaries);
    let addr: SocketAddr =
        first.trim_start_matches("outbox console: http://").trim_end_matches('/').parse().expect(&first);
    let mut seen = 0;
    for path in [
        "/".to_owned(),
        "/?fragment=body".to_owned(),
        "/events".to_owned(),
        format!("/events/{}", ids[0]),
        "/failures".to_owned(),
        "/inbox/billing".to_owned(),
        "/inbox/billing/parked".to_owned(),
        "/inbox/billing/parked/1".to_owned(),
        "/audit".to_owned(),
        "/audit?consumer=billing".to_owned(),
        "/events?state=nonsense".to_owned(),
        "/nowhere".to_owned(),
    ] {
        for format in ["", "format=json"] {
            let sep = if path.contains('?') { '&' } else { '?' };
            let answer = get(addr, &format!("{path}{sep}{format}")).await;
            assert!(answer.status < 500, "{path}: {}", answer.status);
            assert!(
                !answer.body.contains("CANARY") && !answer.body.contains("PAYLOAD-MARKER"),
                "{path}: {}",
                answer.body
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 24);
    drop(child);
    left_alone(&pool).await;
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

/// Two identical sets of failed events, in topics `left` and `right`: per topic, three whose
/// reason says "boom" (numbers differing) and two of another reason; their ids by topic.
async fn twin_failures(pool: &PgPool) -> [Vec<Uuid>; 2] {
    let ids = append_pings(pool, &(0..10).map(|i| format!("agg-{i}")).collect::<Vec<_>>()).await;
    for (i, id) in ids.iter().enumerate() {
        let topic = if i < 5 { "left" } else { "right" };
        let reason = if i % 5 < 3 { format!("boom at offset {i}") } else { "something else".to_owned() };
        sqlx::query("UPDATE outbox SET status = 'failed', topic = $2, last_error = $3, failed_at = now() WHERE event_id = $1")
            .bind(id)
            .bind(topic)
            .bind(reason)
            .execute(pool)
            .await
            .expect("failed");
    }
    [ids[..5].to_vec(), ids[5..].to_vec()]
}

/// The states of `ids`, in order.
async fn states(pool: &PgPool, ids: &[Uuid]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        out.push(status_of(pool, *id).await);
    }
    out
}

#[sqlx::test(migrations = false)]
async fn the_console_acts_as_the_cli_does_on_the_same_rows(pool: PgPool) {
    let [left, right] = twin_failures(&pool).await;
    let (addr, stop) = serve(&pool, ConsoleConfig::default()).await;
    let token = csrf(&get(addr, "/failures").await.body);
    let same = [("Sec-Fetch-Site", "same-origin")];
    for (action, extra) in [("retry", ""), ("discard", "&reason=obsolete")] {
        // Retry takes the three "boom" events; discard then takes the two others.
        let filter = if action == "retry" { "boom" } else { "something" };
        let mut cli_args =
            vec!["failed", action, "--topic", "left", "--reason-contains", filter, "--yes", "--json"];
        if action == "discard" {
            cli_args.extend(["--reason", "obsolete"]);
        }
        let cli = outbox_cli(&pool, &cli_args);
        assert_eq!(cli.status.code(), Some(0), "{cli:?}");
        let cli: serde_json::Value = serde_json::from_str(&stdout(&cli)).expect("the CLI's JSON");
        let body = format!(
            "csrf={token}&key={action}-parity&confirm=yes&format=json&topic=right&reason_contains={filter}{extra}"
        );
        let console = request(addr, "POST", &format!("/actions/outbox/{action}"), &same, &body).await;
        assert_eq!(console.status, 200, "{}", console.body);
        let console: serde_json::Value = serde_json::from_str(&console.body).expect("the console's JSON");
        let report = &console["report"];
        for field in ["action", "dry_run", "matched", "applied", "skipped"] {
            assert_eq!(report[field], cli[field], "{action}: {field}: console {report}, CLI {cli}");
        }
        assert_eq!(report["first"].as_array().map(Vec::len), cli["first"].as_array().map(Vec::len));
        assert_eq!(states(&pool, &left).await, states(&pool, &right).await, "after {action}");
    }
    assert_eq!(states(&pool, &right).await, ["pending", "pending", "pending", "discarded", "discarded"]);
    let audit: Vec<(String, i64)> = sqlx::query_as("SELECT action, applied FROM outbox_audit ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("audit");
    assert_eq!(
        audit,
        [("retry".into(), 3), ("retry".into(), 3), ("discard".into(), 2), ("discard".into(), 2)]
    );
    stop.cancel();
}

#[sqlx::test(migrations = false)]
async fn the_console_acts_as_the_cli_does_on_an_inbox_too(pool: PgPool) {
    billing_inbox(&pool).await;
    // Twin sets of parked messages, one per topic: three "ledger closed" heads of their
    // keys (one with a message held behind it) and one of another reason.
    let mut rows = Vec::new();
    for (partition, key_prefix) in [(0, "l"), (1, "r")] {
        for i in 0..4_i64 {
            rows.push((
                partition,
                i,
                format!("{key_prefix}{i}"),
                if i < 3 { "ledger 7 closed" } else { "no handler" },
                "parked",
            ));
        }
        rows.push((partition, 4, format!("{key_prefix}0"), "held behind parked message", "held"));
    }
    let keys: Vec<String> = rows.iter().map(|r| r.2.clone()).collect();
    let parked: Vec<Parked<'_>> = rows
        .iter()
        .zip(&keys)
        .map(|(r, key)| Parked {
            partition: r.0,
            offset: r.1,
            key,
            event_type: "e",
            version: 1,
            status: r.4,
            reason: r.3,
        })
        .collect();
    park(&pool, &parked).await;
    sqlx::query("UPDATE inbox_parked SET topic = CASE kafka_partition WHEN 0 THEN 'left' ELSE 'right' END")
        .execute(&pool)
        .await
        .expect("topics");
    let (addr, stop) = serve(&pool, ConsoleConfig::default().inbox("public", "inbox")).await;
    let token = csrf(&get(addr, "/failures").await.body);
    let same = [("Sec-Fetch-Site", "same-origin")];
    let state = |topic: &'static str| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, bool)> = sqlx::query_as(
                "SELECT status, retry_requested_at IS NOT NULL FROM inbox_parked WHERE topic = $1 ORDER BY kafka_offset",
            )
            .bind(topic)
            .fetch_all(&pool)
            .await
            .expect("rows");
            rows
        }
    };
    for (action, filter) in [("retry", "ledger"), ("discard", "handler")] {
        let mut cli_args = vec![
            "inbox",
            "--consumer",
            "billing",
            action,
            "--topic",
            "left",
            "--reason-contains",
            filter,
            "--yes",
            "--json",
        ];
        if action == "discard" {
            cli_args.extend(["--reason", "obsolete"]);
        }
        let cli = outbox_cli(&pool, &cli_args);
        assert_eq!(cli.status.code(), Some(0), "{cli:?}");
        let cli: serde_json::Value = serde_json::from_str(&stdout(&cli)).expect("the CLI's JSON");
        let body = format!(
            "csrf={token}&key=inbox-{action}&confirm=yes&format=json&topic=right&reason_contains={filter}&reason=obsolete"
        );
        let console = request(addr, "POST", &format!("/actions/inbox/billing/{action}"), &same, &body).await;
        assert_eq!(console.status, 200, "{}", console.body);
        let console: serde_json::Value = serde_json::from_str(&console.body).expect("the console's JSON");
        let report = &console["report"];
        for field in ["action", "dry_run", "matched", "applied", "skipped"] {
            assert_eq!(report[field], cli[field], "{action}: {field}: console {report}, CLI {cli}");
        }
        assert_eq!(state("left").await, state("right").await, "after {action}");
    }
    let right = state("right").await;
    assert_eq!(right.iter().filter(|(_, requested)| *requested).count(), 3, "{right:?}");
    assert_eq!(right.iter().filter(|(status, _)| status == "discarded").count(), 1, "{right:?}");
    stop.cancel();
}
