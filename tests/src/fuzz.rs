//! An adversarial run of the inbox: a seeded generator of records nobody planned for
//! (random bytes in keys, values, header names and values; valid and broken CloudEvents;
//! empty, null and huge values; NUL inside JSON strings; duplicate and colliding ids; stale
//! versions; handlers that fail transiently, for good, or panic), interleaved with valid
//! events over several partitions, consumed by the inbox against real PostgreSQL.
//!
//! The generator also says what the inbox must do with each record (it models the holds per
//! topic and key, dedup by event id and version tracking per aggregate), and the verdict
//! compares that with what the inbox recorded: every record exactly one outcome, every
//! valid event applied once, committed offsets at the end of every partition, `run()`
//! returning after cancel. `tests/tests/inbox_fuzz.rs` runs it bounded; `cargo xtask fuzz
//! inbox --records N --seed S` runs it long.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::kafka::Kafka;
use crate::raw::{RawProducer, RawRecord};
use crate::Rng;

const CREDIT: &str = "fuzz.credit";
const AUDIT: &str = "fuzz.audit";
const MAX_ATTEMPTS: u32 = 3;

/// The event the valid records carry. `mode` tells the handler how to behave.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credit {
    account: String,
    amount: i64,
    #[serde(default)]
    mode: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    filler: String,
}

/// What the inbox must do with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expected {
    /// Its effect applied once.
    Applied,
    /// Absorbed: its event id was recorded before.
    Duplicate,
    /// Absorbed: its aggregate version is not newer.
    Stale,
    /// Parked with a reason.
    Parked,
    /// Held behind a parked record of its key.
    Held,
    /// Of a type the consumer ignores.
    Ignored,
}

/// One generated record and what must become of it.
#[derive(Debug, Clone)]
struct Planned {
    record: RawRecord,
    offset: i64,
    expected: Expected,
    /// For reports: which kind of record the generator made.
    kind: &'static str,
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The seed that reproduces the run (`OUTBOX_TEST_SEED` / `--seed`).
    pub seed: u64,
    /// Records produced.
    pub records: usize,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Outcomes the inbox counted.
    pub applied: u64,
    /// Duplicates absorbed.
    pub duplicates: u64,
    /// Stale versions absorbed.
    pub stale: u64,
    /// Parked with a reason.
    pub parked: u64,
    /// Held behind a parked record.
    pub held: u64,
    /// Ignored types.
    pub ignored: u64,
    /// Retries (transient failures).
    pub retries: u64,
    /// Event ids whose effect ran more than once.
    pub applied_twice: u64,
    /// Records with no recorded outcome.
    pub without_outcome: u64,
    /// Records whose recorded outcome is not the one they must have.
    pub wrong_outcome: u64,
    /// Valid events (that must apply) not applied.
    pub valid_not_applied: u64,
    /// Offsets between the committed ones and the partitions' ends, summed.
    pub offsets_behind: i64,
    /// Records the broker deleted before they could be read (low watermarks above 0):
    /// the run is void then; use more partitions.
    pub broker_dropped: i64,
    /// Whether `run()` returned `Ok` within its shutdown timeout after cancel.
    pub run_returned: bool,
    /// Expected outcomes by kind.
    pub expected: BTreeMap<Expected, u64>,
    /// Seconds from the first record to the last outcome.
    pub seconds: f64,
    /// The first few mismatches, for the reader.
    pub mismatches: Vec<String>,
}

impl Verdict {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.applied_twice == 0
            && self.without_outcome == 0
            && self.wrong_outcome == 0
            && self.valid_not_applied == 0
            && self.offsets_behind == 0
            && self.broker_dropped == 0
            && self.run_returned
    }
}

/// Per-event handler state: how many calls have failed so far.
#[derive(Clone, Default)]
struct Ledger {
    failures: Arc<Mutex<HashMap<Uuid, u32>>>,
}

impl Ledger {
    fn fail_once_more(&self, id: Uuid, up_to: u32) -> bool {
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = failures.entry(id).or_default();
        *n += 1;
        *n <= up_to
    }
}

impl EventHandler<Credit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        match credit.mode.as_str() {
            "transient" if self.fail_once_more(meta.event_id, MAX_ATTEMPTS - 1) => {
                return Err(HandlerError::transient("the ledger is busy"))
            }
            "always-transient" => return Err(HandlerError::transient("the ledger is always busy")),
            "permanent" => return Err(HandlerError::permanent("the ledger refuses this account")),
            "panic" => panic!("the ledger cannot take account {}", credit.account),
            "slow" => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => {}
        }
        // A NUL inside the account makes PostgreSQL refuse the insert (22021): parked.
        sqlx::query("INSERT INTO fuzz_effects (event_id, account, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4)")
            .bind(meta.event_id)
            .bind(&credit.account)
            .bind(meta.partition)
            .bind(meta.offset)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// The generator, with the model of what the inbox does.
struct Generator {
    rng: Rng,
    partitions: i32,
    keys: Vec<String>,
    /// Per partition, the next offset.
    next_offset: Vec<i64>,
    /// Valid credits produced, for duplicates (record, event id).
    sent: Vec<(RawRecord, Uuid)>,
    /// The model: hold keys with an open parked record; event ids recorded in the inbox;
    /// last applied version per aggregate id; next version per key.
    held: HashSet<Vec<u8>>,
    seen: HashSet<Uuid>,
    last_version: HashMap<String, i64>,
    next_version: HashMap<String, i64>,
    amount: i64,
}

/// Header names and values, as bytes.
type Headers = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn text_headers(pairs: &[(&str, String)]) -> Headers {
    pairs.iter().map(|(k, v)| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec()))).collect()
}

fn ce(
    id: &str,
    event_type: &str,
    subject: Option<&str>,
    version: Option<i64>,
) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("ce_specversion", "1.0".to_owned()),
        ("ce_id", id.to_owned()),
        ("ce_type", event_type.to_owned()),
        ("ce_source", "/fuzz".to_owned()),
        ("ce_schemaversion", "1".to_owned()),
        ("ce_aggregatetype", "account".to_owned()),
        ("content-type", "application/json".to_owned()),
    ];
    if let Some(s) = subject {
        h.push(("ce_subject", s.to_owned()));
    }
    if let Some(v) = version {
        h.push(("ce_aggregateversion", v.to_string()));
    }
    h
}

impl Generator {
    fn new(rng: Rng, partitions: i32, records: usize) -> Generator {
        let key_count = (records / 10).clamp(8, 2000);
        Generator {
            rng,
            partitions,
            keys: (0..key_count).map(|i| format!("acc-{i}")).collect(),
            next_offset: vec![0; usize::try_from(partitions).unwrap_or(1)],
            sent: Vec::new(),
            held: HashSet::new(),
            seen: HashSet::new(),
            last_version: HashMap::new(),
            next_version: HashMap::new(),
            amount: 0,
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.rng.range(0, 100) < percent
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.rng.next_u64() as u8).collect()
    }

    fn partition_of(&self, key: &[u8]) -> i32 {
        let h = key.iter().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(*b)));
        i32::try_from(h % self.partitions.unsigned_abs()).unwrap_or(0)
    }

    fn hold_key(topic: &str, key: &Option<Vec<u8>>) -> Option<Vec<u8>> {
        key.as_ref().map(|k| [topic.as_bytes(), &[0], k].concat())
    }

    fn credit_payload(&mut self, account: &str, mode: &str) -> Vec<u8> {
        self.amount += 1;
        // Big values, but not so many that the mock cluster's 5 MB per partition log drops
        // old records (the verdict checks the low watermarks).
        let filler = match self.rng.range(0, 2000) {
            0 => "f".repeat(512 * 1024),
            1..=20 => "f".repeat(16 * 1024),
            _ => String::new(),
        };
        serde_json::to_vec(&Credit {
            account: account.to_owned(),
            amount: self.amount,
            mode: mode.to_owned(),
            filler,
        })
        .expect("json")
    }

    /// A record, with what must become of it.
    fn next(&mut self, topic: &str) -> (RawRecord, Expected, &'static str) {
        let roll = self.rng.range(0, 100);
        let pooled =
            self.keys[usize::try_from(self.rng.range(0, self.keys.len() as u64)).unwrap_or(0)].clone();
        let unique = format!("u-{:016x}", self.rng.next_u64());
        let id = Uuid::now_v7();
        // (key, headers, value, what it is, and what it must do if nothing holds it)
        // Records that repeat an event id go to the partition of the original: across
        // partitions the order, and so which of the two applies, is not defined.
        let mut partition = None;
        let (key, mut headers, value, kind, fate): (Option<Vec<u8>>, _, Option<Vec<u8>>, _, Fate) = match roll
        {
            0..=44 => {
                let mode = match self.rng.range(0, 200) {
                    0 => "permanent",
                    1 => "panic",
                    2 => "always-transient",
                    3 => "nul",
                    4..=9 => "transient",
                    10..=13 => "slow",
                    _ => "",
                };
                let account = if mode == "nul" { format!("{pooled}\0x") } else { pooled.clone() };
                let version = *self.next_version.entry(pooled.clone()).and_modify(|v| *v += 1).or_insert(1);
                let payload = self.credit_payload(&account, mode);
                let headers = text_headers(&ce(&id.to_string(), CREDIT, Some(&pooled), Some(version)));
                let fate = match mode {
                    "permanent" | "panic" | "always-transient" | "nul" => Fate::Park,
                    _ => Fate::Apply { id, aggregate: Some((pooled.clone(), version)) },
                };
                (Some(pooled.clone().into_bytes()), headers, Some(payload), "valid", fate)
            }
            45..=49 if !self.sent.is_empty() => {
                let pick = usize::try_from(self.rng.range(0, self.sent.len() as u64)).unwrap_or(0);
                let (record, id) = self.sent[pick].clone();
                partition = Some(record.partition);
                let fate = Fate::Apply { id, aggregate: None };
                (record.key.clone(), record.headers.clone(), record.value.clone(), "duplicate", fate)
            }
            50..=52 if !self.sent.is_empty() => {
                // Another record reusing an applied event id: absorbed as that event.
                let pick = usize::try_from(self.rng.range(0, self.sent.len() as u64)).unwrap_or(0);
                let old = self.sent[pick].1;
                partition = Some(self.sent[pick].0.partition);
                let payload = self.credit_payload(&unique, "");
                let headers = text_headers(&ce(&old.to_string(), CREDIT, Some(&unique), None));
                (
                    Some(unique.into_bytes()),
                    headers,
                    Some(payload),
                    "id collision",
                    Fate::Apply { id: old, aggregate: None },
                )
            }
            53..=55 => {
                // A new event with an old version of its aggregate.
                let last = self.next_version.get(&pooled).copied().unwrap_or(0);
                let version = last.saturating_sub(1 + i64::try_from(self.rng.range(0, 3)).unwrap_or(0));
                let payload = self.credit_payload(&pooled, "");
                let headers = text_headers(&ce(&id.to_string(), CREDIT, Some(&pooled), Some(version)));
                let fate = Fate::Apply { id, aggregate: Some((pooled.clone(), version)) };
                (Some(pooled.into_bytes()), headers, Some(payload), "old version", fate)
            }
            56..=59 => {
                // A binary key (NUL and invalid UTF-8 likely), no subject, no version: applies untracked.
                let len = usize::try_from(self.rng.range(1, 40)).unwrap_or(1);
                let mut key = self.bytes(len);
                key.push(0);
                let payload = self.credit_payload("binary-key", "");
                let headers = text_headers(&ce(&id.to_string(), CREDIT, None, None));
                (Some(key), headers, Some(payload), "binary key", Fate::Apply { id, aggregate: None })
            }
            60..=61 => {
                let payload = self.credit_payload("keyless", "");
                let headers = text_headers(&ce(&id.to_string(), CREDIT, None, None));
                (None, headers, Some(payload), "keyless", Fate::Apply { id, aggregate: None })
            }
            62..=65 => {
                let key = if self.chance(50) { pooled } else { unique };
                let headers = text_headers(&ce(&id.to_string(), AUDIT, Some(&key), None));
                (
                    Some(key.into_bytes()),
                    headers,
                    Some(b"{\"audit\":true}".to_vec()),
                    "ignored type",
                    Fate::Ignore,
                )
            }
            _ => {
                // Broken: mostly on keys of their own, sometimes on a key valid events use.
                let key = if self.chance(5) { pooled } else { unique };
                let (headers, value, kind) = self.broken(&id, &key);
                (Some(key.into_bytes()), headers, value, kind, Fate::Park)
            }
        };
        if self.chance(10) {
            // Foreign headers that are not the inbox's business: text, bytes, null.
            headers.push((b"x-trace".to_vec(), Some(self.bytes(16))));
            headers.push((
                b"traceparent".to_vec(),
                Some(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec()),
            ));
            headers.push((b"x-null".to_vec(), None));
        }
        let partition = partition.unwrap_or_else(|| match &key {
            Some(k) => self.partition_of(k),
            None => i32::try_from(self.rng.range(0, self.partitions.unsigned_abs().into())).unwrap_or(0),
        });
        let record = RawRecord { partition, key, value, headers };
        let expected = self.judge(topic, &record, fate);
        (record, expected, kind)
    }

    /// A broken record's headers and value.
    fn broken(&mut self, id: &Uuid, key: &str) -> (Headers, Option<Vec<u8>>, &'static str) {
        let ok = |id: &Uuid| ce(&id.to_string(), CREDIT, Some(key), None);
        let valid = self.credit_payload(key, "");
        let which = self.rng.range(0, 16);
        match which {
            0 => {
                let mut value = vec![0xff];
                let len = usize::try_from(self.rng.range(0, 300)).unwrap_or(0);
                value.extend(self.bytes(len));
                (text_headers(&ok(id)), Some(value), "random value")
            }
            1 => (text_headers(&ok(id)), Some(Vec::new()), "empty value"),
            2 => (text_headers(&ok(id)), None, "tombstone"),
            3 => {
                let h: Vec<_> = ok(id).into_iter().filter(|(k, _)| *k != "ce_id").collect();
                (text_headers(&h), Some(valid), "missing ce_id")
            }
            4 => (text_headers(&ce("order-42", CREDIT, Some(key), None)), Some(valid), "ce_id not a UUID"),
            5 => {
                let mut h = text_headers(&ok(id));
                let mut name = vec![0xff];
                let len = usize::try_from(self.rng.range(0, 12)).unwrap_or(0);
                name.extend(self.bytes(len).into_iter().map(|b| b.max(1)));
                h.push((name, Some(b"v".to_vec())));
                (h, Some(valid), "header name not UTF-8")
            }
            6 => {
                let mut h = text_headers(&ok(id));
                h[2].1 = Some(vec![b'f', 0xc3, 0x28]);
                (h, Some(valid), "ce_type not UTF-8")
            }
            7 => {
                let mut h = text_headers(&ok(id));
                h[2].1 = Some(b"fuzz.cre\0dit".to_vec());
                (h, Some(valid), "ce_type with NUL")
            }
            8 => {
                let mut h = text_headers(&ok(id));
                h[1].1 = None;
                (h, Some(valid), "null ce_id")
            }
            9 => {
                let mut h = text_headers(&ok(id));
                h.push((b"ce_id".to_vec(), Some(Uuid::now_v7().to_string().into_bytes())));
                (h, Some(valid), "two ce_ids")
            }
            10 => (
                text_headers(&ok(id)),
                Some(b"{\"account\":\"a\",\"amount\":\"ten\"}".to_vec()),
                "does not decode",
            ),
            11 => {
                let subject = "s".repeat(8 * 1024);
                (
                    text_headers(&ce(&id.to_string(), CREDIT, Some(&subject), Some(1))),
                    Some(valid),
                    "8 KiB subject",
                )
            }
            12 => {
                let mut h = ok(id);
                h.push(("ce_aggregateversion", "v2".to_owned()));
                (text_headers(&h), Some(valid), "version not a number")
            }
            13 => {
                let mut h = ok(id);
                h[4].1 = "0".to_owned();
                (text_headers(&h), Some(valid), "schema version 0")
            }
            14 => (
                text_headers(&ce(&id.to_string(), "fuzz.unknown", Some(key), None)),
                Some(valid),
                "unknown type",
            ),
            _ => {
                // A JSON string with NUL inside the event's own text: decodes, PostgreSQL refuses it.
                let value = format!("{{\"account\":\"{key}\\u0000\",\"amount\":1}}").into_bytes();
                (text_headers(&ok(id)), Some(value), "NUL in JSON")
            }
        }
    }

    /// What the inbox must do with `record` given everything before it, and the model updated.
    fn judge(&mut self, topic: &str, record: &RawRecord, fate: Fate) -> Expected {
        let hold = Self::hold_key(topic, &record.key);
        if hold.as_ref().is_some_and(|h| self.held.contains(h)) {
            return Expected::Held;
        }
        match fate {
            Fate::Ignore => Expected::Ignored,
            Fate::Park => {
                if let Some(h) = hold {
                    self.held.insert(h);
                }
                Expected::Parked
            }
            Fate::Apply { id, aggregate } => {
                if !self.seen.insert(id) {
                    return Expected::Duplicate;
                }
                if let Some((aggregate_id, version)) = aggregate {
                    match self.last_version.get(&aggregate_id) {
                        Some(last) if version <= *last => return Expected::Stale,
                        _ => {
                            self.last_version.insert(aggregate_id, version);
                        }
                    }
                }
                self.sent.push((record.clone(), id));
                Expected::Applied
            }
        }
    }

    /// `n` records for `topic`, each placed on its key's partition.
    fn plan(&mut self, topic: &str, n: usize) -> Vec<Planned> {
        (0..n)
            .map(|_| {
                let (record, expected, kind) = self.next(topic);
                let slot = &mut self.next_offset[usize::try_from(record.partition).unwrap_or(0)];
                let offset = *slot;
                *slot += 1;
                Planned { record, offset, expected, kind }
            })
            .collect()
    }
}

/// What a record is meant to do, before holds and dedup are considered.
enum Fate {
    Apply { id: Uuid, aggregate: Option<(String, i64)> },
    Park,
    Ignore,
}

/// Produces `records` generated from `seed` to a new topic of `partitions`, consumes them
/// with an inbox on `pool`, and judges what it recorded.
pub async fn run(pool: &PgPool, kafka: &Kafka, records: usize, seed: u64, partitions: i32) -> Verdict {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS fuzz_effects (event_id uuid NOT NULL, account text NOT NULL, \
         kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("effects table");
    let topic = format!("fuzz-{}", Uuid::new_v4().simple());
    kafka.create_topic(&topic, partitions).await;
    let mut generator = Generator::new(Rng::seeded(seed), partitions, records);
    let planned = generator.plan(&topic, records);

    let consumer = format!("fuzz-{}", Uuid::new_v4().simple());
    let config = InboxConfig::new(&consumer, kafka.bootstrap(), [topic.clone()])
        .queue_per_partition(16)
        .buffer_per_partition(16 * 1024)
        .max_attempts(MAX_ATTEMPTS)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .commit_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(10))
        .dedup_retention(None);
    let handlers = Handlers::new().on_type::<Credit, _>(CREDIT, 1, Ledger::default()).ignore(AUDIT);
    let inbox = Inbox::new(pool.clone(), config, handlers).expect("inbox");
    inbox.migrator().run(pool).await.expect("inbox migrations");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));

    let started = Instant::now();
    let producer = RawProducer::new(kafka.bootstrap());
    for p in &planned {
        producer.send(&topic, &p.record);
    }
    producer.flush();
    let total = |s: &outbox_runtime::inbox::InboxStats| {
        s.applied() + s.duplicates() + s.stale() + s.parked() + s.held() + s.ignored()
    };
    let budget = Duration::from_secs(60) + Duration::from_millis(20 * records as u64);
    let mut last_progress = (Instant::now(), 0);
    while total(&stats) < records as u64 && started.elapsed() < budget {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = total(&stats);
        if now != last_progress.1 {
            last_progress = (Instant::now(), now);
        } else if last_progress.0.elapsed() > Duration::from_secs(30) {
            break; // no progress for 30 s: judge what there is
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let the last offsets be committed, then stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let run_returned = matches!(tokio::time::timeout(Duration::from_secs(20), task).await, Ok(Ok(Ok(()))));

    // What the inbox recorded, per (partition, offset).
    let effects: Vec<(Uuid, i32, i64)> =
        sqlx::query_as("SELECT event_id, kafka_partition, kafka_offset FROM fuzz_effects")
            .fetch_all(pool)
            .await
            .expect("effects");
    let stale: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT kafka_partition, kafka_offset FROM inbox WHERE consumer = $1 AND topic = $2 AND outcome = 'stale'",
    )
    .bind(&consumer)
    .bind(&topic)
    .fetch_all(pool)
    .await
    .expect("stale");
    let parked: Vec<(i32, i64, String)> = sqlx::query_as(
        "SELECT kafka_partition, kafka_offset, status FROM inbox_parked WHERE consumer = $1 AND topic = $2",
    )
    .bind(&consumer)
    .bind(&topic)
    .fetch_all(pool)
    .await
    .expect("parked");
    let mut per_event: HashMap<Uuid, u64> = HashMap::new();
    let mut traced: HashMap<(i32, i64), Vec<Expected>> = HashMap::new();
    for (id, p, o) in &effects {
        *per_event.entry(*id).or_default() += 1;
        traced.entry((*p, *o)).or_default().push(Expected::Applied);
    }
    for (p, o) in &stale {
        traced.entry((*p, *o)).or_default().push(Expected::Stale);
    }
    for (p, o, status) in &parked {
        let outcome = if status == "held" { Expected::Held } else { Expected::Parked };
        traced.entry((*p, *o)).or_default().push(outcome);
    }
    let mut verdict = Verdict {
        seed,
        records,
        partitions,
        applied: stats.applied(),
        duplicates: stats.duplicates(),
        stale: stats.stale(),
        parked: stats.parked(),
        held: stats.held(),
        ignored: stats.ignored(),
        retries: stats.retries(),
        applied_twice: per_event.values().filter(|n| **n > 1).count() as u64,
        without_outcome: (records as u64).saturating_sub(total(&stats)),
        wrong_outcome: 0,
        valid_not_applied: 0,
        offsets_behind: 0,
        broker_dropped: 0,
        run_returned,
        expected: BTreeMap::new(),
        seconds,
        mismatches: Vec::new(),
    };
    for p in &planned {
        *verdict.expected.entry(p.expected).or_default() += 1;
        let seen = traced.get(&(p.record.partition, p.offset)).cloned().unwrap_or_default();
        let fine = match p.expected {
            // No trace in the database: counted below.
            Expected::Duplicate | Expected::Ignored => seen.is_empty(),
            outcome => seen == [outcome],
        };
        if !fine {
            if seen.is_empty() {
                verdict.without_outcome += 1;
            } else {
                verdict.wrong_outcome += 1;
            }
            if p.expected == Expected::Applied && !seen.contains(&Expected::Applied) {
                verdict.valid_not_applied += 1;
            }
            if verdict.mismatches.len() < 10 {
                verdict.mismatches.push(format!(
                    "{} record at {}@{} must be {:?}, recorded {seen:?}",
                    p.kind, p.record.partition, p.offset, p.expected
                ));
            }
        }
    }
    // The counters must agree with the model for the outcomes that leave no trace.
    let count = |e: Expected| verdict.expected.get(&e).copied().unwrap_or(0);
    for (name, counted, must) in [
        ("duplicate", verdict.duplicates, count(Expected::Duplicate)),
        ("ignored", verdict.ignored, count(Expected::Ignored)),
        ("applied", verdict.applied, count(Expected::Applied)),
        ("parked", verdict.parked, count(Expected::Parked)),
        ("held", verdict.held, count(Expected::Held)),
        ("stale", verdict.stale, count(Expected::Stale)),
    ] {
        if counted != must {
            verdict.wrong_outcome += counted.abs_diff(must);
            verdict.mismatches.push(format!("{name}: counted {counted}, must be {must}"));
        }
    }
    let ends: Vec<i64> = generator.next_offset.clone();
    let watermarks = kafka.watermarks(&topic, partitions);
    verdict.broker_dropped = watermarks.iter().map(|(low, _)| *low).sum();
    let highs: Vec<i64> = watermarks.iter().map(|(_, high)| *high).collect();
    if verdict.broker_dropped != 0 || highs != ends {
        verdict.mismatches.push(format!(
            "the topic holds {watermarks:?} (low, high) per partition, {ends:?} were produced: the broker dropped \
             records; the run is void (use more partitions)"
        ));
        verdict.broker_dropped = verdict.broker_dropped.max(1);
    }
    let committed = kafka.committed(&consumer, &topic, partitions);
    verdict.offsets_behind =
        ends.iter().zip(&committed).map(|(end, c)| if *end == 0 { 0 } else { end - (*c).max(0) }).sum();
    if verdict.offsets_behind != 0 {
        verdict.mismatches.push(format!("committed offsets {committed:?}, partition ends {ends:?}"));
    }
    verdict
}
