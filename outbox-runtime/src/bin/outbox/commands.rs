//! What each command does: the library's calls, their results handed to `render`.

use std::process::ExitCode;

use outbox_runtime::inbox::InboxAdmin;
use outbox_runtime::ops::{InboxSide, ReplayFilter, RetryTarget};
use outbox_runtime::relay::{ClaimMode, Cleanup, Relay, RelayConfig};
use outbox_runtime::schema_registry::{Client, RegistryError, SchemaIds};
use outbox_runtime::sqlx::PgPool;
use outbox_runtime::{CancellationToken, Capacity, Error, Outbox, OutboxConfig};

use crate::act::{self, Target};
use crate::args::{
    Cli, Command, FailedCommand, InboxArgs, InboxCommand, ReconcileArgs, RelayArgs, SchemaIdArgs,
};
use crate::setup::{connect, init_logs, parse_optional_time, parse_time};
use crate::{fail, hint, render, Fail};

pub(crate) async fn execute(cli: Cli) -> Result<ExitCode, Fail> {
    // The dev broker needs no database.
    if let Command::Broker(args) = cli.command {
        return Ok(crate::broker::run(args).await);
    }
    let mut config = OutboxConfig::default().schema(&cli.schema).table(&cli.table);
    if let Some(rows) = cli.capacity_rows {
        config = config.capacity(Capacity::Rows(rows));
    }
    if let Some(bytes) = cli.capacity_bytes {
        config = config.capacity(Capacity::Bytes(bytes));
    }
    let outbox = Outbox::new(config)?;
    let Some(url) = cli.database_url.as_deref().filter(|url| !url.trim().is_empty()) else {
        return Err(fail(2, "no database given: set --database-url or DATABASE_URL"));
    };
    let pool = connect(url).await?;
    match dispatch(outbox, pool.clone(), url, cli.command).await {
        Err(failure) => Err(hint::explain(&pool, failure).await),
        done => done,
    }
}

async fn dispatch(outbox: Outbox, pool: PgPool, url: &str, command: Command) -> Result<ExitCode, Fail> {
    match command {
        Command::Migrate => {
            outbox.migrator().run(&pool).await.map_err(Error::from)?;
            let invalid = outbox.invalid_indexes(&pool).await?;
            if invalid.is_empty() {
                println!("outbox tables are up to date");
            } else {
                // Migrated, but a concurrent index build failed before: running the
                // migrations again cannot repair it.
                for index in &invalid {
                    eprintln!(
                        "index {} is invalid (a concurrent build failed); rebuild it: {}",
                        index.name, index.rebuild
                    );
                }
                return Err(fail(
                    1,
                    "outbox tables are migrated, but an index is invalid: rebuild it as said above",
                ));
            }
        }
        Command::Relay(args) => return relay(outbox, pool, url, args).await,
        Command::Cdc(command) => return crate::cdc::command(&outbox, &pool, url, command).await,
        Command::Broker(args) => return Ok(crate::broker::run(args).await),
        Command::Console(args) => return crate::console::run(&outbox, pool, args).await,
        Command::Status { json, window } => {
            let status = outbox.ops().status_over(&pool, window).await?;
            if json {
                render::json(&status);
            } else {
                render::status(&status);
            }
        }
        Command::Failed(FailedCommand::Retry { event_id: Some(id), action }) => {
            act::refuse_filters_with_an_id(&action)?;
            let target = RetryTarget::Event(id);
            return act::retry_by(&outbox.ops(), &pool, &target, action.actor, action.json).await;
        }
        Command::Failed(FailedCommand::Retry { event_id: None, action }) => {
            return act::by_filter(&pool, Target::Failed(&outbox.ops()), None, action).await;
        }
        Command::Failed(FailedCommand::Discard { event_id: Some(id), reason, action }) => {
            act::refuse_filters_with_an_id(&action)?;
            let how = (action.yes, action.actor, action.json);
            return act::discard_by(&outbox.ops(), &pool, id, &reason, how).await;
        }
        Command::Failed(FailedCommand::Discard { event_id: None, reason, action }) => {
            return act::by_filter(&pool, Target::Failed(&outbox.ops()), Some(&reason), action).await;
        }
        Command::Failed(FailedCommand::List { json }) => {
            let failed = outbox.ops().failed(&pool).await?;
            if json {
                render::json(&failed);
            } else {
                render::failed(&failed);
            }
        }
        Command::Retrying { json, limit } => {
            let retrying = outbox.ops().retrying(&pool, limit).await?;
            if json {
                render::json(&retrying);
            } else {
                render::retrying(&retrying);
            }
        }
        Command::Retry { target, actor } => {
            let target = match (target.event_id, target.aggregate, target.all_failed) {
                (Some(id), _, _) => RetryTarget::Event(id),
                (_, Some(aggregate), _) => RetryTarget::Aggregate(aggregate),
                _ => RetryTarget::AllFailed,
            };
            return act::retry_by(&outbox.ops(), &pool, &target, actor, false).await;
        }
        Command::Discard { event_id, reason, yes, actor } => {
            return act::discard_by(&outbox.ops(), &pool, event_id, &reason, (yes, actor, false)).await
        }
        Command::Replay(args) => {
            let f = args.filter;
            let filter = ReplayFilter {
                event_type: f.event_type,
                aggregate_id: f.aggregate,
                since: parse_optional_time(&pool, "--since", f.since.as_deref()).await?,
                until: parse_optional_time(&pool, "--until", f.until.as_deref()).await?,
                event_id: f.event_id,
            };
            let actor = crate::act::actor_or_user(args.actor);
            let report = outbox.ops().replay_by(&pool, &filter, &actor, args.dry_run).await?;
            if args.json {
                render::json(&report);
            } else {
                render::replay(&report, args.dry_run);
            }
            if report.matched == 0 {
                return Ok(ExitCode::from(1));
            }
        }
        Command::BrowseIndexes { inbox_table, inbox_schema } => {
            let mut built = outbox.ops().create_browse_indexes(&pool).await?;
            if let Some(table) = inbox_table {
                let admin = outbox_runtime::inbox::InboxAdmin::new(pool.clone(), &inbox_schema, &table, "")?;
                built.extend(admin.create_browse_indexes().await?);
            }
            if built.is_empty() {
                println!("the browse indexes were there already");
            }
            for index in built {
                println!("built {index}");
            }
        }
        Command::Purge { older_than, batch_size } => {
            let deleted = outbox
                .ops()
                .purge(&pool, older_than, batch_size, |total| {
                    if total > 0 {
                        eprintln!("purge: {total} deleted");
                    }
                })
                .await?;
            println!("{deleted} published or discarded event(s) older than {older_than:?} deleted");
        }
        Command::Partition { maintain: false, .. } => {
            let converted = outbox.ops().partition_table(&pool).await?;
            println!(
                "{}",
                if converted {
                    "the outbox table is partitioned; its rows so far are in the legacy partition, cleaned as before"
                } else {
                    "the outbox table was partitioned already"
                }
            );
        }
        Command::Partition { maintain: true, retention } => {
            match outbox.ops().maintain_partitions(&pool, retention).await? {
                Some(report) => render::json(&report),
                None => {
                    eprintln!("the outbox table is not partitioned: run `outbox partition` first");
                    return Ok(ExitCode::from(2));
                }
            }
        }
        Command::Reconcile(args) => return reconcile(&outbox, &pool, args).await,
        Command::Inbox(args) => return inbox(pool, args).await,
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn relay(
    outbox: Outbox,
    pool: PgPool,
    url: &str,
    args: RelayArgs,
) -> Result<ExitCode, Fail> {
    init_logs();
    if let Some(addr) = args.metrics_addr {
        outbox_runtime::metrics::install_prometheus(addr)?;
        eprintln!("outbox: metrics on http://{addr}/metrics");
    }
    let cleanup = (!args.no_cleanup).then(|| Cleanup::default().retention(args.cleanup_after.0));
    let config = RelayConfig::new(args.brokers)
        .batch_size(args.batch_size)
        .poll_interval(args.poll_interval.0)
        .missing_topic_timeout(args.missing_topic_timeout.0)
        .source(args.source)
        .dataschema_base(args.dataschema_base)
        .cleanup(cleanup)
        .schema_ids(schema_ids(args.schema_ids).await?);
    let config =
        args.kafka_settings.into_iter().fold(config, |config, (key, value)| config.kafka_setting(key, value));
    let config = if args.hold_locks { config.claim_mode(ClaimMode::HoldLocks) } else { config };
    let shutdown = CancellationToken::new();
    outbox_runtime::signal::cancel_on_signal(shutdown.clone());
    if args.cdc {
        return crate::cdc::stream(outbox, pool, url, config, &args.slot, shutdown).await;
    }
    if args.backfill {
        return crate::cdc::backfill(outbox, pool, config, shutdown).await;
    }
    // Relay::run checks the tables it uses (missing or older ones end it at once).
    let relay = Relay::new(pool, outbox, config)?;
    relay.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// The registry ids of the committed schemas, looked up once, before the relay starts.
async fn schema_ids(args: SchemaIdArgs) -> Result<Option<SchemaIds>, Fail> {
    let Some(url) = args.registry else { return Ok(None) };
    let resolved = tokio::task::spawn_blocking(move || {
        let client = Client::from_env(&url)?;
        let ids = SchemaIds::resolve(&client, &args.schemas, &args.schema_subject, args.schema_id_form)?;
        Ok::<_, RegistryError>((client.url().to_owned(), ids))
    })
    .await
    .map_err(|e| fail(3, format!("resolving the schema ids: {e}")))?;
    match resolved {
        Ok((url, ids)) => {
            eprintln!("outbox: {} schema ids from {url}, framed in the {} form", ids.len(), ids.form());
            Ok(Some(ids))
        }
        Err(
            e @ (RegistryError::BadUrl { .. }
            | RegistryError::Config { .. }
            | RegistryError::NotRegistered { .. }),
        ) => Err(fail(2, e.to_string())),
        Err(e) => Err(fail(3, e.to_string())),
    }
}

pub(crate) async fn reconcile(outbox: &Outbox, pool: &PgPool, args: ReconcileArgs) -> Result<ExitCode, Fail> {
    let since = parse_time(pool, "--since", &args.since).await?;
    let until = parse_time(pool, "--until", &args.until).await?;
    if until <= since {
        return Err(fail(2, format!("--until {:?} is not after --since {:?}", args.until, args.since)));
    }
    let inbox = match (&args.consumer, &args.inbox_database_url) {
        (Some(consumer), Some(url)) => {
            let inbox_pool = connect(url).await?;
            let mut side =
                InboxSide::new(inbox_pool, &args.inbox_schema, &args.inbox_table, consumer.clone())?;
            for event_type in &args.event_types {
                side = side.require(event_type.clone());
            }
            Some(side)
        }
        _ => None,
    };
    let result = outbox.ops().reconcile(pool, since, until, inbox.as_ref()).await?;
    if args.json {
        render::json(&result);
    } else {
        render::reconciliation(&result);
    }
    Ok(if result.differences == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub(crate) async fn inbox(pool: PgPool, args: InboxArgs) -> Result<ExitCode, Fail> {
    let admin = InboxAdmin::new(pool, &args.inbox_schema, &args.inbox_table, &args.consumer)?;
    // Partitioning is the table's, whatever the consumer: it may have no rows yet.
    if !matches!(args.command, InboxCommand::Partition) {
        hint::known_consumer(&admin).await?;
    }
    match args.command {
        InboxCommand::Partition => {
            let converted = admin.partition_table().await?;
            println!(
                "{}",
                if converted {
                    "the dedup table is partitioned; its rows are in the legacy partition until every consumer is past its retention"
                } else {
                    "the dedup table was partitioned already"
                }
            );
        }
        InboxCommand::Parked { json } => {
            let parked = admin.parked().await?;
            if json {
                render::json(&render::parked_for_json(&parked));
            } else {
                render::parked(&parked, &args.consumer);
            }
        }
        InboxCommand::Retry { id: None, action } => {
            return act::by_filter(admin.pool(), Target::Parked(&admin), None, action).await;
        }
        InboxCommand::Discard { id: None, reason, action } => {
            return act::by_filter(admin.pool(), Target::Parked(&admin), Some(&reason), action).await;
        }
        InboxCommand::Retry { id: Some(id), action } => {
            return act::parked_by_id(&admin, &args.consumer, id, None, action).await;
        }
        InboxCommand::Discard { id: Some(id), reason, action } => {
            return act::parked_by_id(&admin, &args.consumer, id, Some(&reason), action).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}
