//! What became of each appended event, judged from the outbox row, each inbox's rows and
//! its committed offsets: done (and how), still waiting (and on what), or a problem that
//! no amount of waiting fixes. Pure: the harness reads the tables, this decides.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use uuid::Uuid;

use super::Settled;

/// One outbox row, as the harness reads it.
#[derive(Debug, Clone)]
pub(super) struct EventRow {
    pub(super) event_id: Uuid,
    pub(super) event_type: String,
    pub(super) schema_version: i32,
    pub(super) aggregate_id: String,
    pub(super) topic: String,
    pub(super) status: String,
    pub(super) attempts: i32,
    pub(super) last_error: Option<String>,
    pub(super) partition: Option<i32>,
    pub(super) offset: Option<i64>,
}

impl fmt::Display for EventRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "event {} ({} v{}, aggregate {}, topic {}",
            self.event_id, self.event_type, self.schema_version, self.aggregate_id, self.topic
        )?;
        if let (Some(p), Some(o)) = (self.partition, self.offset) {
            write!(f, "[{p}]@{o}")?;
        }
        write!(f, ")")
    }
}

impl EventRow {
    /// Its Kafka placement, when the relay recorded one.
    fn placement(&self) -> Option<(i32, i64)> {
        match (self.partition, self.offset) {
            (Some(p), Some(o)) if o >= 0 => Some((p, o)),
            _ => None,
        }
    }
}

/// An open (parked or held) row of an inbox's parked table.
#[derive(Debug, Clone)]
pub(super) struct OpenParked {
    pub(super) id: i64,
    pub(super) event_id: Option<Uuid>,
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) status: String,
    pub(super) reason: String,
    /// An operator asked for a retry the consumer has not carried out yet.
    pub(super) retry_requested: bool,
    /// Its key (topic and record key, hashed): what holds it back.
    pub(super) hold_key: Option<Vec<u8>>,
}

/// What one inbox under test has recorded about the events.
#[derive(Debug, Default)]
pub(super) struct InboxView {
    pub(super) consumer: String,
    pub(super) topics: BTreeSet<String>,
    /// `(event_type, schema_version)` pairs its handlers ignore on purpose.
    pub(super) ignored: BTreeSet<(String, i32)>,
    /// `outcome` of its inbox row, by event id (`applied`, `stale`, `discarded`).
    pub(super) outcomes: HashMap<Uuid, String>,
    pub(super) open: Vec<OpenParked>,
    /// Committed offset (the next to read) by topic and partition.
    pub(super) committed: BTreeMap<(String, i32), i64>,
}

impl InboxView {
    fn reads(&self, topic: &str) -> bool {
        self.topics.contains(topic)
    }

    fn open_for(&self, event: &EventRow) -> Option<&OpenParked> {
        self.open.iter().find(|p| {
            p.event_id == Some(event.event_id)
                || (p.topic == event.topic && Some((p.partition, p.offset)) == event.placement())
        })
    }

    /// Whether the inbox's committed offset is past the event's record.
    fn committed_past(&self, event: &EventRow) -> Option<bool> {
        let (partition, offset) = event.placement()?;
        let committed = self.committed.get(&(event.topic.clone(), partition)).copied().unwrap_or(-1);
        Some(committed > offset)
    }

    fn committed_text(&self, event: &EventRow) -> String {
        match event.partition.and_then(|p| self.committed.get(&(event.topic.clone(), p))) {
            Some(offset) => format!("its committed offset there is {offset}"),
            None => "it has committed no offset there".to_owned(),
        }
    }
}

/// What became of one event.
#[derive(Debug)]
pub(super) enum State {
    /// Done; what it counts for.
    Done(Settled),
    /// May come right with time: why it is not done yet.
    Waiting(String),
    /// Will not come right by waiting: a false pass if ignored.
    Problem(String),
}

/// The verdict over every event.
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct Verdict {
    pub(super) settled: Settled,
    pub(super) waiting: Vec<String>,
    pub(super) problems: Vec<String>,
}

impl Settled {
    pub(super) fn add(&mut self, other: &Settled) {
        self.published += other.published;
        self.discarded += other.discarded;
        self.unconsumed += other.unconsumed;
        self.consumed += other.consumed;
        self.applied += other.applied;
        self.ignored += other.ignored;
        self.discarded_by_inbox += other.discarded_by_inbox;
    }
}

/// Judges every event (see [`judge_event`]) and sums up.
#[cfg(test)]
pub(super) fn judge(events: &[EventRow], inboxes: &[InboxView], unconsumed: &BTreeSet<String>) -> Verdict {
    let mut verdict = Verdict::default();
    for event in events {
        match judge_event(event, inboxes, unconsumed) {
            State::Done(counts) => verdict.settled.add(&counts),
            State::Waiting(why) => verdict.waiting.push(why),
            State::Problem(why) => verdict.problems.push(why),
        }
    }
    verdict
}

/// Judges one event against every inbox that reads its topic. `unconsumed` are the topics
/// the test declared that no inbox under test reads.
pub(super) fn judge_event(event: &EventRow, inboxes: &[InboxView], unconsumed: &BTreeSet<String>) -> State {
    let mut counts = Settled::default();
    if event.status == "discarded" {
        counts.discarded = 1;
        return State::Done(counts);
    }
    if event.status == "failed" {
        return State::Problem(format!(
            "{event} failed at the relay after {} attempt(s): {}",
            event.attempts,
            event.last_error.as_deref().unwrap_or("no error recorded")
        ));
    }
    let readers: Vec<&InboxView> = inboxes.iter().filter(|inbox| inbox.reads(&event.topic)).collect();
    if readers.is_empty() && !unconsumed.contains(&event.topic) {
        return State::Problem(format!(
            "{event} goes to topic {}, which no inbox under test reads ({}); subscribe the inbox to it, \
             or declare it with HarnessBuilder::unconsumed_topic({:?})",
            event.topic,
            describe_readers(inboxes),
            event.topic
        ));
    }
    if event.status != "published" {
        let why = match (&event.last_error, event.attempts) {
            (Some(error), _) => format!("last error: {error}"),
            (None, 0) => "not yet sent".to_owned(),
            (None, n) => format!("{n} attempt(s), no error recorded"),
        };
        return State::Waiting(format!("{event} not yet published ({why})"));
    }
    counts.published = 1;
    if readers.is_empty() {
        counts.unconsumed = 1;
        return State::Done(counts);
    }
    let (mut waiting, mut problems) = (Vec::new(), Vec::new());
    for inbox in readers {
        match judge_one(event, inbox) {
            State::Done(one) => counts.add(&one),
            State::Waiting(why) => waiting.push(why),
            State::Problem(why) => problems.push(why),
        }
    }
    if !problems.is_empty() {
        State::Problem(problems.join("; "))
    } else if !waiting.is_empty() {
        State::Waiting(waiting.join("; "))
    } else {
        State::Done(counts)
    }
}

fn describe_readers(inboxes: &[InboxView]) -> String {
    if inboxes.is_empty() {
        return "the harness has no inbox".to_owned();
    }
    let each: Vec<String> = inboxes
        .iter()
        .map(|inbox| {
            let topics: Vec<&str> = inbox.topics.iter().map(String::as_str).collect();
            format!("inbox `{}` reads {}", inbox.consumer, topics.join(", "))
        })
        .collect();
    each.join("; ")
}

/// One published event in one inbox that reads its topic.
fn judge_one(event: &EventRow, inbox: &InboxView) -> State {
    let consumer = &inbox.consumer;
    let mut counts = Settled::default();
    if let Some(open) = inbox.open_for(event) {
        let what = format!(
            "{event} was {} by inbox `{consumer}` as parked message {} ({}[{}]@{}): {}",
            open.status, open.id, open.topic, open.partition, open.offset, open.reason
        );
        // An operator's retry is on its way, for it or for the first open message of its
        // key (the consumer then releases the ones behind it, one transaction each): the
        // consumer carries it out within its operator_poll_interval.
        let head = inbox
            .open
            .iter()
            .filter(|p| p.hold_key.is_some() && p.hold_key == open.hold_key)
            .min_by_key(|p| p.id);
        let released = open.status == "held" && head.is_none_or(|h| h.id == open.id || h.retry_requested);
        return if open.retry_requested || released {
            State::Waiting(format!("{what}; a retry is requested"))
        } else {
            State::Problem(what)
        };
    }
    // `None`: the relay recorded no offset for it, so its outcome row alone says it is done.
    let committed = inbox.committed_past(event);
    match inbox.outcomes.get(&event.event_id).map(String::as_str) {
        Some("stale") => State::Problem(format!(
            "{event} was absorbed as stale by inbox `{consumer}`, not applied: its aggregate_version is not \
             newer than the last one it applied for aggregate {}",
            event.aggregate_id
        )),
        Some(outcome) if committed != Some(false) => {
            counts.consumed = 1;
            if outcome == "discarded" {
                counts.discarded_by_inbox = 1;
            } else {
                counts.applied = 1;
            }
            State::Done(counts)
        }
        Some(_) => State::Waiting(format!(
            "{event} applied by inbox `{consumer}`, its offset not yet committed ({})",
            inbox.committed_text(event)
        )),
        None if committed == Some(true) => {
            if inbox.ignored.contains(&(event.event_type.clone(), event.schema_version)) {
                counts.consumed = 1;
                counts.ignored = 1;
                State::Done(counts)
            } else {
                State::Problem(format!(
                    "{event} was passed over by inbox `{consumer}` without an outcome: {}, past the record, \
                     and it has no inbox or parked row of it (a consumer group shared with another \
                     consumer, or auto.offset.reset=latest?)",
                    inbox.committed_text(event)
                ))
            }
        }
        None if committed.is_none() => State::Waiting(format!(
            "{event} has no Kafka offset recorded, so whether inbox `{consumer}` passed it cannot be told; \
             it has no inbox or parked row of it yet"
        )),
        None => State::Waiting(format!(
            "{event} published, not yet consumed by inbox `{consumer}` ({})",
            inbox.committed_text(event)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u128, topic: &str, status: &str, offset: Option<i64>) -> EventRow {
        EventRow {
            event_id: Uuid::from_u128(n),
            event_type: "invoice.issued".into(),
            schema_version: 2,
            aggregate_id: "inv-1".into(),
            topic: topic.into(),
            status: status.into(),
            attempts: 0,
            last_error: None,
            partition: offset.map(|_| 0),
            offset,
        }
    }

    fn inbox(topics: &[&str]) -> InboxView {
        InboxView {
            consumer: "billing".into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            ..InboxView::default()
        }
    }

    #[test]
    fn nothing_is_done_that_no_inbox_gave_an_outcome() {
        let events = [event(1, "invoices", "published", Some(0))];
        let mut view = inbox(&["invoices"]);
        // Published, committed past, no row, not ignored: passed over, not "consumed".
        view.committed.insert(("invoices".into(), 0), 1);
        let verdict = judge(&events, &[view], &BTreeSet::new());
        assert_eq!(verdict.settled.consumed, 0);
        assert!(verdict.problems[0].contains("passed over by inbox `billing`"), "{verdict:?}");

        // Ignored on purpose: consumed, as ignored.
        let mut view = inbox(&["invoices"]);
        view.committed.insert(("invoices".into(), 0), 1);
        view.ignored.insert(("invoice.issued".into(), 2));
        let verdict = judge(&events, &[view], &BTreeSet::new());
        assert!(verdict.problems.is_empty() && verdict.waiting.is_empty(), "{verdict:?}");
        assert_eq!((verdict.settled.consumed, verdict.settled.ignored), (1, 1));

        // Applied but the offset not yet committed: waiting, not done.
        let mut view = inbox(&["invoices"]);
        view.outcomes.insert(Uuid::from_u128(1), "applied".into());
        let verdict = judge(&events, &[view], &BTreeSet::new());
        assert_eq!(verdict.settled.consumed, 0);
        assert!(verdict.waiting[0].contains("offset not yet committed"), "{verdict:?}");
    }

    #[test]
    fn a_topic_nobody_reads_is_a_problem_unless_declared() {
        let events = [event(1, "invoices", "pending", None)];
        let verdict = judge(&events, &[inbox(&["invoice"])], &BTreeSet::new());
        assert!(
            verdict.problems[0].contains("which no inbox under test reads (inbox `billing` reads invoice)")
        );
        let declared = BTreeSet::from(["invoices".to_owned()]);
        let verdict = judge(&[event(1, "invoices", "published", Some(3))], &[], &declared);
        assert!(verdict.problems.is_empty(), "{verdict:?}");
        assert_eq!((verdict.settled.published, verdict.settled.unconsumed), (1, 1));
    }

    #[test]
    fn parked_held_stale_and_failed_are_problems_naming_the_event() {
        let mut failed = event(1, "invoices", "failed", None);
        failed.attempts = 3;
        failed.last_error = Some("Broker: Message size too large".into());
        let events =
            [failed, event(2, "invoices", "published", Some(5)), event(3, "invoices", "published", Some(6))];
        let mut view = inbox(&["invoices"]);
        view.open.push(OpenParked {
            id: 7,
            event_id: None,
            topic: "invoices".into(),
            partition: 0,
            offset: 5,
            status: "parked".into(),
            reason: "no handler".into(),
            retry_requested: false,
            hold_key: Some(b"k".to_vec()),
        });
        view.outcomes.insert(Uuid::from_u128(3), "stale".into());
        let verdict = judge(&events, &[view], &BTreeSet::new());
        let all = verdict.problems.join("\n");
        assert!(all.contains("00000000-0000-0000-0000-000000000001 (invoice.issued v2, aggregate inv-1, topic invoices) failed at the relay after 3 attempt(s): Broker: Message size too large"), "{all}");
        assert!(all.contains("invoices[0]@5) was parked by inbox `billing` as parked message 7 (invoices[0]@5): no handler"), "{all}");
        assert!(all.contains("absorbed as stale"), "{all}");
        assert_eq!(verdict.problems.len(), 3);
    }

    /// A parked record with an operator's retry requested is on its way, not a failure;
    /// an applied event whose offset the relay did not record is done by its row alone.
    #[test]
    fn a_requested_retry_waits_and_an_unplaced_applied_event_is_done() {
        let mut view = inbox(&["invoices"]);
        view.open.push(OpenParked {
            id: 3,
            event_id: Some(Uuid::from_u128(1)),
            topic: "invoices".into(),
            partition: 0,
            offset: 0,
            status: "parked".into(),
            reason: "handler failed".into(),
            retry_requested: true,
            hold_key: Some(b"k".to_vec()),
        });
        // A message held behind it waits too: the release reaches it next.
        view.open.push(OpenParked {
            id: 4,
            event_id: Some(Uuid::from_u128(2)),
            topic: "invoices".into(),
            partition: 0,
            offset: 1,
            status: "held".into(),
            reason: "held behind parked message 3".into(),
            retry_requested: false,
            hold_key: Some(b"k".to_vec()),
        });
        let events = [event(1, "invoices", "published", Some(0)), event(2, "invoices", "published", Some(1))];
        let verdict = judge(&events, &[view], &BTreeSet::new());
        assert!(verdict.problems.is_empty(), "{verdict:?}");
        assert!(verdict.waiting[0].ends_with("a retry is requested"), "{verdict:?}");
        assert!(verdict.waiting[1].contains("was held by inbox"), "{verdict:?}");

        let mut view = inbox(&["invoices"]);
        view.outcomes.insert(Uuid::from_u128(1), "applied".into());
        let mut unplaced = event(1, "invoices", "published", Some(-1));
        unplaced.partition = Some(0);
        let verdict = judge(&[unplaced], &[view], &BTreeSet::new());
        assert!(verdict.waiting.is_empty() && verdict.problems.is_empty(), "{verdict:?}");
        assert_eq!(verdict.settled.applied, 1);
    }

    /// Only what `Handlers` really ignores counts as ignored: a typed handler for a version
    /// wins over `ignore` of its type.
    #[test]
    fn a_typed_handler_wins_over_ignore() {
        struct H;
        impl crate::inbox::RawHandler for H {
            async fn handle(
                &self,
                _: &mut sqlx::PgConnection,
                _: &[u8],
                _: &crate::inbox::Meta,
            ) -> Result<(), crate::inbox::HandlerError> {
                Ok(())
            }
        }
        let handlers = crate::inbox::Handlers::new().ignore("invoice.issued");
        assert!(handlers.ignores("invoice.issued", 2));
        assert!(!handlers.ignores("invoice.paid", 1));
        struct T;
        impl crate::inbox::EventHandler<serde_json::Value> for T {
            async fn handle(
                &self,
                _: &mut sqlx::PgConnection,
                _: serde_json::Value,
                _: &crate::inbox::Meta,
            ) -> Result<(), crate::inbox::HandlerError> {
                Ok(())
            }
        }
        let typed = handlers.clone().on_type::<serde_json::Value, _>("invoice.issued", 2, T);
        assert!(!typed.ignores("invoice.issued", 2), "v2 has a handler: not ignored");
        assert!(typed.ignores("invoice.issued", 1), "other versions are");
        let handlers = handlers.fallback(H);
        assert!(handlers.ignores("invoice.issued", 2), "ignore comes before the fallback");
        assert!(!handlers.ignores("invoice.paid", 1), "the fallback takes the rest");
    }
}
