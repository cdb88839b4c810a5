//! The change-data-capture relay on a server whose `wal_level` is not `logical`: setup and
//! start fail with `Error::Config` naming the fix. On the server at `DATABASE_URL` when it
//! is at `replica` (PostgreSQL as installed), else on a server of the test's own at
//! `replica`.

use outbox_runtime::cdc::{CdcConfig, CdcRelay};
use outbox_runtime::{CancellationToken, Error};
use outbox_tests::kafka::Kafka;
use outbox_tests::pg_server::with_wal_level;
use outbox_tests::running::quick;
use outbox_tests::{database_url, migrate};

#[tokio::test]
async fn setup_and_start_refuse_a_wal_level_below_logical() {
    let server = with_wal_level("replica").expect("a server at wal_level = replica");
    let pool = outbox_tests::db::test_database(&server).await;
    let level: String = sqlx::query_scalar("SHOW wal_level").fetch_one(&pool).await.expect("wal_level");
    assert_eq!(level, "replica", "the server of {server}");
    let outbox = migrate(&pool).await;
    let cdc = CdcConfig::new(database_url(&pool)).slot("outbox_wal_level").publication("outbox_wal_level");
    for error in [
        cdc.setup(&pool, &outbox).await.expect_err("setup refused"),
        CdcRelay::new(pool.clone(), outbox.clone(), quick(&Kafka::start()), cdc.clone())
            .expect("relay")
            .run(CancellationToken::new())
            .await
            .expect_err("start refused"),
    ] {
        assert!(matches!(error, Error::Config(_)), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("wal_level is replica"), "{text}");
        assert!(text.contains("ALTER SYSTEM SET wal_level = logical"), "names the fix: {text}");
    }
    let slots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_wal_level'")
            .fetch_one(&pool)
            .await
            .expect("slots");
    assert_eq!(slots, 0, "nothing created");
}
