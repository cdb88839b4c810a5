//! Safe defaults, the guard on every write, the dry run, the double submit, payloads and secrets.

use outbox_runtime::console::{redact_keys, WRITE_ROUTES};
use outbox_runtime::Error;

use super::common::database_url;
use super::*;

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
    assert_eq!(WRITE_ROUTES.len(), 5);
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
    // KAFKA_BROKERS is the console's --brokers: the lag read fails (no broker there), and
    // neither its error on the page nor the process's log carries the password.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let overview = loop {
        let body = get(addr, "/?format=json").await.body;
        let overview: serde_json::Value = serde_json::from_str(&body).expect("json");
        if !overview["consumers"][0]["lag"]["read_at"].is_null() || std::time::Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(overview.contains("\"error\":\""), "the lag read failed and says why: {overview}");
    assert!(!overview.contains("CANARY"), "{overview}");
    let page = get(addr, "/").await.body;
    assert!(page.contains("unknown") && !page.contains("CANARY"), "{page}");
    let log = child.stop();
    assert!(log.contains("cannot read the consumer's lag") && !log.contains("CANARY"), "{log}");
    left_alone(&pool).await;
}
