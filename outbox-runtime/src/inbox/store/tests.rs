use super::*;
use crate::inbox::{Handlers, Inbox, InboxConfig};

/// Whether a scan node reads through an index (a bitmap heap scan reads the pages a
/// bitmap index scan below it found).
fn by_index(node: &str) -> bool {
    node.starts_with("Index") || node == "Bitmap Heap Scan"
}

/// Scan nodes of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan: (node type, relation, rows read).
fn scans(node: &serde_json::Value, found: &mut Vec<(String, String, u64)>) {
    // A partition pruned at run time is never executed ("Actual Loops": 0): it reads
    // nothing, whatever plan it was given.
    let pruned = node["Actual Loops"].as_f64() == Some(0.0);
    if let Some(relation) = node["Relation Name"].as_str() {
        if node["Node Type"] != "ModifyTable" && !pruned {
            let rows = node["Actual Rows"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Filter"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Index Recheck"].as_f64().unwrap_or(0.0);
            let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            found.push((
                node["Node Type"].as_str().unwrap_or("").to_owned(),
                relation.to_owned(),
                (rows * loops) as u64,
            ));
        }
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        scans(child, found);
    }
}

/// Issue 13: every statement the inbox runs per message keeps an index plan that reads
/// a handful of rows, with 100,000 rows in each inbox table, whether the tables were
/// last analysed empty (a consumer that caught up on a backlog while autovacuum was
/// behind) or after the load.
#[sqlx::test(migrations = false)]
async fn per_message_statements_read_a_handful_of_rows_whatever_the_statistics(pool: PgPool) {
    let config = InboxConfig::new("c", "127.0.0.1:1", ["t"]);
    let inbox = Inbox::new(pool.clone(), config, Handlers::new()).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query("ANALYZE inbox, inbox_parked, inbox_aggregates").execute(&pool).await.expect("analyze empty");
    // Half the rows in the legacy partition, as a converted table's.
    for load in [
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, aggregate_type, aggregate_id, \
                            aggregate_version, topic, kafka_partition, kafka_offset, bucket) \
         SELECT 'c', id, 'e', 1, 'a', 'id' || g, 1, 't', 0, g, CASE WHEN g % 2 = 0 THEN -2 ELSE inbox_bucket(id) END \
         FROM (SELECT g, gen_random_uuid() AS id FROM generate_series(1, 100000) g) s",
        "INSERT INTO inbox_aggregates (consumer, topic, aggregate_type, aggregate_id, last_version) \
         SELECT 'c', 't', 'a', 'id' || g, 1 FROM generate_series(1, 100000) g",
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, \
                                   status, reason) \
         SELECT 'c', 't', 0, g, convert_to('k' || (g % 1000), 'UTF8'), '{}', '', \
                CASE WHEN g % 100 = 0 THEN 'parked' ELSE 'discarded' END, 'r' \
         FROM generate_series(1, 100000) g",
    ] {
        sqlx::query(load).execute(&pool).await.expect("load");
    }
    let store = &inbox.store;
    let event = uuid::Uuid::new_v4();
    for analysed in [false, true] {
        if analysed {
            sqlx::query("ANALYZE inbox, inbox_parked, inbox_aggregates")
                .execute(&pool)
                .await
                .expect("analyze");
        }
        let mut tx = pool.begin().await.expect("begin");
        let explain = |statement: &SqlStr| {
            crate::table::sql(format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", statement.as_str()))
        };
        let mut plans: Vec<(&str, serde_json::Value)> = Vec::new();
        let key = b"k7".to_vec();
        plans.push((
            "find_hold",
            sqlx::query_scalar(explain(&store.find_hold))
                .bind("c")
                .bind("t")
                .bind(&key)
                .bind(0)
                .bind(5_i64)
                .fetch_one(&mut *tx)
                .await
                .expect("find_hold"),
        ));
        plans.push((
            "insert_inbox",
            // A new install: the partitioned layout's statement (index 1).
            sqlx::query_scalar(explain(&store.insert_inbox[1]))
                .bind("c")
                .bind(event)
                .bind("e")
                .bind(1)
                .bind("a")
                .bind("id7")
                .bind(2_i64)
                .bind("t")
                .bind(0)
                .bind(200_000_i64)
                .bind(None::<String>)
                .bind(None::<String>)
                .fetch_one(&mut *tx)
                .await
                .expect("insert_inbox"),
        ));
        plans.push((
            "version",
            sqlx::query_scalar(explain(&store.version))
                .bind("c")
                .bind("a")
                .bind("id7")
                .bind("t")
                .fetch_one(&mut *tx)
                .await
                .expect("version"),
        ));
        plans.push((
            "first_version",
            sqlx::query_scalar(explain(&store.first_version))
                .bind("c")
                .bind("a")
                .bind("new")
                .bind(1_i64)
                .bind("t")
                .fetch_one(&mut *tx)
                .await
                .expect("first_version"),
        ));
        plans.push((
            "bump_version",
            sqlx::query_scalar(explain(&store.bump_version))
                .bind("c")
                .bind("a")
                .bind("id7")
                .bind(2_i64)
                .bind(0_i64)
                .bind("t")
                .fetch_one(&mut *tx)
                .await
                .expect("bump_version"),
        ));
        plans.push((
            "mark_stale",
            sqlx::query_scalar(explain(&store.mark_stale[1]))
                .bind("c")
                .bind("a")
                .bind("id8")
                .bind(event)
                .bind("t")
                .fetch_one(&mut *tx)
                .await
                .expect("mark_stale"),
        ));
        plans.push((
            "parked_status",
            sqlx::query_scalar(explain(&store.parked_status))
                .bind("c")
                .bind("t")
                .bind(0)
                .bind(100_i64)
                .fetch_one(&mut *tx)
                .await
                .expect("parked_status"),
        ));
        // The batch statements, for 50 records of 50 aggregates.
        let topics = vec!["t"; 50];
        let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("k{i}").into_bytes()).collect();
        let types = vec!["a"; 50];
        let ids: Vec<String> = (0..50).map(|i| format!("id{}", i * 7)).collect();
        let numbers = vec![5_i64; 50];
        let mut batch_plans: Vec<(&str, serde_json::Value)> = Vec::new();
        let b = &store.batch;
        batch_plans.push((
            "any_hold",
            sqlx::query_scalar(explain(&b.any_hold))
                .bind("c")
                .bind(&topics)
                .bind(&keys)
                .fetch_one(&mut *tx)
                .await
                .expect("any_hold"),
        ));
        batch_plans.push((
            "versions",
            sqlx::query_scalar(explain(&b.versions))
                .bind("c")
                .bind(&topics)
                .bind(&types)
                .bind(&ids)
                .fetch_one(&mut *tx)
                .await
                .expect("versions"),
        ));
        batch_plans.push((
            "bump_versions",
            sqlx::query_scalar(explain(&b.bump_versions))
                .bind("c")
                .bind(&topics)
                .bind(&types)
                .bind(&ids)
                .bind(&numbers)
                .bind(&numbers)
                .bind(&numbers)
                .fetch_one(&mut *tx)
                .await
                .expect("bump_versions"),
        ));
        // A stale event of the batch, in a converted table's legacy partition.
        let legacy: uuid::Uuid = sqlx::query_scalar("SELECT event_id FROM inbox WHERE bucket = -2 LIMIT 1")
            .fetch_one(&mut *tx)
            .await
            .expect("a legacy row");
        batch_plans.push((
            "mark_stale",
            sqlx::query_scalar(explain(&b.mark_stale[1]))
                .bind("c")
                .bind(legacy)
                .fetch_one(&mut *tx)
                .await
                .expect("mark_stale"),
        ));
        tx.rollback().await.expect("rollback");
        for (name, plan) in &batch_plans {
            let mut found = Vec::new();
            scans(&plan[0]["Plan"], &mut found);
            let read: u64 = found.iter().map(|(_, _, n)| n).sum();
            assert!(
                !found.is_empty() && found.iter().all(|(node, _, _)| by_index(node)) && read <= 200,
                "analysed {analysed}: batch {name} reads {read} rows for 50 records: {found:?}"
            );
        }
        // The check can fail: a lookup by a column without an index is caught.
        let unindexed: serde_json::Value =
            sqlx::query_scalar("EXPLAIN (ANALYZE, FORMAT JSON) SELECT 1 FROM inbox WHERE event_type = 'x'")
                .fetch_one(&pool)
                .await
                .expect("explain");
        let mut found = Vec::new();
        scans(&unindexed[0]["Plan"], &mut found);
        let seq: u64 = found.iter().filter(|(node, _, _)| node == "Seq Scan").map(|(_, _, n)| n).sum();
        assert!(seq >= 100_000, "{found:?}");
        for (name, plan) in &plans {
            let mut found = Vec::new();
            scans(&plan[0]["Plan"], &mut found);
            let read: u64 = found.iter().map(|(_, _, n)| n).sum();
            // Inserts check their conflict through the unique index without a scan node.
            let inserts = matches!(*name, "insert_inbox" | "first_version");
            assert!(
                (inserts || !found.is_empty())
                    && found.iter().all(|(node, _, _)| by_index(node))
                    && read <= 10,
                "analysed {analysed}: {name} reads {read} rows: {found:?}"
            );
        }
    }
}
