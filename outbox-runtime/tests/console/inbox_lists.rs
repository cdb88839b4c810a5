//! A consumer's records by aggregate id and event type (refused by index name until the
//! inbox's browse indexes exist), its parked messages by Kafka key, text or bytes.

use outbox_runtime::inbox::InboxAdmin;

use super::common::{outbox_cli, stdout};
use super::*;

async fn record(pool: &PgPool, aggregate_id: &str, event_type: &str) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, \
                            bucket, aggregate_type, aggregate_id) \
         VALUES ('billing', $1, $2, 1, 'orders', 0, 0, inbox_bucket($1), 'order', $3)",
    )
    .bind(id)
    .bind(event_type)
    .bind(aggregate_id)
    .execute(pool)
    .await
    .expect("record");
    id
}

fn ids(answer: &Answer, list: &str, field: &str) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(&answer.body).expect(&answer.body);
    json["page"][list]
        .as_array()
        .unwrap_or_else(|| panic!("{list}: {json}"))
        .iter()
        .map(|r| r[field].to_string().trim_matches('"').to_owned())
        .collect()
}

#[sqlx::test(migrations = false)]
async fn inbox_lists_by_aggregate_type_and_kafka_key(pool: PgPool) {
    seed(&pool).await;
    billing_inbox(&pool).await;
    let placed = record(&pool, "o-1", "order.placed").await;
    let paid = record(&pool, "o-1", "order.paid").await;
    let other = record(&pool, "o-2", "order.placed").await;
    let (addr, stop) = serve(&pool, ConsoleConfig::default().inbox("public", "inbox")).await;

    let refused = get(addr, "/inbox/billing?aggregate_id=o-1&format=json").await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("inbox_browse_agg"), "names the index: {}", refused.body);
    // The CLI builds them: the outbox's and the inbox's, once.
    let built = outbox_cli(&pool, &["browse-indexes", "--inbox-table", "inbox"]);
    assert_eq!(built.status.code(), Some(0), "{built:?}");
    for index in ["outbox_browse_agg", "outbox_browse_type", "inbox_browse_agg", "inbox_browse_type"] {
        assert!(stdout(&built).contains(&format!("built {index}\n")), "{}", stdout(&built));
    }
    let again = outbox_cli(&pool, &["browse-indexes", "--inbox-table", "inbox"]);
    assert_eq!(stdout(&again), "the browse indexes were there already\n");
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");
    assert!(admin.missing_browse_indexes().await.expect("missing").is_empty());

    let by_aggregate = get(addr, "/inbox/billing?aggregate_id=o-1&format=json").await;
    assert_eq!(by_aggregate.status, 200, "{}", by_aggregate.body);
    let mut found = ids(&by_aggregate, "records", "event_id");
    found.sort();
    let mut want = vec![placed.to_string(), paid.to_string()];
    want.sort();
    assert_eq!(found, want);
    let by_type = get(addr, "/inbox/billing?event_type=order.placed&format=json").await;
    let mut found = ids(&by_type, "records", "event_id");
    found.sort();
    let mut want = vec![placed.to_string(), other.to_string()];
    want.sort();
    assert_eq!(found, want);
    let page = get(addr, "/inbox/billing?aggregate_id=o-2").await.body;
    assert!(page.contains(&other.to_string()) && !page.contains(&paid.to_string()), "{page}");

    // Parked messages by key: text, and bytes that are not UTF-8 as 0x and hex.
    let parked = |key: &'static str, offset| Parked {
        partition: 0,
        offset,
        key,
        event_type: "order.placed",
        version: 1,
        status: "parked",
        reason: "r",
    };
    park(&pool, &[parked("k-1", 1), parked("k-2", 2)]).await;
    sqlx::query("UPDATE inbox_parked SET record_key = '\\xff00'::bytea WHERE kafka_offset = 2")
        .execute(&pool)
        .await
        .expect("binary key");
    for (key, want) in [("k-1", "k-1"), ("0xff00", "0xff00"), ("k-2", "")] {
        let answer = get(addr, &format!("/inbox/billing/parked?key={key}&format=json")).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let keys = ids(&answer, "messages", "record_key");
        let want: Vec<String> = [want].iter().filter(|w| !w.is_empty()).map(|w| w.to_string()).collect();
        assert_eq!(keys, want, "key {key}");
    }
    stop.cancel();
}
