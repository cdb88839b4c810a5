//! The operator console in a real browser: Debian's Chromium driven through its
//! chromedriver (`/usr/bin/chromedriver`, or `OUTBOX_CHROMEDRIVER`; `.ci/run` installs
//! both and runs this with `--ignored`; a browser download is never tried).
//!
//! An operator finds a failed event by its id, reads its reason, retries its whole failure
//! group after the dry-run count, and the relay publishes it (the records read back from
//! Kafka). A form on another origin that submits itself to the console is refused, and the
//! database is unchanged. `<script>` and an `onerror` attribute in a payload, a reason and a
//! header never run. No page logs a console error or a content security policy violation.
//! Every page is captured at 1440 and 375 px wide under `target/console-screenshots/`.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use outbox_runtime::console::{Console, ConsoleConfig};
use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use outbox_runtime::{AppendOptions, CancellationToken, NewEvent, Outbox, OutboxEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

/// Only this file uses the topic.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.console",
    schema_version = 1,
    aggregate = "parcel",
    topic = "outbox-test-console"
)]
struct Parcel {
    #[outbox(aggregate_id)]
    id: String,
    note: String,
}

/// Markup that would set `window.pwned` if it ever ran.
const HOSTILE: &str = "<script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\">";

/// Kills chromedriver and the browser it started (its process group) when the test ends,
/// however it ends: a failed test never reaches the session's close.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0.id())]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port()
}

/// chromedriver on a free port, and a headless Chromium session with its console log kept.
async fn browser() -> (Driver, Client) {
    let driver = std::env::var("OUTBOX_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".to_owned());
    let chromium = std::env::var("OUTBOX_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    assert!(
        std::path::Path::new(&driver).exists() && std::path::Path::new(&chromium).exists(),
        "{driver} and {chromium} are needed: apt-get install chromium chromium-driver (or set OUTBOX_CHROMEDRIVER and OUTBOX_CHROMIUM)"
    );
    let port = free_port();
    let child = Command::new(&driver)
        .arg(format!("--port={port}"))
        // Its own process group, so that the browser goes with it.
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver(child);
    let mut caps = Capabilities::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"binary": chromium, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]}),
    );
    caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if let Ok(client) =
            ClientBuilder::new(connector.clone()).capabilities(caps.clone()).connect(&url).await
        {
            return (driver, client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not take a session at {url} within 10 s");
}

/// Chromedriver's browser log since the last read (`/session/{id}/se/log`).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({"type": "browser"}).to_string()))
    }
}

/// A script run in every page this session opens from now on, before the page's own
/// (Chromium's `Page.addScriptToEvaluateOnNewDocument`, through chromedriver).
#[derive(Debug)]
struct BeforeEveryPage(&'static str);

impl WebDriverCompatibleCommand for BeforeEveryPage {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/goog/cdp/execute", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        let body = json!({"cmd": "Page.addScriptToEvaluateOnNewDocument", "params": {"source": self.0}});
        (http::Method::POST, Some(body.to_string()))
    }
}

/// The log entries of the pages seen since the last call.
async fn log_since(client: &Client) -> Vec<Value> {
    match client.issue_cmd(BrowserLog).await.expect("the browser log") {
        Value::Array(entries) => entries,
        other => panic!("the browser log is not a list: {other}"),
    }
}

/// `window.pwned`, which no markup from the data may set.
async fn pwned(client: &Client) -> Value {
    client.execute("return window.pwned === undefined ? null : window.pwned;", vec![]).await.expect("script")
}

fn shots_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// The page the browser shows, captured at both widths without leaving it (an action's
/// pages answer a POST: no URL to visit again), back at 1440 after.
async fn shoot(client: &Client, name: &str) {
    for width in [375, 1440] {
        client.set_window_size(width, 1000).await.expect("size");
        tokio::time::sleep(Duration::from_millis(200)).await;
        std::fs::write(
            shots_dir().join(format!("{name}-{width}.png")),
            client.screenshot().await.expect("shot"),
        )
        .expect("write shot");
    }
}

/// Visits `path`, checks it logged nothing and ran nothing, and captures it at both widths.
async fn visit(client: &Client, base: &str, path: &str, name: &str) -> String {
    let mut text = String::new();
    for width in [1440, 375] {
        client.set_window_size(width, 1000).await.expect("size");
        client.goto(&format!("{base}{path}")).await.expect("goto");
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(
            shots_dir().join(format!("{name}-{width}.png")),
            client.screenshot().await.expect("shot"),
        )
        .expect("write shot");
        text = client.find(Locator::Css("main")).await.expect("main").text().await.expect("text");
        assert_eq!(pwned(client).await, Value::Null, "{path}: markup from the data ran");
        let log = log_since(client).await;
        let bad: Vec<&Value> = log
            .iter()
            .filter(|e| {
                e["level"] == "SEVERE"
                    || e["message"].as_str().is_some_and(|m| m.contains("Content Security Policy"))
            })
            .collect();
        assert!(bad.is_empty(), "{path} at {width} px: console errors or CSP violations: {bad:?}");
    }
    text
}

/// The text of element `id` once the page that has it has loaded (within 10 s).
async fn appear(client: &Client, id: &str) -> String {
    let element = client.wait().at_most(Duration::from_secs(10)).for_element(Locator::Id(id)).await;
    let Ok(element) = element else {
        let url = client.current_url().await.map(|u| u.to_string()).unwrap_or_default();
        let source = client.source().await.unwrap_or_default();
        panic!("#{id} within 10 s, at {url}: {source}");
    };
    element.text().await.expect("text")
}

async fn status_of(pool: &PgPool, id: Uuid) -> String {
    sqlx::query_scalar("SELECT status FROM outbox WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("row")
}

#[sqlx::test(migrations = false)]
#[ignore = "needs Chromium and chromedriver: .ci/run installs them and runs it with --ignored"]
async fn an_operator_retries_a_failure_group_in_the_browser_and_the_relay_publishes_it(pool: PgPool) {
    let outbox: Outbox = migrate(&pool).await;
    let inbox =
        Inbox::new(pool.clone(), InboxConfig::new("billing", "127.0.0.1:1", ["orders"]), Handlers::new())
            .expect("inbox");
    inbox.migrator().run(&pool).await.expect("inbox tables");
    let kafka = Kafka::start();
    kafka.create_topic(Parcel::TOPIC, 2).await;
    let events: Vec<NewEvent> = (0..6)
        .map(|i| {
            let parcel = Parcel { id: format!("parcel-{i}"), note: format!("{HOSTILE} #{i}") };
            let options = AppendOptions::default().header("x-note", HOSTILE);
            NewEvent::new(&parcel, options).expect("event")
        })
        .collect();
    let ids: Vec<Uuid> = events.iter().map(NewEvent::event_id).collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
    // Three of one cause (numbers differ), one of another with markup in its reason; the
    // rest published already.
    for (i, reason) in [
        (0, format!("Broker: Message size too large (1048{}77 bytes)", 5)),
        (1, "Broker: Message size too large (2000000 bytes)".to_owned()),
        (2, "Broker: Message size too large (3 bytes)".to_owned()),
        (3, format!("handler refused: {HOSTILE}")),
    ] {
        sqlx::query("UPDATE outbox SET status = 'failed', attempts = 1, failed_at = now(), last_error = $2 WHERE event_id = $1")
            .bind(ids[i])
            .bind(reason)
            .execute(&pool)
            .await
            .expect("failed");
    }
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now() WHERE event_id = ANY($1)")
        .bind(&ids[4..])
        .execute(&pool)
        .await
        .expect("published");
    sqlx::query(
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, event_type, status, reason) \
         VALUES ('billing', 'orders', 0, 7, 'k', '{}', 'x', 'test.console', 'parked', $1)",
    )
    .bind(format!("no handler: {HOSTILE}"))
    .execute(&pool)
    .await
    .expect("parked");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("port");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let config = ConsoleConfig::default()
        .bind(addr)
        .inbox("public", "inbox")
        .show_payloads(true, 4096)
        .actor("browser-test");
    let console = Console::new(pool.clone(), &outbox, config).expect("console");
    let stop = CancellationToken::new();
    tokio::spawn(console.serve(listener, stop.clone()));
    let base = format!("http://{addr}");
    let (_driver, client) = browser().await;

    visit(&client, &base, "/", "overview").await;
    // The live overview: its stream says so, the button pauses it and resumes it.
    let live = |status: &'static str| {
        let client = client.clone();
        async move {
            let wait = client.wait().at_most(Duration::from_secs(15));
            wait.for_element(Locator::XPath(&format!("//span[@id='live-status' and text()='{status}']")))
                .await
        }
    };
    live("live").await.expect("the overview streams");
    let pause = client.find(Locator::Id("live-pause")).await.expect("the pause button");
    pause.click().await.expect("pause");
    live("paused").await.expect("paused");
    assert_eq!(pause.attr("aria-pressed").await.expect("attr").as_deref(), Some("true"));
    pause.click().await.expect("resume");
    live("live").await.expect("streams again");
    // Find the failed event by its id, from the search box of any page.
    client.goto(&format!("{base}/")).await.expect("home");
    client
        .find(Locator::Id("find-event"))
        .await
        .expect("search")
        .send_keys(&ids[1].to_string())
        .await
        .expect("type");
    client.find(Locator::Css("form.search button")).await.expect("find").click().await.expect("submit");
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_url(&url::Url::parse(&format!("{base}/events?event_id={}", ids[1])).expect("url"))
        .await
        .expect("the list");
    let list = client.find(Locator::Css("main")).await.expect("main").text().await.expect("text");
    assert!(list.contains(&ids[1].to_string()) && !list.contains(&ids[0].to_string()), "{list}");
    client.find(Locator::LinkText(&ids[1].to_string())).await.expect("its link").click().await.expect("open");
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("dl.facts"))
        .await
        .expect("its page");
    let detail = client.find(Locator::Css("main")).await.expect("main").text().await.expect("text");
    assert!(
        detail.contains("Broker: Message size too large (2000000 bytes)"),
        "its reason is shown: {detail}"
    );
    visit(&client, &base, "/events?state=failed", "events").await;
    let page = visit(&client, &base, &format!("/events/{}", ids[3]), "event").await;
    assert!(page.contains("<script>window.pwned=1</script>"), "markup shown as text: {page}");
    visit(&client, &base, "/inbox/billing", "inbox-applied").await;
    visit(&client, &base, "/inbox/billing/parked", "inbox-parked").await;
    visit(&client, &base, "/inbox/billing/parked/1", "inbox-parked-message").await;
    visit(&client, &base, "/audit", "audit").await;
    let failures = visit(&client, &base, "/failures", "failures").await;
    assert!(failures.contains("Broker: Message size too large (<n> bytes)"), "{failures}");

    // Retry the group: the dry run counts 3, the confirm retries exactly them.
    client.set_window_size(1440, 1000).await.expect("size");
    let group = client
        .find(Locator::XPath(
            "//article[contains(., 'Message size too large')]//button[contains(., 'Retry the group')]",
        ))
        .await
        .expect("the group's retry");
    group.click().await.expect("retry");
    let count = appear(&client, "matched").await;
    assert_eq!(count, "3");
    assert_eq!(status_of(&pool, ids[0]).await, "failed", "the dry run changed nothing");
    shoot(&client, "action-confirm").await;
    client.find(Locator::Id("confirm")).await.expect("confirm").click().await.expect("confirm");
    let applied = appear(&client, "applied").await;
    assert_eq!(applied, "3", "the page says what the database did");
    shoot(&client, "action-done").await;
    assert!(log_since(&client).await.iter().all(|e| e["level"] != "SEVERE"), "the action pages log no error");

    // The relay publishes the three; read back from Kafka.
    let relay = start(&pool, &outbox, quick(&kafka));
    let published = eventually(Duration::from_secs(60), || async {
        let mut n = 0;
        for id in &ids[..3] {
            n += usize::from(status_of(&pool, *id).await == "published");
        }
        n == 3
    })
    .await;
    assert!(published, "the relay published the retried group");
    relay.shutdown().await;
    let records = kafka.read_all(Parcel::TOPIC, Duration::from_secs(60));
    for id in &ids[..3] {
        assert!(
            records.iter().any(|r| r.headers.get("ce_id") == Some(&id.to_string())),
            "{id} read back from Kafka"
        );
    }
    assert_eq!(status_of(&pool, ids[3]).await, "failed", "the other cause's event was not swept in");

    // Replay one of them from its page: a dry run first, then published again, same id.
    client.goto(&format!("{base}/events/{}", ids[0])).await.expect("its page");
    client.find(Locator::Id("replay")).await.expect("the replay button").click().await.expect("replay");
    assert_eq!(appear(&client, "matched").await, "1");
    let counts = client.find(Locator::Id("replay-counts")).await.expect("counts").text().await.expect("text");
    assert!(counts.contains("1 published"), "{counts}");
    shoot(&client, "replay-confirm").await;
    assert_eq!(status_of(&pool, ids[0]).await, "published", "the dry run changed nothing");
    client.find(Locator::Id("confirm")).await.expect("confirm").click().await.expect("confirm");
    assert_eq!(appear(&client, "applied").await, "1");
    assert_eq!(status_of(&pool, ids[0]).await, "pending");
    let relay = start(&pool, &outbox, quick(&kafka));
    let again =
        eventually(Duration::from_secs(60), || async { status_of(&pool, ids[0]).await == "published" }).await;
    assert!(again, "the relay published the replayed event");
    relay.shutdown().await;
    let records = kafka.read_all(Parcel::TOPIC, Duration::from_secs(60));
    let copies = records.iter().filter(|r| r.headers.get("ce_id") == Some(&ids[0].to_string())).count();
    assert_eq!(copies, 2, "the replayed event read back twice, with its one id");

    // A page of another origin whose form submits itself to the console: refused.
    let evil = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("port");
    let evil_addr = evil.local_addr().expect("addr");
    let form = format!(
        "<!doctype html><form id=f method=post action=\"{base}/actions/outbox/discard\">\
         <input name=event_id value=\"{}\"><input name=reason value=x><input name=confirm value=yes>\
         <input name=key value=k><input name=csrf value=guess></form><script>document.getElementById('f').submit()</script>",
        ids[3]
    );
    let app =
        axum::Router::new().route("/", axum::routing::get(move || async move { axum::response::Html(form) }));
    tokio::spawn(async move { axum::serve(evil, app).await });
    client.goto(&format!("http://{evil_addr}/")).await.expect("evil page");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let answer = client.source().await.expect("source");
    assert!(answer.contains("from another site is refused"), "{answer}");
    assert_eq!(status_of(&pool, ids[3]).await, "failed", "the database is unchanged");
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_audit").fetch_one(&pool).await.expect("audit");
    assert_eq!(audited, 2, "two actions: the operator's retry and replay");
    // A browser without EventSource: the overview polls, and shows a change within a poll.
    client.issue_cmd(BeforeEveryPage("delete window.EventSource;")).await.expect("no EventSource");
    client.goto(&format!("{base}/")).await.expect("overview");
    let failed_count = |n: &'static str| {
        let client = client.clone();
        async move {
            let cell = format!("//tr[td/a[text()='failed']]/td[2][normalize-space()='{n}']");
            client.wait().at_most(Duration::from_secs(15)).for_element(Locator::XPath(&cell)).await
        }
    };
    failed_count("1").await.expect("one failed event left");
    sqlx::query("UPDATE outbox SET status = 'failed', last_error = 'late' WHERE event_id = $1")
        .bind(ids[4])
        .execute(&pool)
        .await
        .expect("another failure");
    failed_count("2").await.expect("the polled overview shows the new failure");
    let status = client.find(Locator::Id("live-status")).await.expect("status").text().await.expect("text");
    assert_eq!(status, "polling every 5 s");
    client.close().await.expect("close");
    stop.cancel();
    eprintln!("console screenshots: {}", shots_dir().display());
}
