//! The book (`docs/src`) states every default of `OutboxConfig`, `RelayConfig` and
//! `InboxConfig`, and states what the code does: each documented default is read back from
//! the configuration's getters and written the way the book writes it.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_runtime::inbox::InboxConfig;
use outbox_runtime::relay::RelayConfig;
use outbox_runtime::OutboxConfig;

/// `2000` as `2,000`.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration as the book writes it: `0`, `500 ms`, `30 s`, `5 min`, `7 days`.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms == 0 {
        "0".to_owned()
    } else if ms % 1000 != 0 {
        format!("{ms} ms")
    } else if s % 86_400 == 0 {
        format!("{} days", s / 86_400)
    } else if s % 60 == 0 && s >= 120 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

fn bytes(n: usize) -> String {
    if n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else {
        count(n as u64)
    }
}

/// The rows of the book's table whose header's first cell is `` `title` ``: setting to
/// its default cell.
fn table(readme: &str, title: &str) -> BTreeMap<String, String> {
    let header = format!("| `{title}` | default |");
    let start = readme.find(&header).unwrap_or_else(|| panic!("the book has no table {header}"));
    readme[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.trim_matches('`').to_owned();
            Some((name, (*cells.get(2)?).to_owned()))
        })
        .collect()
}

fn check(readme: &str, title: &str, expected: &[(&str, String)]) {
    let documented = table(readme, title);
    let mut wrong = Vec::new();
    for (name, value) in expected {
        match documented.get(*name) {
            Some(stated) if stated == value => {}
            Some(stated) => {
                wrong.push(format!("{title} {name}: the book says {stated:?}, the code {value:?}"))
            }
            None => {
                wrong.push(format!("{title} {name}: not in the book's table (the code's default: {value:?})"))
            }
        }
    }
    assert!(wrong.is_empty(), "the book and the code disagree:\n  {}", wrong.join("\n  "));
}

/// Every chapter of the book, one after the other (the settings tables live in the
/// chapters of the component they configure).
fn book() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src");
    let mut chapters: Vec<_> = std::fs::read_dir(dir)
        .expect("docs/src")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    chapters.sort();
    chapters.iter().map(|p| std::fs::read_to_string(p).expect("a chapter")).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_readme_states_the_outbox_defaults_the_code_has() {
    let c = OutboxConfig::default();
    check(
        &book(),
        "OutboxConfig",
        &[
            ("schema", format!("`{}`", c.get_schema())),
            ("table", format!("`{}`", c.get_table())),
            ("work_partitions", count(c.get_work_partitions().into())),
            ("max_record_bytes", count(c.get_max_record_bytes() as u64)),
            ("notify", c.get_notify().to_string()),
            ("lock_aggregates", c.get_lock_aggregates().to_string()),
            ("capacity", c.get_capacity().map_or("none".to_owned(), |c| format!("{c:?}"))),
            ("refuse_non_critical_at", c.get_refuse_non_critical_at().to_string()),
            ("capacity_check_interval", duration(c.get_capacity_check_interval())),
        ],
    );
}

#[test]
fn the_readme_states_the_relay_defaults_the_code_has() {
    let c = RelayConfig::new("b:9092");
    let (base, max) = c.get_backoff();
    let cleanup = c.get_cleanup().expect("cleanup is on by default");
    check(
        &book(),
        "RelayConfig",
        &[
            ("batch_size", count(c.get_batch_size().into())),
            ("poll_interval", duration(c.get_poll_interval())),
            ("lease_ttl", duration(c.get_lease_ttl())),
            ("message_timeout", duration(c.get_message_timeout())),
            ("backoff(base, max)", format!("{}, {}", duration(base), duration(max))),
            ("max_attempts", c.get_max_attempts().map_or("none".to_owned(), |n| n.to_string())),
            ("missing_topic_timeout", duration(c.get_missing_topic_timeout())),
            ("source", format!("`{}`", c.get_source())),
            ("dataschema_base", format!("`{}`", c.get_dataschema_base())),
            ("claim_mode", format!("`{:?}`", c.get_claim_mode())),
            (
                "cleanup",
                format!(
                    "{}, {} rows per batch, every {}",
                    duration(cleanup.get_retention()),
                    count(cleanup.get_batch_size().into()),
                    duration(cleanup.get_interval())
                ),
            ),
        ],
    );
}

#[cfg(feature = "cdc")]
#[test]
fn the_readme_states_the_cdc_defaults_the_code_has() {
    let c = outbox_runtime::cdc::CdcConfig::new("postgres://u@h/d");
    let mib = c.get_max_buffered_bytes() >> 20;
    assert_eq!(mib << 20, c.get_max_buffered_bytes(), "a whole number of MiB");
    check(
        &book(),
        "CdcConfig",
        &[
            ("slot", format!("`{}`", c.get_slot())),
            ("publication", format!("`{}`", c.get_publication())),
            ("max_buffered_bytes", format!("{mib} MiB")),
            ("takeover_interval", duration(c.get_takeover_interval())),
            ("status_interval", duration(c.get_status_interval())),
        ],
    );
}

#[test]
fn the_readme_states_the_inbox_defaults_the_code_has() {
    let c = InboxConfig::new("c", "b:9092", ["t"]);
    let (base, max) = c.get_backoff();
    check(
        &book(),
        "InboxConfig",
        &[
            ("schema` / `table", format!("`{}` / `{}`", c.get_schema(), c.get_table())),
            ("dedup_retention", c.get_dedup_retention().map_or("forever".to_owned(), duration)),
            ("replay_window", duration(c.get_replay_window())),
            ("refuse_short_retention", c.get_refuse_short_retention().to_string()),
            ("backoff(base, max)", format!("{}, {}", duration(base), duration(max))),
            ("max_attempts", count(c.get_max_attempts().into())),
            ("queue_per_partition", count(c.get_queue_per_partition() as u64)),
            ("batch_size", count(c.get_batch_size() as u64)),
            ("batch_wait", duration(c.get_batch_wait())),
            ("batch_timeout", duration(c.get_batch_timeout())),
            ("buffer_per_partition", bytes(c.get_buffer_per_partition())),
            ("commit_interval", duration(c.get_commit_interval())),
            ("operator_poll_interval", duration(c.get_operator_poll_interval())),
            ("shutdown_timeout", duration(c.get_shutdown_timeout())),
            ("cleanup_interval", duration(c.get_cleanup_interval())),
            ("cleanup_batch_size", count(c.get_cleanup_batch_size().into())),
        ],
    );
}

/// The helpers write what the book writes, so a disagreement is the book's or the
/// code's, not this test's.
#[test]
fn the_renderings_match_the_readmes_style() {
    assert_eq!(count(2000), "2,000");
    assert_eq!(count(1_000_000), "1,000,000");
    assert_eq!(count(32), "32");
    assert_eq!(duration(Duration::from_millis(500)), "500 ms");
    assert_eq!(duration(Duration::from_secs(60)), "60 s");
    assert_eq!(duration(Duration::from_secs(300)), "5 min");
    assert_eq!(duration(Duration::from_secs(7 * 86_400)), "7 days");
    assert_eq!(bytes(64 << 20), "64 MiB");
}
