//! The wire format of records whose schema a registry names, as Confluent's serializers
//! write it and its deserializers read it:
//!
//! - **prefix**: the value is magic byte `0x00`, the schema's id as a 4-byte big-endian
//!   integer, then the payload ([`prefix`]);
//! - **header**: the value is the payload alone, and a header, `__value_schema_id` (or
//!   `__key_schema_id` for a key), holds magic byte `0x01` and the schema's 16-byte GUID
//!   ([`guid_header`]).
//!
//! [`unframe`] reads either (the header first, as the deserializers do), or an unframed
//! value; a JSON value cannot begin with a control byte, so anything else that begins
//! with one is a frame this crate does not know, reported with the byte.

use std::fmt;

/// The magic byte of a schema id prefix (`0x00`).
pub const MAGIC_ID: u8 = 0x00;
/// The magic byte of a schema GUID (`0x01`).
pub const MAGIC_GUID: u8 = 0x01;
/// The header naming the value's schema.
pub const VALUE_SCHEMA_ID_HEADER: &str = "__value_schema_id";
/// The header naming the key's schema.
pub const KEY_SCHEMA_ID_HEADER: &str = "__key_schema_id";

/// A schema as a record names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SchemaRef {
    /// A registry's global schema id (the prefix form).
    Id(u32),
    /// A registry's schema GUID (the header form).
    Guid([u8; 16]),
}

impl fmt::Display for SchemaRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaRef::Id(id) => write!(f, "schema id {id}"),
            SchemaRef::Guid(g) => {
                write!(f, "schema guid ")?;
                for (i, b) in g.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// `payload` behind the id prefix: `0x00`, `id` big-endian, `payload`.
pub fn prefix(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(MAGIC_ID);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The value of a `__value_schema_id` header for `guid`: `0x01` and the 16 bytes.
pub fn guid_header(guid: [u8; 16]) -> [u8; 17] {
    let mut out = [0; 17];
    out[0] = MAGIC_GUID;
    out[1..].copy_from_slice(&guid);
    out
}

/// A GUID from its text form (`8-4-4-4-12` hexadecimal digits, as registries print it).
pub fn parse_guid(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    let mut out = [0; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// A value read: the schema it names, if any, and the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unframed<'a> {
    /// The schema the frame or header names; `None` for an unframed value.
    pub schema: Option<SchemaRef>,
    /// The payload.
    pub payload: &'a [u8],
}

/// Why a value's frame cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The value begins with a control byte that is neither magic byte.
    #[error("unknown magic byte 0x{0:02x}: the value is neither JSON nor a schema registry frame (magic byte 0x00 or 0x01)")]
    UnknownMagicByte(u8),
    /// The value is shorter than its frame.
    #[error(
        "truncated schema registry frame: magic byte 0x{magic:02x} needs {needed} bytes, the value has {len}"
    )]
    Truncated {
        /// The magic byte.
        magic: u8,
        /// The bytes the frame needs.
        needed: usize,
        /// The value's length.
        len: usize,
    },
    /// The schema id header is not magic byte 1 and a GUID (or magic byte 0 and an id).
    #[error("header {name}: expected 0x01 and a 16-byte GUID (or 0x00 and a 4-byte id), got {len} bytes beginning {first}")]
    BadHeader {
        /// The header's name.
        name: String,
        /// Its length.
        len: usize,
        /// Its first byte, as text.
        first: String,
    },
}

/// Reads `value` and the value of its `__value_schema_id` header, when it has one.
pub fn unframe<'a>(value: &'a [u8], header: Option<&[u8]>) -> Result<Unframed<'a>, FrameError> {
    if let Some(h) = header {
        let schema = match (h.first(), h.len()) {
            (Some(&MAGIC_GUID), 17) => SchemaRef::Guid(h[1..].try_into().unwrap_or_default()),
            (Some(&MAGIC_ID), 5) => SchemaRef::Id(u32::from_be_bytes([h[1], h[2], h[3], h[4]])),
            (first, len) => {
                return Err(FrameError::BadHeader {
                    name: VALUE_SCHEMA_ID_HEADER.to_owned(),
                    len,
                    first: first.map_or_else(|| "(empty)".to_owned(), |b| format!("0x{b:02x}")),
                })
            }
        };
        return Ok(Unframed { schema: Some(schema), payload: value });
    }
    match value.first() {
        Some(&MAGIC_ID) => {
            let id = value.get(1..5).ok_or(FrameError::Truncated {
                magic: MAGIC_ID,
                needed: 5,
                len: value.len(),
            })?;
            Ok(Unframed {
                schema: Some(SchemaRef::Id(u32::from_be_bytes([id[0], id[1], id[2], id[3]]))),
                payload: &value[5..],
            })
        }
        Some(&MAGIC_GUID) => {
            let guid = value.get(1..17).ok_or(FrameError::Truncated {
                magic: MAGIC_GUID,
                needed: 17,
                len: value.len(),
            })?;
            Ok(Unframed {
                schema: Some(SchemaRef::Guid(guid.try_into().unwrap_or_default())),
                payload: &value[17..],
            })
        }
        // JSON text begins with whitespace (tab, line feed, carriage return, space) or a
        // printable character; any other control byte is a frame of another kind.
        Some(&b) if b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r') => Err(FrameError::UnknownMagicByte(b)),
        _ => Ok(Unframed { schema: None, payload: value }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_say_why() {
        let framed = prefix(0x0102_0304, b"{}");
        assert_eq!(framed, [0, 1, 2, 3, 4, b'{', b'}']);
        assert_eq!(
            unframe(&framed, None),
            Ok(Unframed { schema: Some(SchemaRef::Id(0x0102_0304)), payload: b"{}" })
        );
        let guid = parse_guid("0190a1f2-4c6e-7b1a-9d2e-3f4a5b6c7d8e").expect("guid");
        assert_eq!(SchemaRef::Guid(guid).to_string(), "schema guid 0190a1f2-4c6e-7b1a-9d2e-3f4a5b6c7d8e");
        let header = guid_header(guid);
        assert_eq!(
            unframe(b"{}", Some(&header)),
            Ok(Unframed { schema: Some(SchemaRef::Guid(guid)), payload: b"{}" })
        );
        let mut guid_prefixed = header.to_vec();
        guid_prefixed.extend_from_slice(b"[1]");
        assert_eq!(unframe(&guid_prefixed, None).map(|u| u.payload), Ok(&b"[1]"[..]));
        // Unframed JSON, leading whitespace included.
        for plain in [&b"{}"[..], b" {}", b"\n[]", b"\t1", b"\"x\"", b""] {
            assert_eq!(unframe(plain, None), Ok(Unframed { schema: None, payload: plain }));
        }
        assert_eq!(unframe(&[0, 0, 1], None), Err(FrameError::Truncated { magic: 0, needed: 5, len: 3 }));
        assert_eq!(unframe(&[1; 10], None), Err(FrameError::Truncated { magic: 1, needed: 17, len: 10 }));
        assert_eq!(unframe(&[2, b'{'], None), Err(FrameError::UnknownMagicByte(2)));
        assert!(unframe(b"{}", Some(&[1, 2])).unwrap_err().to_string().contains("header __value_schema_id"));
        assert!(unframe(&[7], None).unwrap_err().to_string().contains("unknown magic byte 0x07"));
        assert_eq!(parse_guid("0190a1f24c6e7b1a9d2e3f4a5b6c7d8e"), None);
        assert_eq!(parse_guid("0190a1f2-4c6e-7b1a-9d2e-3f4a5b6c7dzz"), None);
    }
}
