//! How results are shown: JSON for scripts, text for people.

use outbox_runtime::inbox::ParkedMessage;
use outbox_runtime::ops::{ActionReport, FailedEvent, Reconciliation, ReplayReport, Retrying, Status};
use serde::Serialize;
use tabled::builder::Builder;
use tabled::settings::object::Columns;
use tabled::settings::{Alignment, Padding, Style};

/// Prints a table (see [`layout`]).
fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>, right: &[usize]) {
    print!("{}", layout(header, rows, right));
}

/// A table: a header and rows, columns as wide as their widest cell (by display width),
/// two spaces apart, the columns in `right` aligned right (numbers).
fn layout(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>, right: &[usize]) -> String {
    let mut builder = Builder::default();
    builder.push_record(header.iter().copied());
    for row in rows {
        builder.push_record(row);
    }
    let mut table = builder.build();
    table.with(Style::empty()).with(Padding::new(0, 2, 0, 0));
    for &column in right {
        table.modify(Columns::one(column), Alignment::right());
    }
    table.to_string().lines().map(|line| line.trim_end().to_owned() + "\n").collect()
}

pub(crate) fn json(value: &impl Serialize) {
    println!("{}", serde_json::to_string(value).unwrap_or_default());
}

pub(crate) fn status(status: &Status) {
    let oldest = status.oldest_unpublished_age_seconds.map_or("-".to_owned(), |s| format!("{s:.1} s"));
    println!("pending             {:>12}", status.pending);
    println!("  of which retrying {:>12}", status.retrying);
    println!("failed              {:>12}", status.failed);
    println!("published           {:>12}", status.published);
    println!("discarded           {:>12}", status.discarded);
    println!("oldest unpublished  {oldest:>12}");
    println!(
        "appended rate       {:>10.2}/s  (last {:.0} s)",
        status.appended_per_second, status.window_seconds
    );
    println!("published rate      {:>10.2}/s", status.published_per_second);
    println!("table size          {:>12}", format!("{} kB", status.table_bytes / 1024));
    println!("dead tuples         {:>12}", status.dead_tuples);
    if let Some(c) = &status.capacity {
        let full = match c.seconds_to_full {
            None => "not growing".to_owned(),
            Some(s) if s <= 0.0 => "FULL".to_owned(),
            Some(s) => format!("{s:.0} s"),
        };
        println!(
            "capacity            {:>11.1}%  ({} of {} {}; non-critical refused from {:.0}%)",
            c.used_ratio * 100.0,
            c.used,
            c.limit,
            c.unit,
            c.refuse_non_critical_at * 100.0
        );
        println!("full in             {full:>12}  (growing {:.2} {}/s)", c.growth_per_second, c.unit);
    }
}

/// Failed events, with what each holds back.
pub(crate) fn failed(failed: &[FailedEvent]) {
    if failed.is_empty() {
        println!("no failed events");
        return;
    }
    let rows = failed.iter().map(|f| {
        vec![
            f.event_id.to_string(),
            f.event_type.clone(),
            format!("{}/{}", f.aggregate_type, f.aggregate_id),
            f.attempts.to_string(),
            f.held_back.to_string(),
            f.last_error.clone().unwrap_or_default(),
        ]
    });
    table(&["event_id", "type", "aggregate", "attempts", "held back", "reason"], rows, &[3, 4]);
}

/// Events waiting for a retry, and how many in all.
pub(crate) fn retrying(retrying: &Retrying) {
    if retrying.total == 0 {
        println!("no events waiting for a retry");
        return;
    }
    let rows = retrying.events.iter().map(|r| {
        let next = if r.next_attempt_in_seconds <= 0.0 {
            "due".to_owned()
        } else {
            format!("in {:.1}s", r.next_attempt_in_seconds)
        };
        vec![
            r.event_id.to_string(),
            r.event_type.clone(),
            format!("{}/{}", r.aggregate_type, r.aggregate_id),
            r.topic.clone(),
            r.attempts.to_string(),
            next,
            r.last_error.clone().unwrap_or_default(),
        ]
    });
    table(
        &["event_id", "type", "aggregate", "topic", "attempts", "next attempt", "last error"],
        rows,
        &[4, 5],
    );
    if retrying.total > retrying.events.len() as i64 {
        println!("{} of {} shown (--limit)", retrying.events.len(), retrying.total);
    }
}

/// What a replay matched and did.
pub(crate) fn replay(report: &ReplayReport, dry_run: bool) {
    let bound = if report.cleaned_up_exact { "" } else { "at most " };
    println!(
        "{} matched: {} published, {} not yet published, {} discarded; {bound}{} published already cleaned up, cannot be replayed",
        report.matched, report.replayable, report.not_yet_published, report.discarded, report.cleaned_up
    );
    if dry_run {
        println!("dry run: {} would be published again; nothing changed", report.replayable);
    } else {
        let audit = report.audit_id.map(|id| format!(" (audit #{id})")).unwrap_or_default();
        println!("{} put back up for publication with their original event ids{audit}", report.replayed);
    }
}

/// An action by filter: what matched (and its first ids), then what the database says was
/// done (or, for `--dry-run`, that nothing was).
pub(crate) fn action(report: &ActionReport, noun: &str, asked_dry_run: bool) {
    let more = if report.matched > report.first.len() as u64 { ", ..." } else { "" };
    let first =
        if report.first.is_empty() { String::new() } else { format!(": {}{more}", report.first.join(", ")) };
    println!("{} {noun} matched{first}", report.matched);
    if report.dry_run {
        if asked_dry_run {
            println!("dry run: nothing changed");
        }
        return;
    }
    let done = if report.action == "discard" { "discarded" } else { "retried" };
    let done = if report.action == "retry" && noun.starts_with("parked") { "retry requested" } else { done };
    println!(
        "{done}: {}; skipped: {} (no longer in the state matched){}",
        report.applied,
        report.skipped,
        report.audit_id.map_or(String::new(), |id| format!("; audit row {id}"))
    );
}

/// Counts per event type and hour, then the events published but not applied.
pub(crate) fn reconciliation(result: &Reconciliation) {
    let dash = |v: Option<i64>| v.map_or("-".to_owned(), |v| v.to_string());
    let rows = result.rows.iter().map(|r| {
        vec![
            r.hour.to_string(),
            r.event_type.clone(),
            r.appended.to_string(),
            r.published.to_string(),
            r.unpublished.to_string(),
            r.discarded.to_string(),
            r.cleaned_up.to_string(),
            dash(r.applied),
            dash(r.stale),
            dash(r.consumer_discarded),
            dash(r.not_applied),
        ]
    });
    let header = [
        "hour (UTC)",
        "type",
        "appended",
        "published",
        "unpublished",
        "discarded",
        "cleaned up",
        "applied",
        "stale",
        "c-discarded",
        "not applied",
    ];
    table(&header, rows, &[2, 3, 4, 5, 6, 7, 8, 9, 10]);
    for r in &result.rows {
        for id in &r.not_applied_ids {
            println!("not applied: {id} ({}, {})", r.event_type, r.hour);
        }
    }
    for event_type in &result.not_consumed {
        println!("{event_type}: none of its events is in the inbox; taken as not consumed (require it with --event-type)");
    }
    if result.rows.iter().any(|r| r.not_applied.unwrap_or(0) > 0) {
        let moment =
            if result.one_snapshot { "read at one moment" } else { "the inbox read just after the outbox" };
        println!(
            "{moment}: events published a moment before show as not applied until the consumer applies them; \
             set --until a little in the past to leave them out"
        );
    }
    if result.differences == 0 {
        println!("no differences");
    } else {
        println!("{} row(s) with differences", result.differences);
    }
}

/// A parked message as `inbox parked --json` shows it: never its payload.
#[derive(Serialize)]
pub(crate) struct ShownParked<'a> {
    id: i64,
    status: &'a str,
    reason: &'a str,
    topic: &'a str,
    partition: i32,
    offset: i64,
    event_type: Option<&'a str>,
    retry_requested: bool,
}

pub(crate) fn parked_for_json(parked: &[ParkedMessage]) -> Vec<ShownParked<'_>> {
    parked
        .iter()
        .map(|p| ShownParked {
            id: p.id,
            status: &p.status,
            reason: &p.reason,
            topic: &p.topic,
            partition: p.kafka_partition,
            offset: p.kafka_offset,
            event_type: p.event_type.as_deref(),
            retry_requested: p.retry_requested,
        })
        .collect()
}

/// A consumer's parked and held messages with their reasons.
pub(crate) fn parked(parked: &[ParkedMessage], consumer: &str) {
    if parked.is_empty() {
        println!("no parked messages for consumer {consumer}");
        return;
    }
    let rows = parked.iter().map(|p| {
        let retry = if p.retry_requested { " (retry requested)" } else { "" };
        vec![
            p.id.to_string(),
            p.status.clone(),
            format!("{}/{}@{}", p.topic, p.kafka_partition, p.kafka_offset),
            p.event_type.clone().unwrap_or_default(),
            format!("{}{retry}", p.reason),
        ]
    });
    table(&["id", "status", "topic/partition@offset", "type", "reason"], rows, &[0]);
}

#[cfg(test)]
mod tests {
    /// Columns line up by display width whatever a cell holds (a long aggregate id, a wide
    /// character), numbers to the right; before, fixed widths of 24 characters let a long
    /// value shift the rest of its row.
    #[test]
    fn columns_line_up_whatever_the_cells_hold() {
        let rows = vec![
            vec!["order/ä-1".to_owned(), "3".to_owned(), "broker down".to_owned()],
            vec!["order/".to_owned() + &"x".repeat(40), "12".to_owned(), "注文 timed out".to_owned()],
        ];
        let text = super::layout(&["aggregate", "attempts", "reason"], rows, &[1]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let reason_at: Vec<usize> = lines
            .iter()
            .map(|l| l.find("reason").or_else(|| l.find("broker")).or_else(|| l.find('注')).unwrap())
            .collect();
        // Byte offsets differ by the two-byte 'ä' only; display columns are equal.
        assert_eq!(reason_at[0], reason_at[2], "{text}");
        assert_eq!(reason_at[0] + 1, reason_at[1], "{text}");
        assert!(lines[1].contains("         3  "), "attempts right-aligned: {text}");
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "no trailing spaces: {text}");
    }
}
