//! Reading `pgoutput` (protocol version 1) messages for the outbox table: Relation, which
//! says what the table's columns are at this point of the stream, and Insert, whose tuple
//! is read by column name through the last Relation (an `ALTER TABLE` while streaming
//! sends a new Relation before the first row in the new layout).
//!
//! Begin, Commit and logical messages are decoded by the replication client; every other
//! message arrives here as raw bytes starting with its tag.

use std::collections::HashMap;

use uuid::Uuid;

use crate::relay::claim::Row;

/// The columns an event needs, by name. `work_partition` is a generated column, which
/// `pgoutput` does not send before PostgreSQL 18, and the stream does not need it.
const COLUMNS: [&str; 11] = [
    "id",
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "aggregate_version",
    "event_type",
    "schema_version",
    "topic",
    "payload",
    "headers",
    "created_at",
];

/// A message of the stream, as far as the relay cares.
#[derive(Debug)]
pub(crate) enum Message {
    /// A table's layout (the outbox's or, if the publication has more tables, another's).
    Relation(Relation),
    /// A row inserted into the relation with this id.
    Insert { relation: u32, tuple: Vec<Option<Vec<u8>>> },
    /// An update, delete or truncate (tag `U`, `D`, `T`): not published with
    /// `publish = 'insert'`, so someone changed the publication.
    Change(char),
    /// Type and origin messages: nothing to do.
    Other,
}

/// A table as a Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub(crate) id: u32,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) columns: Vec<String>,
}

/// What the stream sent that the relay cannot read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(what: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError(what.into()))
}

/// A cursor over one message's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return err(format!("message ends inside {what}"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self, what: &str) -> Result<String, DecodeError> {
        let Some(end) = self.bytes.iter().position(|b| *b == 0) else {
            return err(format!("{what} is not NUL-terminated"));
        };
        let text = self.take(end, what)?;
        self.take(1, what)?;
        String::from_utf8(text.to_vec()).map_err(|_| DecodeError(format!("{what} is not UTF-8")))
    }
}

/// Decodes one `pgoutput` message (protocol version 1, no streamed transactions).
pub(crate) fn message(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { bytes };
    match r.u8("the message tag")? {
        b'R' => {
            let id = r.u32("the relation id")?;
            let namespace = r.string("the relation's namespace")?;
            let name = r.string("the relation's name")?;
            r.u8("the replica identity")?;
            let count = r.u16("the column count")?;
            let mut columns = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                r.u8("a column's flags")?;
                columns.push(r.string("a column name")?);
                r.u32("a column's type")?;
                r.u32("a column's type modifier")?;
            }
            Ok(Message::Relation(Relation { id, namespace, name, columns }))
        }
        b'I' => {
            let relation = r.u32("the relation id")?;
            if r.u8("the new tuple's marker")? != b'N' {
                return err("an insert without a new tuple");
            }
            let count = r.u16("the tuple's column count")?;
            let mut tuple = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                match r.u8("a column's kind")? {
                    b'n' => tuple.push(None),
                    b't' | b'b' => {
                        let len = r.u32("a value's length")?;
                        let len = usize::try_from(len).map_err(|_| DecodeError("a value too long".into()))?;
                        tuple.push(Some(r.take(len, "a value")?.to_vec()));
                    }
                    b'u' => return err("an insert with an unchanged TOAST value"),
                    other => return err(format!("a column of unknown kind {:?}", char::from(other))),
                }
            }
            Ok(Message::Insert { relation, tuple })
        }
        tag @ (b'U' | b'D' | b'T') => Ok(Message::Change(char::from(tag))),
        b'Y' | b'O' => Ok(Message::Other),
        other => err(format!("a message of unknown type {:?}", char::from(other))),
    }
}

/// Where each needed column is in the outbox relation's tuples.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    index: [usize; COLUMNS.len()],
}

impl Layout {
    /// The layout of `relation`, or what is missing from it.
    pub(crate) fn of(relation: &Relation) -> Result<Self, DecodeError> {
        let by_name: HashMap<&str, usize> =
            relation.columns.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
        let mut index = [0; COLUMNS.len()];
        for (slot, name) in index.iter_mut().zip(COLUMNS) {
            *slot = *by_name.get(name).ok_or_else(|| {
                DecodeError(format!(
                    "table {}.{} as the stream describes it has no column {name}",
                    relation.namespace, relation.name
                ))
            })?;
        }
        Ok(Layout { index })
    }

    /// The event an Insert's tuple holds.
    pub(crate) fn row(&self, tuple: Vec<Option<Vec<u8>>>) -> Result<Row, DecodeError> {
        let mut tuple = tuple;
        let mut take = |i: usize| take(&mut tuple, self.index[i], COLUMNS[i]);
        let id = required(take(0)?, 0)?;
        let event_id = required(take(1)?, 1)?;
        let aggregate_type = required(take(2)?, 2)?;
        let aggregate_id = required(take(3)?, 3)?;
        let aggregate_version = take(4)?;
        let event_type = required(take(5)?, 5)?;
        let schema_version = required(take(6)?, 6)?;
        let topic = required(take(7)?, 7)?;
        let payload = required(take(8)?, 8)?;
        let headers = required(take(9)?, 9)?;
        let created_at = required(take(10)?, 10)?;
        let number = |name: &str, text: &str| -> Result<i64, DecodeError> {
            text.parse().map_err(|_| DecodeError(format!("column {name} is not a number: {text:?}")))
        };
        Ok(Row {
            id: number("id", &id)?,
            event_id: Uuid::parse_str(&event_id)
                .map_err(|_| DecodeError(format!("column event_id is not a UUID: {event_id:?}")))?,
            aggregate_type,
            aggregate_id,
            aggregate_version: aggregate_version.map(|v| number("aggregate_version", &v)).transpose()?,
            event_type,
            schema_version: i32::try_from(number("schema_version", &schema_version)?).map_err(|_| {
                DecodeError(format!("column schema_version is out of range: {schema_version}"))
            })?,
            topic,
            payload,
            headers,
            created_at: rfc3339(&created_at)?,
            attempts: 0,
            work_partition: 0,
        })
    }
}

/// The text of the value at `index`, moved out of the tuple.
fn take(tuple: &mut [Option<Vec<u8>>], index: usize, name: &str) -> Result<Option<String>, DecodeError> {
    match tuple.get_mut(index) {
        None => err(format!("the tuple has no value for column {name}")),
        Some(value) => value
            .take()
            .map(|v| String::from_utf8(v).map_err(|_| DecodeError(format!("column {name} is not UTF-8"))))
            .transpose(),
    }
}

fn required(value: Option<String>, i: usize) -> Result<String, DecodeError> {
    value.ok_or_else(|| DecodeError(format!("column {} is NULL", COLUMNS[i])))
}

/// A `timestamptz` as PostgreSQL prints it with `DateStyle = ISO` and `TimeZone = UTC`
/// (`2026-12-02 10:20:00.1234+00`), as the polling relay formats `ce_time`:
/// `2026-12-02T10:20:00.123400Z`, always six digits of fraction.
///
/// A time PostgreSQL takes and RFC 3339 cannot express (`infinity`, `-infinity`, a year
/// past 9999, a date BC) is the empty string, as the polling relay reads it: the row is
/// parked with its reason. Anything else unreadable is an error.
pub(crate) fn rfc3339(text: &str) -> Result<String, DecodeError> {
    let bad = || DecodeError(format!("created_at {text:?} is not an ISO timestamp in UTC"));
    let year_digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if matches!(text, "infinity" | "-infinity")
        || (text.ends_with(" BC") && year_digits >= 4)
        || (year_digits > 4 && text.as_bytes().get(year_digits) == Some(&b'-'))
    {
        return Ok(String::new());
    }
    let body = text.strip_suffix("+00").ok_or_else(bad)?;
    let (date, time) = body.split_once(' ').ok_or_else(bad)?;
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let date_ok = date.len() == 10
        && digits(&date[0..4], 4)
        && &date[4..5] == "-"
        && digits(&date[5..7], 2)
        && &date[7..8] == "-"
        && digits(&date[8..10], 2);
    let clock_ok = clock.len() == 8
        && digits(&clock[0..2], 2)
        && &clock[2..3] == ":"
        && digits(&clock[3..5], 2)
        && &clock[5..6] == ":"
        && digits(&clock[6..8], 2);
    if !date_ok || !clock_ok || fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok(format!("{date}T{clock}.{fraction:0<6}Z"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_bytes(id: u32, columns: &[&str]) -> Vec<u8> {
        let mut b = vec![b'R'];
        b.extend(id.to_be_bytes());
        b.extend(b"outbox\0events\0d");
        b.extend(u16::try_from(columns.len()).expect("few").to_be_bytes());
        for c in columns {
            b.push(0);
            b.extend(c.as_bytes());
            b.push(0);
            b.extend(25u32.to_be_bytes());
            b.extend(u32::MAX.to_be_bytes());
        }
        b
    }

    fn insert_bytes(id: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut b = vec![b'I'];
        b.extend(id.to_be_bytes());
        b.push(b'N');
        b.extend(u16::try_from(values.len()).expect("few").to_be_bytes());
        for v in values {
            match v {
                None => b.push(b'n'),
                Some(v) => {
                    b.push(b't');
                    b.extend(u32::try_from(v.len()).expect("short").to_be_bytes());
                    b.extend(v.as_bytes());
                }
            }
        }
        b
    }

    /// Columns in any order, extra ones among them: each value is read by its name.
    #[test]
    fn a_row_is_read_by_column_name_whatever_the_order() {
        let mut columns: Vec<&str> = COLUMNS.to_vec();
        columns.push("status");
        columns.reverse();
        columns.insert(3, "added_later");
        let Ok(Message::Relation(relation)) = message(&relation_bytes(7, &columns)) else {
            panic!("relation")
        };
        let layout = Layout::of(&relation).expect("every column");
        let value = |c: &str| -> Option<&str> {
            Some(match c {
                "id" => "42",
                "event_id" => "01a235ac-0035-7743-b685-49aa21789f0a",
                "aggregate_type" => "order",
                "aggregate_id" => "o-1",
                "aggregate_version" => return None,
                "event_type" => "shop.order_placed",
                "schema_version" => "3",
                "topic" => "orders",
                "payload" => r#"{"a": 1}"#,
                "headers" => "{}",
                "created_at" => "2026-12-02 10:20:00.5+00",
                _ => "other",
            })
        };
        let values: Vec<Option<&str>> = columns.iter().map(|c| value(c)).collect();
        let Ok(Message::Insert { relation: 7, tuple }) = message(&insert_bytes(7, &values)) else {
            panic!("insert")
        };
        let row = layout.row(tuple).expect("a row");
        assert_eq!((row.id, row.schema_version, row.aggregate_version), (42, 3, None));
        assert_eq!((row.aggregate_id.as_str(), row.topic.as_str()), ("o-1", "orders"));
        assert_eq!(row.payload, r#"{"a": 1}"#);
        assert_eq!(row.created_at, "2026-12-02T10:20:00.500000Z");
    }

    #[test]
    fn a_relation_without_a_needed_column_is_refused_by_name() {
        let columns: Vec<&str> = COLUMNS.iter().copied().filter(|c| *c != "topic").collect();
        let Ok(Message::Relation(relation)) = message(&relation_bytes(1, &columns)) else { panic!() };
        let error = Layout::of(&relation).expect_err("no topic");
        assert!(error.0.contains("no column topic"), "{error}");
    }

    /// Every prefix of a valid message is an error, never a panic or a wrong row.
    #[test]
    fn truncated_messages_are_errors() {
        let relation = relation_bytes(1, &COLUMNS);
        let insert = insert_bytes(1, &[Some("1"), None, Some("x")]);
        for bytes in [&relation, &insert] {
            for end in 0..bytes.len() {
                assert!(message(&bytes[..end]).is_err(), "prefix of {end} bytes");
            }
        }
        assert!(message(b"Zjunk").is_err());
        assert!(matches!(message(b"T\0\0\0\x01"), Ok(Message::Change('T'))));
    }

    #[test]
    fn timestamps_come_out_as_the_polling_relay_writes_them() {
        for (given, expected) in [
            ("2026-12-02 10:20:00+00", "2026-12-02T10:20:00.000000Z"),
            ("2026-12-02 10:20:00.1+00", "2026-12-02T10:20:00.100000Z"),
            ("2026-01-31 23:59:59.999999+00", "2026-01-31T23:59:59.999999Z"),
            ("0001-01-01 00:00:00+00", "0001-01-01T00:00:00.000000Z"),
            // What RFC 3339 cannot express: parked by the publisher, as the polling relay does.
            ("infinity", ""),
            ("-infinity", ""),
            ("10000-01-01 00:00:00+00", ""),
            ("294276-12-31 23:59:59.999999+00", ""),
            ("0044-03-15 12:00:00+00 BC", ""),
        ] {
            assert_eq!(rfc3339(given).as_deref(), Ok(expected), "{given}");
        }
        for bad in [
            "2026-12-02 10:20:00+01",
            "2026-12-02T10:20:00+00",
            "12/02/2026 10:20:00+00",
            "2026-12-02 10:20:00.1234567+00",
            "",
            "Infinity",
            "44 BC",
            "1-01-01 00:00:00+00",
        ] {
            assert!(rfc3339(bad).is_err(), "{bad}");
        }
    }
}
