//! Producing records that no safe Rust client can write: header names of any bytes (not
//! UTF-8, NUL inside), null header values, null keys and values, exactly as raw Kafka
//! clients in other languages may send them. rdkafka's safe API takes header names as
//! `&str`, so this goes through librdkafka's `rd_kafka_produceva`, which takes names with
//! their length. Test code only: the library itself never uses `unsafe`.

#![allow(unsafe_code)]

use std::ffi::{c_void, CString};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;

/// One record, as bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawRecord {
    /// The partition to write to.
    pub partition: i32,
    /// The key; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// The value; `None` is a null value (a tombstone).
    pub value: Option<Vec<u8>>,
    /// Headers in order: name bytes and value (`None` is a null value).
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl RawRecord {
    /// A record on `partition` with a text key and value and text headers.
    pub fn text(partition: i32, key: &str, value: &[u8], headers: &[(String, String)]) -> RawRecord {
        RawRecord {
            partition,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.to_vec()),
            headers: headers
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), Some(v.as_bytes().to_vec())))
                .collect(),
        }
    }
}

/// An idempotent producer (records keep their order per partition) writing raw records.
pub struct RawProducer {
    producer: BaseProducer,
}

impl std::fmt::Debug for RawProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawProducer").finish_non_exhaustive()
    }
}

impl RawProducer {
    /// A producer for `bootstrap`.
    pub fn new(bootstrap: &str) -> RawProducer {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.max.bytes", "2000000")
            .create()
            .expect("raw producer");
        RawProducer { producer }
    }

    /// Queues `record` for `topic` (flush to wait for the broker).
    pub fn send(&self, topic: &str, record: &RawRecord) {
        let topic = CString::new(topic).expect("topic without NUL");
        loop {
            // SAFETY: every pointer handed to librdkafka points into `topic`, `record` or
            // `headers`, all alive for the call; RD_KAFKA_MSG_F_COPY makes librdkafka copy
            // key and value; on success it takes ownership of `headers`, on failure we free it.
            let error = unsafe {
                let headers = rd::rd_kafka_headers_new(record.headers.len());
                for (name, value) in &record.headers {
                    let (value_ptr, value_len) = match value {
                        Some(v) => (v.as_ptr().cast::<c_void>(), v.len() as isize),
                        None => (std::ptr::null(), 0),
                    };
                    rd::rd_kafka_header_add(
                        headers,
                        name.as_ptr().cast(),
                        name.len() as isize,
                        value_ptr,
                        value_len,
                    );
                }
                let mut vus: Vec<rd::rd_kafka_vu_t> = Vec::with_capacity(6);
                let mut vu = |vtype, u| vus.push(rd::rd_kafka_vu_t { vtype, u });
                vu(
                    rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC,
                    rd::rd_kafka_vu_s__bindgen_ty_1 { cstr: topic.as_ptr() },
                );
                vu(
                    rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION,
                    rd::rd_kafka_vu_s__bindgen_ty_1 { i32_: record.partition },
                );
                vu(
                    rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                    rd::rd_kafka_vu_s__bindgen_ty_1 { i: rd::RD_KAFKA_MSG_F_COPY },
                );
                let mem = |bytes: &Option<Vec<u8>>| match bytes {
                    Some(b) => rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: b.as_ptr() as *mut c_void,
                        size: b.len(),
                    },
                    None => {
                        rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 { ptr: std::ptr::null_mut(), size: 0 }
                    }
                };
                vu(
                    rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY,
                    rd::rd_kafka_vu_s__bindgen_ty_1 { mem: mem(&record.key) },
                );
                vu(
                    rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                    rd::rd_kafka_vu_s__bindgen_ty_1 { mem: mem(&record.value) },
                );
                vu(rd::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS, rd::rd_kafka_vu_s__bindgen_ty_1 { headers });
                let error =
                    rd::rd_kafka_produceva(self.producer.client().native_ptr(), vus.as_ptr(), vus.len());
                if error.is_null() {
                    None
                } else {
                    rd::rd_kafka_headers_destroy(headers);
                    let code = rd::rd_kafka_error_code(error);
                    rd::rd_kafka_error_destroy(error);
                    Some(code)
                }
            };
            match error {
                None => return,
                Some(rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL) => {
                    self.producer.poll(Duration::from_millis(50));
                }
                Some(code) => panic!("raw produce failed: {code:?}"),
            }
        }
    }

    /// Waits until every queued record is acknowledged.
    pub fn flush(&self) {
        self.producer.flush(Duration::from_secs(60)).expect("flush raw records");
    }
}
