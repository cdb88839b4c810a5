//! [`SchemaIds`]: the registry ids a relay frames its records with, resolved once, before
//! the relay starts, and never looked up per record.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use super::framing::{self, SchemaRef, MAGIC_ID};

/// Where a relay puts each record's schema id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SchemaIdForm {
    /// Before the payload: magic byte `0x00` and the 4-byte id, the form every Confluent
    /// deserializer reads.
    #[default]
    Prefix,
    /// In the `__value_schema_id` header, the payload left as it is (Confluent's clients
    /// from 8.0 / confluent-kafka-python 2.11 read it): magic byte `0x01` and the
    /// schema's GUID, or `0x00` and its id from a registry that gives no GUID.
    Header,
}

impl fmt::Display for SchemaIdForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchemaIdForm::Prefix => "prefix",
            SchemaIdForm::Header => "header",
        })
    }
}

impl FromStr for SchemaIdForm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prefix" => Ok(SchemaIdForm::Prefix),
            "header" => Ok(SchemaIdForm::Header),
            other => Err(format!("schema id form {other:?}: expected prefix or header")),
        }
    }
}

/// What a record of one (event type, version) is framed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// The five bytes before the payload.
    Prefix([u8; 5]),
    /// The value of the `__value_schema_id` header.
    Header(Vec<u8>),
}

/// The schema registry ids of an outbox's event types and versions, and the form a relay
/// frames its records with (`RelayConfig::schema_ids`).
///
/// Built once, before the relay starts: by [`SchemaIds::insert`], or (feature
/// `schema-registry`) by `SchemaIds::resolve`, which looks every committed schema up in
/// the registry. A relay given one never calls the registry; a row whose event type and
/// version it does not hold is failed with a reason that names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaIds {
    form: SchemaIdForm,
    frames: HashMap<String, BTreeMap<u32, (SchemaRef, Frame)>>,
}

impl SchemaIds {
    /// No ids yet, framed in `form`.
    pub fn new(form: SchemaIdForm) -> SchemaIds {
        SchemaIds { form, frames: HashMap::new() }
    }

    /// Records of `event_type` at `version` carry the schema registered with `id` (and
    /// `guid`, from registries that give one: the header form carries it when it is there).
    /// Replaces what was there.
    pub fn insert(&mut self, event_type: impl Into<String>, version: u32, id: u32, guid: Option<[u8; 16]>) {
        let (named, frame) = match (self.form, guid) {
            (SchemaIdForm::Prefix, _) => {
                let mut bytes = [MAGIC_ID, 0, 0, 0, 0];
                bytes[1..].copy_from_slice(&id.to_be_bytes());
                (SchemaRef::Id(id), Frame::Prefix(bytes))
            }
            (SchemaIdForm::Header, Some(guid)) => {
                (SchemaRef::Guid(guid), Frame::Header(framing::guid_header(guid).to_vec()))
            }
            (SchemaIdForm::Header, None) => {
                let mut bytes = vec![MAGIC_ID];
                bytes.extend_from_slice(&id.to_be_bytes());
                (SchemaRef::Id(id), Frame::Header(bytes))
            }
        };
        self.frames.entry(event_type.into()).or_default().insert(version, (named, frame));
    }

    /// The form records are framed in.
    pub fn form(&self) -> SchemaIdForm {
        self.form
    }

    /// What a record of `event_type` at `version` names: the id (prefix form, or header
    /// form without a GUID) or the GUID.
    pub fn get(&self, event_type: &str, version: u32) -> Option<SchemaRef> {
        self.frames.get(event_type)?.get(&version).map(|(named, _)| *named)
    }

    /// How many (event type, version) pairs it holds.
    pub fn len(&self) -> usize {
        self.frames.values().map(BTreeMap::len).sum()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame of a row's record; `None` when its type and version have no id.
    #[cfg(feature = "runtime")]
    pub(crate) fn frame(&self, event_type: &str, version: i32) -> Option<&Frame> {
        let version = u32::try_from(version).ok()?;
        self.frames.get(event_type)?.get(&version).map(|(_, frame)| frame)
    }
}

#[cfg(feature = "schema-registry")]
mod resolve {
    use std::path::Path;

    use super::{SchemaIdForm, SchemaIds};
    use crate::schema_registry::{committed_schemas, Client, Lookup, RegistryError};

    impl SchemaIds {
        /// Looks each schema committed in `dir` (`<event_type>/v<N>.json`, as `cargo xtask
        /// schema generate` writes them) up in the registry, under the subject `template`
        /// names ([`subject_name`](crate::schema_registry::subject_name); the default is
        /// [`TOPIC_RECORD_SUBJECT`](crate::schema_registry::TOPIC_RECORD_SUBJECT)), and
        /// keeps its id and GUID: one call per committed file, made now, never per record.
        /// Registers nothing: a schema that is not registered is an error naming its file
        /// and subject (register them with `cargo xtask schema push`).
        pub fn resolve(
            client: &Client,
            dir: &Path,
            template: &str,
            form: SchemaIdForm,
        ) -> Result<SchemaIds, RegistryError> {
            let committed = committed_schemas(dir, template)?;
            let mut ids = SchemaIds::new(form);
            for file in committed {
                match client.lookup(&file.subject, &file.text)? {
                    Lookup::Registered(r) => ids.insert(&file.event_type, file.version, r.id, r.guid),
                    Lookup::NoSubject | Lookup::NotInSubject => {
                        return Err(RegistryError::NotRegistered {
                            subject: file.subject,
                            file: file.path.display().to_string(),
                        })
                    }
                }
            }
            Ok(ids)
        }
    }
}

#[cfg(all(test, feature = "runtime"))]
mod tests {
    use super::*;
    use crate::schema_registry::framing::{unframe, Unframed};

    /// Each form's frame reads back, with the deserializers' reader, as the id or GUID
    /// inserted; a version or type not inserted has no frame.
    #[test]
    fn frames_read_back_as_what_was_inserted() {
        let guid = [7; 16];
        let mut prefix = SchemaIds::new(SchemaIdForm::Prefix);
        prefix.insert("order.placed", 1, 0x0102_0304, Some(guid));
        let Some(Frame::Prefix(bytes)) = prefix.frame("order.placed", 1) else { panic!("a prefix frame") };
        let mut value = bytes.to_vec();
        value.extend_from_slice(b"{}");
        assert_eq!(
            unframe(&value, None),
            Ok(Unframed { schema: Some(SchemaRef::Id(0x0102_0304)), payload: b"{}" })
        );
        assert_eq!(prefix.get("order.placed", 1), Some(SchemaRef::Id(0x0102_0304)));

        let mut header = SchemaIds::new(SchemaIdForm::Header);
        header.insert("order.placed", 1, 5, Some(guid));
        header.insert("order.placed", 2, 6, None);
        for (version, named) in [(1, SchemaRef::Guid(guid)), (2, SchemaRef::Id(6))] {
            let Some(Frame::Header(h)) = header.frame("order.placed", version) else {
                panic!("a header frame")
            };
            assert_eq!(unframe(b"{}", Some(h)), Ok(Unframed { schema: Some(named), payload: b"{}" }));
        }
        assert_eq!(header.len(), 2);
        assert!(header.frame("order.placed", 3).is_none());
        assert!(header.frame("order.placed", -1).is_none());
        assert!(header.frame("order.shipped", 1).is_none());
        assert!(SchemaIds::new(SchemaIdForm::Header).is_empty());
        assert_eq!("header".parse(), Ok(SchemaIdForm::Header));
        assert!("Header".parse::<SchemaIdForm>().unwrap_err().contains("\"Header\""));
    }
}
