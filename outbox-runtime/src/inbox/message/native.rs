//! A consumed record's headers, read through librdkafka's C API before the record is
//! detached from the consumer: the crate's only `unsafe` code.
//!
//! rdkafka's safe `Headers::try_get` unwraps `CStr::to_str` on each header name, so a record
//! whose header name is not UTF-8 (any non-Rust producer may write one) panics inside it;
//! under `panic = "abort"` that is the service's death on one foreign record. Here names and
//! values are read as bytes, whatever they hold, and judged later (`text_headers`).
//!
//! A header name with a NUL inside: librdkafka keeps names NUL-terminated and its API hands
//! out only the pointer, so a name `ce_id\0x` reads as `ce_id`. Each header lives in one
//! allocation, its name, a NUL, then its value (`rd_kafka_header_add`), so where a header
//! has a value the name's whole length is the distance to the value less one. The layout
//! is librdkafka's own, not its API: it is checked once per process against a header of a
//! known name ([`layout_holds`]); were it ever different, names would be read up to their
//! first NUL and a warning says so.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use rdkafka::bindings as rd;
use rdkafka::message::BorrowedMessage;
use tracing::warn;

use super::RawHeader;

/// The headers of `message`, names and values as bytes, in order; a header whose name has
/// a NUL inside keeps its whole name (see the module's note).
pub(crate) fn headers(message: &BorrowedMessage<'_>) -> Vec<RawHeader> {
    let mut list: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `message.ptr()` is the consumer's message, alive and not shared while
    // `message` is borrowed. `rd_kafka_message_headers` parses the message's headers on
    // first use and stores in `list` a pointer to the message's own list (not ours to
    // free), or leaves it unset and returns an error when the message has none.
    let error = unsafe { rd::rd_kafka_message_headers(message.ptr(), &raw mut list) };
    if error != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || list.is_null() {
        return Vec::new();
    }
    // SAFETY: `list` is the message's live header list (above).
    unsafe { read_list(list, layout_holds()) }
}

/// Every header of `list`.
///
/// # Safety
/// `list` must point to a live `rd_kafka_headers_t` that nothing changes during the call.
unsafe fn read_list(list: *const rd::rd_kafka_headers_t, whole_names: bool) -> Vec<RawHeader> {
    // SAFETY: `list` is live (the caller's contract).
    let count = unsafe { rd::rd_kafka_header_cnt(list) };
    let mut headers = Vec::with_capacity(count);
    for index in 0..count {
        let (mut name, mut value, mut size): (*const c_char, *const c_void, usize) =
            (std::ptr::null(), std::ptr::null(), 0);
        // SAFETY: `list` is live and `index` below its count; librdkafka writes the
        // header's name (NUL-terminated), its value (or null) and the value's size, all
        // pointing into the header, which lives as long as `list`.
        let error =
            unsafe { rd::rd_kafka_header_get_all(list, index, &raw mut name, &raw mut value, &raw mut size) };
        if error != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: `name` is NUL-terminated and alive while `list` is (above).
        let to_nul = unsafe { CStr::from_ptr(name) }.to_bytes();
        let name_bytes = match value.is_null() {
            false if whole_names => {
                // The name runs up to the NUL just before the value (the checked layout).
                let whole = (value as usize).wrapping_sub(name as usize).wrapping_sub(1);
                if whole > to_nul.len() && whole <= MAX_NAME {
                    // SAFETY: under the layout `layout_holds` checked, the `whole` bytes
                    // from `name` are the header's name, inside the header's allocation.
                    unsafe { std::slice::from_raw_parts(name.cast::<u8>(), whole) }
                } else {
                    to_nul
                }
            }
            _ => to_nul,
        };
        let value = (!value.is_null()).then(|| {
            // SAFETY: a non-null value points to `size` bytes inside the header (above).
            unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
        });
        headers.push(RawHeader { name: Some(name_bytes.to_vec()), value });
    }
    headers
}

/// The longest header name read whole: Kafka's own limit on a name is its varint length,
/// far past anything a producer sends; a distance beyond this is not a name.
const MAX_NAME: usize = 1 << 20;

/// Whether this process's librdkafka lays out a header as its name, a NUL, then its value:
/// checked once on a header named `a\0b` with the value `v`.
fn layout_holds() -> bool {
    static HOLDS: OnceLock<bool> = OnceLock::new();
    *HOLDS.get_or_init(|| {
        let (name, value) = (b"a\0b", b"v");
        // SAFETY: a new list of our own, one header added with explicit sizes (librdkafka
        // copies name and value), read back while the list lives, destroyed once.
        let holds = unsafe {
            let list = rd::rd_kafka_headers_new(1);
            if list.is_null() {
                return false;
            }
            rd::rd_kafka_header_add(
                list,
                name.as_ptr().cast::<c_char>(),
                name.len() as isize,
                value.as_ptr().cast::<c_void>(),
                value.len() as isize,
            );
            let read = read_list(list, true);
            rd::rd_kafka_headers_destroy(list);
            read.len() == 1
                && read[0].name.as_deref() == Some(name.as_slice())
                && read[0].value.as_deref() == Some(value.as_slice())
        };
        if !holds {
            warn!(
                stage = "consume",
                "this librdkafka does not keep a header's name next to its value: \
                  header names with a NUL inside are read up to the NUL"
            );
        }
        holds
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type Header = (Vec<u8>, Option<Vec<u8>>);

    fn header(name: &[u8], value: Option<&[u8]>) -> Header {
        (name.to_vec(), value.map(<[u8]>::to_vec))
    }

    /// Reads back a list built with explicit sizes.
    fn round_trip(headers: &[Header]) -> Vec<Header> {
        // SAFETY: as in `layout_holds`: a list of our own, read while it lives, destroyed once.
        let read = unsafe {
            let list = rd::rd_kafka_headers_new(headers.len());
            for (name, value) in headers {
                let (v, len) = value
                    .as_ref()
                    .map_or((std::ptr::null(), 0), |v| (v.as_ptr().cast::<c_void>(), v.len() as isize));
                rd::rd_kafka_header_add(list, name.as_ptr().cast::<c_char>(), name.len() as isize, v, len);
            }
            let read = read_list(list, layout_holds());
            rd::rd_kafka_headers_destroy(list);
            read
        };
        read.into_iter().map(|h| (h.name.expect("a name"), h.value)).collect()
    }

    #[test]
    fn the_layout_holds_for_the_librdkafka_we_build() {
        assert!(layout_holds(), "names with a NUL inside would be read up to the NUL");
    }

    #[test]
    fn names_and_values_of_any_bytes_are_read_whole() {
        let cases = vec![
            header(b"ce_id", Some(b"1")),
            header(&[0xff, 0xfe, b'x'], Some(b"v")),
            header(b"ce_id\0tail", Some(b"2")),
            header(b"\0", Some(b"")),
            header(b"empty", Some(b"")),
            header(b"null", None),
            header(b"bytes", Some(&[0, 1, 2, 0xff])),
            header(b"", Some(b"v")),
        ];
        assert_eq!(round_trip(&cases), cases);
    }

    #[test]
    fn a_null_valued_name_with_a_nul_reads_up_to_it() {
        // No value to measure the name by: what every C client reads.
        assert_eq!(round_trip(&[header(b"ce_id\0tail", None)]), vec![header(b"ce_id", None)]);
    }

    /// The crate denies `unsafe_code`; this module alone allows it.
    #[test]
    fn only_one_module_is_unsafe() {
        fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).expect("source");
                    if text.contains(concat!("allow(", "unsafe_code)")) {
                        found.push(path.display().to_string());
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut found);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].ends_with("inbox/message/native.rs"), "{found:?}");
    }
}
