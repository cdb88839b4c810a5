//! The fuzz run's generator: records nobody planned for, each with what the inbox must do
//! with it, from a model of the holds per topic and key, dedup by event id and version
//! tracking per aggregate.

use std::collections::{HashMap, HashSet};

use outbox_runtime::schema_registry::framing::{guid_header, prefix, VALUE_SCHEMA_ID_HEADER};
use uuid::Uuid;

use super::{Credit, Expected, Planned, AUDIT, CREDIT};
use crate::raw::RawRecord;
use crate::Rng;

/// The generator, with the model of what the inbox does.
pub(super) struct Generator {
    rng: Rng,
    partitions: i32,
    keys: Vec<String>,
    /// Per partition, the next offset.
    pub(super) next_offset: Vec<i64>,
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
    pub(super) fn new(rng: Rng, partitions: i32, records: usize) -> Generator {
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
                let mut payload = self.credit_payload(&account, mode);
                let mut headers = text_headers(&ce(&id.to_string(), CREDIT, Some(&pooled), Some(version)));
                // Some in a schema registry's wire format (Confluent's serializers): the
                // id before the payload, or a GUID in a header; read as the same event.
                match self.rng.range(0, 12) {
                    0 => payload = prefix(u32::try_from(self.rng.range(0, 1 << 32)).unwrap_or(0), &payload),
                    1 => {
                        let guid: [u8; 16] = self.bytes(16).try_into().unwrap_or_default();
                        headers.push((
                            VALUE_SCHEMA_ID_HEADER.as_bytes().to_vec(),
                            Some(guid_header(guid).to_vec()),
                        ));
                    }
                    _ => {}
                }
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
                // Not JSON; or a control byte no JSON begins with (an unknown magic byte);
                // or a schema registry frame cut short.
                let first = match self.rng.range(0, 3) {
                    0 => 0xff,
                    1 => u8::try_from(self.rng.range(0x02, 0x09)).unwrap_or(2),
                    _ => 0x00,
                };
                let mut value = vec![first];
                let len = usize::try_from(self.rng.range(0, if first == 0 { 4 } else { 300 })).unwrap_or(0);
                value.extend(self.bytes(len));
                (text_headers(&ok(id)), Some(value), "random value")
            }
            1 => (text_headers(&ok(id)), Some(Vec::new()), "empty value"),
            2 => (text_headers(&ok(id)), None, "tombstone"),
            3 => {
                let h: Vec<_> = ok(id).into_iter().filter(|(k, _)| *k != "ce_id").collect();
                (text_headers(&h), Some(valid), "missing ce_id")
            }
            4 => {
                // Any non-empty id is an id (a UUIDv5 of source and id when not a UUID);
                // a CloudEvent of another spec version is not read.
                let mut h = ok(id);
                h[0].1 = "0.3".to_owned();
                (text_headers(&h), Some(valid), "ce_specversion 0.3")
            }
            5 => {
                let mut h = text_headers(&ok(id));
                // Any bytes after the first, NUL among them: read whole (librdkafka hands
                // names out NUL-terminated).
                let mut name = vec![0xff];
                let len = usize::try_from(self.rng.range(0, 12)).unwrap_or(0);
                name.extend(self.bytes(len));
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
    pub(super) fn plan(&mut self, topic: &str, n: usize) -> Vec<Planned> {
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
