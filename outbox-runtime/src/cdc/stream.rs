//! The replication session: the connection's settings, and the reader that turns the
//! stream into items for the publisher while reporting the confirmed position back.

use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::decode::{self, Layout, Message};
use super::CdcConfig;
use crate::error::{Error, Result};
use crate::relay::claim::Row;

/// The session settings every value in the stream is printed with: timestamps in UTC and
/// ISO format, as [`decode::rfc3339`] reads them.
const SESSION_OPTIONS: &str = "-c datestyle=ISO -c timezone=UTC -c extra_float_digits=3";

/// Messages the replication client reads ahead of the reader.
const CLIENT_BUFFER: usize = 256;

/// The replication connection `config`'s URL describes.
pub(crate) fn connection(config: &CdcConfig) -> Result<ReplicationConfig> {
    let bad = |why: &str| Error::Config(format!("CdcConfig::new: the replication URL {why}"));
    let url = url::Url::parse(&config.url).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(bad("must start with postgres:// or postgresql://"));
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    let mut host = match url.host() {
        Some(url::Host::Ipv6(address)) => address.to_string(),
        Some(host) => host.to_string(),
        None => String::new(),
    };
    let user = if url.username().is_empty() { "postgres".to_owned() } else { decode(url.username()) };
    let password = url.password().map(decode).unwrap_or_default();
    let path = url.path().trim_start_matches('/');
    let database = if path.is_empty() { user.clone() } else { decode(path) };
    let mut tls = TlsConfig::disabled();
    let mut application = "outbox-cdc".to_owned();
    for (key, value) in url.query_pairs() {
        match key.as_ref() {
            "host" => host = value.into_owned(),
            "application_name" => application = value.into_owned(),
            "sslmode" => {
                tls = match value.as_ref() {
                    "disable" | "allow" | "prefer" if !cfg!(feature = "cdc-tls") => TlsConfig::disabled(),
                    "disable" => TlsConfig::disabled(),
                    _ if !cfg!(feature = "cdc-tls") => {
                        return Err(bad(&format!(
                        "asks for sslmode={value}: TLS on the replication connection needs outbox-runtime's \
                             feature cdc-tls"
                    )))
                    }
                    "allow" | "prefer" | "require" => TlsConfig::require(),
                    "verify-ca" => TlsConfig::verify_ca(None),
                    "verify-full" => TlsConfig::verify_full(None),
                    other => return Err(bad(&format!("has an unknown sslmode {other:?}"))),
                }
            }
            _ => {}
        }
    }
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    Ok(ReplicationConfig::new(
        host,
        user,
        password,
        database,
        config.slot.clone(),
        config.publication.as_str(),
    )
    .with_port(url.port().unwrap_or(5432))
    .with_tls(tls)
    .with_status_interval(config.status_interval)
    // Status updates every status interval even while the position stands still (Kafka
    // down): the client's default, 10 s, let a server with a short wal_sender_timeout
    // ask for replies the relay cannot give, and the stream end again and again.
    .with_wakeup_interval(config.status_interval)
    // What the client reads ahead of the relay, outside its memory budget: a few hundred
    // messages, not the client's 8,192 (of events up to 1 GiB each).
    .with_buffer_size(CLIENT_BUFFER)
    .with_options(SESSION_OPTIONS)
    .with_application_name(application))
}

/// What the reader hands the publisher, in stream order.
#[derive(Debug)]
pub(crate) enum Item {
    /// A transaction begins: its id (32 bits, as the stream gives it).
    Begin(u32),
    /// An event inserted by it, with its share of the memory budget.
    Row(Box<Row>, OwnedSemaphorePermit),
    /// It committed; the position after it.
    Commit(u64),
    /// A position past everything received (a keepalive's end, a heartbeat).
    Position(u64),
}

/// Why a session ended without a shutdown.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Another process streams from the slot (SQLSTATE 55006).
    Busy(String),
    /// The connection or the server failed: try again.
    Transient(String),
    /// What cannot be fixed by trying again.
    Fatal(Error),
}

/// The SQLSTATE a server error's text ends with, as the replication client reports it.
pub(crate) fn sqlstate(error: &pgwire_replication::PgWireError) -> Option<String> {
    let text = error.to_string();
    let start = text.rfind("(SQLSTATE ")? + "(SQLSTATE ".len();
    text.get(start..start + 5).map(str::to_owned)
}

/// Classifies a replication client's error.
pub(crate) fn ended(error: &pgwire_replication::PgWireError, slot: &str) -> Ended {
    use pgwire_replication::PgWireError as E;
    let text = error.to_string();
    match (sqlstate(error).as_deref(), error) {
        (Some("55006"), _) => Ended::Busy(text),
        // undefined_object: the publication or the slot was dropped.
        (Some("42704"), _) if text.contains("publication") => Ended::Fatal(Error::Replication(format!(
            "the publication of slot {slot:?} no longer exists ({text}): events written since are not streamed. \
             Run `outbox cdc setup` again (it hands the pending events to the table path), then start the relay"
        ))),
        (Some("42704"), _) => Ended::Fatal(Error::Replication(format!(
            "replication slot {slot:?} no longer exists ({text}): the relay never creates one itself. Events written \
             since it was dropped are not in any stream: recover them with a backfill (`outbox relay --backfill`), \
             then set the slot up again (`outbox cdc setup`)"
        ))),
        // insufficient_privilege, invalid_authorization_specification, invalid_password.
        (Some("42501" | "28000" | "28P01"), _) | (_, E::Auth(_) | E::Tls(_)) => {
            Ended::Fatal(Error::Replication(format!("the replication connection is refused: {text}")))
        }
        (Some(code), _) if code.starts_with("55") || code == "58P01" => {
            // object_not_in_prerequisite_state other than 55006, e.g. a slot whose WAL was removed.
            if text.contains("can no longer") || text.contains("invalidated") || text.contains("removed") {
                Ended::Fatal(super::setup::lost(slot))
            } else {
                Ended::Transient(text)
            }
        }
        _ => Ended::Transient(text),
    }
}

/// How long the relay may take to confirm the position of a keepalive the server asked it
/// to answer before it ends the stream (see [`read`]): long enough for events already sent
/// to be acknowledged and marked.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

/// The reader's ends of the session: items out to the publisher, confirmed positions back
/// from it, and the memory budget of the events in between.
#[derive(Debug)]
pub(crate) struct Feed {
    pub(crate) items: mpsc::Sender<Item>,
    pub(crate) confirmed: watch::Receiver<u64>,
    pub(crate) budget: Arc<Semaphore>,
    /// The budget's size: the most one event takes of it.
    pub(crate) max_bytes: usize,
}

/// Reads the stream of the outbox table `schema.table` until shutdown or an error, sending
/// items in order to the publisher and reporting each confirmed position it sends back.
pub(crate) async fn read(
    client: &mut ReplicationClient,
    (schema, table): (&str, &str),
    slot: &str,
    feed: Feed,
    shutdown: &CancellationToken,
) -> std::result::Result<(), Ended> {
    let Feed { items, mut confirmed, budget, max_bytes } = feed;
    let mut ours: Option<(u32, Layout)> = None;
    let mut asked = Asked::new(client);
    let mut look = tokio::time::interval(LOOK_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let answer_by = asked.by();
        let event = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            changed = confirmed.changed() => {
                report(client, &mut confirmed, changed)?;
                continue;
            }
            _ = look.tick() => {
                asked.look(&confirmed)?;
                continue;
            }
            () = until(answer_by), if answer_by.is_some() => {
                asked.look(&confirmed)?;
                continue;
            }
            event = client.recv() => event,
        };
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => return Err(Ended::Transient("the server ended the replication stream".to_owned())),
            Err(error) => return Err(ended(&error, slot)),
        };
        let item = match event {
            ReplicationEvent::Begin { xid, .. } => Item::Begin(xid),
            ReplicationEvent::Commit { end_lsn, .. } => Item::Commit(end_lsn.0),
            ReplicationEvent::KeepAlive { wal_end, reply_requested, .. } => {
                if reply_requested {
                    debug!(stage = "stream", slot, wal_end = %wal_end, confirmed = %Lsn(*confirmed.borrow()),
                           "the server asks for a reply");
                    asked.look(&confirmed)?;
                }
                Item::Position(wal_end.0)
            }
            // Non-transactional logical messages (heartbeats) are past everything before them.
            ReplicationEvent::Message { transactional: false, lsn, .. } => Item::Position(lsn.0),
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => continue,
            ReplicationEvent::XLogData { data, .. } => match decode::message(&data) {
                Ok(Message::Relation(relation)) => {
                    if relation.namespace == schema && relation.name == table {
                        let layout =
                            Layout::of(&relation).map_err(|e| Ended::Fatal(Error::Replication(e.0)))?;
                        debug!(
                            stage = "stream",
                            relation = relation.id,
                            columns = relation.columns.len(),
                            "outbox table layout"
                        );
                        ours = Some((relation.id, layout));
                    }
                    continue;
                }
                Ok(Message::Insert { relation, tuple }) => {
                    let Some((_, layout)) = ours.as_ref().filter(|(id, _)| *id == relation) else {
                        if ours.is_none() {
                            debug!(
                                stage = "stream",
                                relation, "insert into another table of the publication"
                            );
                        }
                        continue;
                    };
                    let row = layout.row(tuple).map_err(|e| {
                        Ended::Fatal(Error::Replication(format!(
                            "an inserted row of {schema}.{table} is unreadable: {e}"
                        )))
                    })?;
                    let size = row.payload.len() + row.headers.len() + row.aggregate_id.len() + 256;
                    let permits = u32::try_from(size.min(max_bytes)).unwrap_or(u32::MAX);
                    let permit = loop {
                        let answer_by = asked.by();
                        tokio::select! {
                            () = shutdown.cancelled() => return Ok(()),
                            changed = confirmed.changed() => report(client, &mut confirmed, changed)?,
                            _ = look.tick() => asked.look(&confirmed)?,
                            () = until(answer_by), if answer_by.is_some() => asked.look(&confirmed)?,
                            permit = budget.clone().acquire_many_owned(permits) => break permit.map_err(|_| {
                                Ended::Transient("the memory budget was closed".to_owned())
                            })?,
                        }
                    };
                    Item::Row(Box::new(row), permit)
                }
                Ok(Message::Change(tag)) => {
                    warn!(stage = "stream", slot, tag = %tag,
                          "the publication sends updates, deletes or truncates; only inserts are relayed");
                    continue;
                }
                Ok(Message::Other) => continue,
                Err(error) => {
                    return Err(Ended::Fatal(Error::Replication(format!(
                        "slot {slot:?} sent a message the relay cannot read: {error}"
                    ))))
                }
            },
        };
        // A full channel waits here; the client keeps answering the server's keepalives.
        let slot = loop {
            let answer_by = asked.by();
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                changed = confirmed.changed() => report(client, &mut confirmed, changed)?,
                _ = look.tick() => asked.look(&confirmed)?,
                () = until(answer_by), if answer_by.is_some() => asked.look(&confirmed)?,
                slot = items.reserve() => match slot {
                    Ok(slot) => break slot,
                    Err(_) => return Ok(()),
                },
            }
        };
        slot.send(item);
    }
}

/// Resolves at `by` (never without one).
async fn until(by: Option<tokio::time::Instant>) {
    match by {
        Some(by) => tokio::time::sleep_until(by).await,
        None => std::future::pending().await,
    }
}

/// How often the reader looks at the client's count of the server's requests for a reply,
/// whatever it is waiting for.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The server's requests for a reply, as the client counts them (it answers them itself,
/// with the position the relay last confirmed), and the one the relay has yet to confirm.
///
/// The client's status updates go out every status interval, so the server asks only when
/// it is shutting down (a walsender exits once its client confirmed everything it sent) or
/// has not heard from the relay for half of `wal_sender_timeout`. Events still unconfirmed
/// (Kafka down, marks failing as the server stops) would hold a fast shutdown of PostgreSQL
/// for as long as they last: unless the relay confirms the position asked about within
/// [`ANSWER_WITHIN`], the stream ends, and what was not confirmed is streamed again.
struct Asked {
    metrics: Arc<pgwire_replication::ReplicationMetrics>,
    replies: u64,
    pending: Option<(u64, tokio::time::Instant)>,
}

impl Asked {
    fn new(client: &ReplicationClient) -> Self {
        let metrics = client.metrics();
        Asked { replies: metrics.keepalive_replies(), metrics, pending: None }
    }

    /// When the relay must have confirmed what the server asked about.
    fn by(&self) -> Option<tokio::time::Instant> {
        self.pending.map(|(_, by)| by)
    }

    /// Takes note of requests since the last look and of what the relay confirmed since;
    /// ends the stream when a request went unanswered past its time.
    fn look(&mut self, confirmed: &watch::Receiver<u64>) -> std::result::Result<(), Ended> {
        let confirmed = *confirmed.borrow();
        let replies = self.metrics.keepalive_replies();
        if replies > self.replies {
            self.replies = replies;
            let end = self.metrics.last_wal_end().0;
            if self.pending.is_none() && confirmed < end {
                self.pending = Some((end, tokio::time::Instant::now() + ANSWER_WITHIN));
            }
        }
        match self.pending {
            Some((end, _)) if confirmed >= end => {
                self.pending = None;
                Ok(())
            }
            Some((_, by)) if tokio::time::Instant::now() >= by => Err(Ended::Transient(format!(
                "the server asked for the final position (shutting down?) while events after {} are not \
                 confirmed; ending the stream so that it is not held",
                Lsn(confirmed)
            ))),
            _ => Ok(()),
        }
    }
}

/// Reports a confirmed position the publisher sent (it stopped if `changed` failed).
fn report(
    client: &ReplicationClient,
    confirmed: &mut watch::Receiver<u64>,
    changed: std::result::Result<(), watch::error::RecvError>,
) -> std::result::Result<(), Ended> {
    if changed.is_err() {
        return Err(Ended::Transient("the publisher stopped".to_owned()));
    }
    client.update_applied_lsn(Lsn(*confirmed.borrow_and_update()));
    Ok(())
}
