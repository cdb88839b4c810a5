//! W3C trace context end to end (feature `opentelemetry`): the span that appends an event
//! is the parent of the consumer's handler span, through the outbox row, the relay's Kafka
//! headers and the inbox; a replayed duplicate's span links to it. Spans are read back from
//! OpenTelemetry's in-memory exporter, the subscriber installed for this test binary alone.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::ops::ReplayFilter;
use outbox_runtime::{AppendOptions, OutboxEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use uuid::Uuid;

/// This test's event, on a topic of its own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.traced", schema_version = 1, aggregate = "account", topic = "trace-context")]
struct Traced {
    #[outbox(aggregate_id)]
    account: String,
}

#[derive(Debug, Clone)]
struct Recorder;

impl EventHandler<Traced> for Recorder {
    async fn handle(&self, tx: &mut PgConnection, _: Traced, meta: &Meta) -> Result<(), HandlerError> {
        // A span of the handler's own: it must be in the appender's trace as well.
        let span = tracing::info_span!("recorder_insert");
        sqlx::query("INSERT INTO traced (event_id) VALUES ($1)")
            .bind(meta.event_id)
            .execute(&mut *tx)
            .instrument(span)
            .await?;
        Ok(())
    }
}

/// The exporter behind the process's one subscriber.
fn exporter() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only subscriber of this test binary");
        (exporter, provider)
    })
}

fn finished() -> Vec<SpanData> {
    let (exporter, provider) = exporter();
    provider.force_flush().expect("flush");
    exporter.get_finished_spans().expect("spans")
}

fn named<'s>(spans: &'s [SpanData], name: &str, event_id: Uuid) -> Vec<&'s SpanData> {
    let id = event_id.to_string();
    spans
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| s.attributes.iter().any(|kv| kv.key.as_str() == "event_id" && kv.value.as_str() == id))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn the_handlers_span_is_a_child_of_the_appending_span_and_a_duplicate_links_to_it(pool: PgPool) {
    exporter();
    let kafka = Kafka::start();
    kafka.create_topic("trace-context", 2).await;
    let outbox = migrate(&pool).await;
    sqlx::query("CREATE TABLE traced (event_id uuid NOT NULL)").execute(&pool).await.expect("table");

    // The request that appends, and its ids as OpenTelemetry sees them.
    let request = tracing::info_span!("place_order");
    let (trace_id, span_id): (TraceId, SpanId) = {
        let cx = request.context();
        let span = cx.span();
        (span.span_context().trace_id(), span.span_context().span_id())
    };
    assert_ne!(trace_id, TraceId::INVALID, "the subscriber traces");
    let account = format!("acct-{}", Uuid::new_v4().simple());
    let traced = async {
        let mut tx = pool.begin().await.expect("begin");
        let id = outbox.append(&mut tx, &Traced { account: account.clone() }).await.expect("append");
        tx.commit().await.expect("commit");
        id
    }
    .instrument(request.clone())
    .await;
    drop(request);
    // Appended outside any span: no trace context. With one of the caller's own: kept.
    let mut tx = pool.begin().await.expect("begin");
    let untraced = outbox.append(&mut tx, &Traced { account: account.clone() }).await.expect("append");
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let explicit = outbox
        .append_with(
            &mut tx,
            &Traced { account: account.clone() },
            AppendOptions::default().header("traceparent", own),
        )
        .await
        .expect("append");
    let garbled = outbox
        .append_with(
            &mut tx,
            &Traced { account: account.clone() },
            AppendOptions::default().header("traceparent", "00-not-a-trace-01"),
        )
        .await
        .expect("append");
    tx.commit().await.expect("commit");

    let header = |id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT headers::jsonb->>'traceparent' FROM outbox WHERE event_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("row")
        }
    };
    assert_eq!(header(traced).await, Some(format!("00-{trace_id}-{span_id}-01")), "captured on the row");
    assert_eq!(header(untraced).await, None, "no span, no trace context");
    assert_eq!(header(explicit).await.as_deref(), Some(own), "the caller's own is kept");

    let relay = start(&pool, &outbox, quick(&kafka));
    let consumer = format!("trace-{}", Uuid::new_v4().simple());
    let config = InboxConfig::new(consumer, kafka.bootstrap(), ["trace-context"])
        .commit_interval(Duration::from_millis(100));
    let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<Traced, _>(Recorder)).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate inbox");
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    let traced_rows = |n: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM traced").fetch_one(&pool).await.expect("count")
                == n
        }
    };
    assert!(eventually(Duration::from_secs(60), || traced_rows(4)).await, "the 4 events applied");

    // A replay delivers the traced event again; the inbox absorbs it as a duplicate.
    let filter = ReplayFilter { aggregate_id: Some(account.clone()), ..ReplayFilter::default() };
    let replayed = outbox.ops().replay(&pool, &filter, false).await.expect("replay");
    assert_eq!(replayed.replayed, 4, "{replayed:?}");
    // At least once: Kafka may also redeliver before the replay (a rebalance).
    let duplicates = || async { !named(&finished(), "inbox_duplicate", traced).is_empty() };
    assert!(eventually(Duration::from_secs(60), duplicates).await, "the duplicate was seen");
    stop.cancel();
    task.await.expect("inbox task").expect("inbox ends cleanly");
    relay.shutdown().await;
    assert!(traced_rows(4).await, "applied once each");

    let spans = finished();
    let handled = named(&spans, "inbox_handle", traced);
    assert_eq!(handled.len(), 1, "one handler span for the traced event: {handled:?}");
    let handled = handled[0];
    assert_eq!(handled.span_context.trace_id(), trace_id, "the consumer's span is in the appender's trace");
    assert_eq!(handled.parent_span_id, span_id, "its parent is the span that appended");
    let insert: Vec<&SpanData> = spans.iter().filter(|s| s.name == "recorder_insert").collect();
    assert!(
        insert
            .iter()
            .any(|s| s.span_context.trace_id() == trace_id
                && s.parent_span_id == handled.span_context.span_id()),
        "the handler's own spans are children of its span: {insert:?}"
    );

    for duplicate in named(&spans, "inbox_duplicate", traced) {
        assert_ne!(duplicate.span_context.trace_id(), trace_id, "a duplicate is not part of the request");
        let links: Vec<(TraceId, SpanId)> =
            duplicate.links.iter().map(|l| (l.span_context.trace_id(), l.span_context.span_id())).collect();
        assert_eq!(links, vec![(trace_id, span_id)], "the duplicate links to the appending span");
    }

    let other = named(&spans, "inbox_handle", explicit);
    assert_eq!(other.len(), 1, "{other:?}");
    assert_eq!(other[0].span_context.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
    // A traceparent that is not one: applied all the same, in a trace of its own.
    let garbled = named(&spans, "inbox_handle", garbled);
    assert_eq!(garbled.len(), 1, "{garbled:?}");
    assert!(![trace_id, other[0].span_context.trace_id()].contains(&garbled[0].span_context.trace_id()));
    let plain = named(&spans, "inbox_handle", untraced);
    assert_eq!(plain.len(), 1, "{plain:?}");
    assert!(![trace_id, other[0].span_context.trace_id()].contains(&plain[0].span_context.trace_id()));
}
