//! The change-data-capture relay on a server whose `wal_level` is not `logical`: setup and
//! start fail with `Error::Config` naming the fix. Needs the server at `wal_level =
//! replica`, which takes a restart: `.ci/run` sets it, runs this test
//! (`cargo test -p outbox-tests --test cdc_wal_level -- --ignored`) and sets `logical`
//! back. Run against a server at `logical` it fails, saying so, instead of passing.

use outbox_runtime::cdc::{CdcConfig, CdcRelay};
use outbox_runtime::{CancellationToken, Error};
use outbox_tests::kafka::Kafka;
use outbox_tests::running::quick;
use outbox_tests::{database_url, migrate};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
#[ignore = "needs the server at wal_level = replica (a restart): .ci/run runs it"]
async fn setup_and_start_refuse_a_wal_level_below_logical(pool: PgPool) {
    let level: String = sqlx::query_scalar("SHOW wal_level").fetch_one(&pool).await.expect("wal_level");
    assert_eq!(level, "replica", "this test needs the server at wal_level = replica (.ci/run sets it)");
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
