//! Operators' actions (`retry`, `discard`, `failed retry|discard`, `inbox retry|discard`),
//! each recorded in the audit table: by filter, the count first, the action with `--yes`,
//! and what the database says was done; by id, at once (a discard with `--yes`).

use std::process::ExitCode;

use clap::Args;
use outbox_runtime::inbox::InboxAdmin;
use outbox_runtime::ops::{ActionFilter, ActionReport, Ops, RetryTarget};
use outbox_runtime::sqlx::PgPool;
use uuid::Uuid;

use crate::setup::parse_optional_time;
use crate::{fail, render, Fail};

/// An operator's action by filter: what it takes and how it runs.
#[derive(Args)]
pub(crate) struct ActionArgs {
    /// Only this event type (repeatable: any of them).
    #[arg(long = "event-type")]
    pub(crate) event_types: Vec<String>,
    /// Only this topic.
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Only those whose reason contains this text (without regard to case).
    #[arg(long)]
    pub(crate) reason_contains: Option<String>,
    /// Failed (parked) at or after this time (a PostgreSQL timestamp, e.g. 2026-11-30T10:00:00Z).
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// Failed (parked) before this time.
    #[arg(long)]
    pub(crate) until: Option<String>,
    /// Count and list the first matches; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Confirms the action (without it, a filter's matches are only counted).
    #[arg(long)]
    pub(crate) yes: bool,
    /// Who acts, recorded in the audit table. Default: $USER, else "unknown".
    #[arg(long)]
    pub(crate) actor: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

impl ActionArgs {
    /// Whether any filter flag is given.
    pub(crate) fn filters(&self) -> bool {
        !self.event_types.is_empty()
            || self.topic.is_some()
            || self.reason_contains.is_some()
            || self.since.is_some()
            || self.until.is_some()
    }
}

/// What an action takes: failed events of an outbox, or a consumer's parked messages.
pub(crate) enum Target<'a> {
    Failed(&'a Ops),
    Parked(&'a InboxAdmin),
}

impl Target<'_> {
    fn noun(&self) -> &'static str {
        match self {
            Target::Failed(_) => "failed event(s)",
            Target::Parked(_) => "parked message(s)",
        }
    }
}

/// The actor recorded: `--actor`, else the OS user ($USER), else "unknown".
fn actor(args: &ActionArgs) -> String {
    actor_or_user(args.actor.clone())
}

/// `given`, else the OS user ($USER), else "unknown".
pub(crate) fn actor_or_user(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Retries (`reason` `None`) or discards what `args`' filter matches.
pub(crate) async fn by_filter(
    pool: &PgPool,
    target: Target<'_>,
    reason: Option<&str>,
    args: ActionArgs,
) -> Result<ExitCode, Fail> {
    let verb = if reason.is_some() { "discard" } else { "retry" };
    if !args.filters() {
        return Err(fail(
            2,
            format!(
                "{verb} what? give an id, or a filter: --event-type, --topic, --reason-contains, --since, --until"
            ),
        ));
    }
    let mut filter = ActionFilter::default()
        .since(parse_optional_time(pool, "--since", args.since.as_deref()).await?)
        .until(parse_optional_time(pool, "--until", args.until.as_deref()).await?);
    for event_type in &args.event_types {
        filter = filter.event_type(event_type.clone());
    }
    if let Some(topic) = &args.topic {
        filter = filter.topic(topic.clone());
    }
    if let Some(text) = &args.reason_contains {
        filter = filter.reason_contains(text.clone());
    }
    let actor = actor(&args);
    let dry_run = args.dry_run || !args.yes;
    let noun = target.noun();
    let report: ActionReport = match (&target, reason) {
        (Target::Failed(ops), None) => ops.retry_failed(pool, &filter, &actor, dry_run).await?,
        (Target::Failed(ops), Some(reason)) => {
            ops.discard_failed(pool, &filter, reason, &actor, dry_run).await?
        }
        (Target::Parked(admin), None) => admin.retry_matching(&filter, &actor, dry_run).await?,
        (Target::Parked(admin), Some(reason)) => {
            admin.discard_matching(&filter, reason, &actor, dry_run).await?
        }
    };
    if args.json {
        render::json(&report);
    } else {
        render::action(&report, noun, args.dry_run);
    }
    if report.matched == 0 {
        return Ok(ExitCode::from(1));
    }
    if !args.dry_run && !args.yes {
        return Err(fail(
            2,
            format!("nothing changed: add --yes to {verb} the {} {noun} matched", report.matched),
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses filters (or a dry run) beside an id: an id names what it takes.
pub(crate) fn refuse_filters_with_an_id(args: &ActionArgs) -> Result<(), Fail> {
    if args.filters() || args.dry_run {
        return Err(fail(2, "give an id or a filter (with --dry-run), not both"));
    }
    Ok(())
}

/// `retry` and `failed retry ID`: the failed events `target` names, put back up at once
/// (an id or an aggregate names what it takes: no count first), recorded in the audit
/// table as the actions by filter are. Exits 1 when there was none.
pub(crate) async fn retry_by(
    ops: &Ops,
    pool: &PgPool,
    target: &RetryTarget,
    actor: Option<String>,
    json: bool,
) -> Result<ExitCode, Fail> {
    let report = ops.retry_by(pool, target, &actor_or_user(actor)).await?;
    if json {
        render::json(&report);
    } else {
        println!("{} failed event(s) put back up for publication", report.applied);
    }
    Ok(if report.applied == 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `discard ID` and `failed discard ID`: one failed or pending event, with `--yes`,
/// recorded in the audit table.
pub(crate) async fn discard_by(
    ops: &Ops,
    pool: &PgPool,
    event_id: Uuid,
    reason: &str,
    (yes, actor, json): (bool, Option<String>, bool),
) -> Result<ExitCode, Fail> {
    if !yes {
        return Err(fail(
            2,
            format!("discarding {event_id} means it is never published; add --yes to confirm"),
        ));
    }
    let report = ops.discard_by(pool, event_id, reason, &actor_or_user(actor)).await?;
    if report.applied == 0 {
        return Err(fail(1, format!("no failed or pending event {event_id}")));
    }
    if json {
        render::json(&report);
    } else {
        println!("discarded {event_id}: {reason}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `inbox … retry ID` (`reason` `None`) and `inbox … discard ID`: one parked message of
/// `consumer`, recorded in the inbox's audit table; refused, naming why, when it is not
/// parked or is held behind an earlier message of its key.
pub(crate) async fn parked_by_id(
    admin: &InboxAdmin,
    consumer: &str,
    id: i64,
    reason: Option<&str>,
    args: ActionArgs,
) -> Result<ExitCode, Fail> {
    refuse_filters_with_an_id(&args)?;
    let actor = actor(&args);
    let Some(reason) = reason else {
        let report = admin.request_retry_by(id, &actor).await?;
        if args.json {
            render::json(&report);
        } else {
            println!(
                "retry of parked message {id} requested; the running consumer {consumer} carries it out"
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    if !args.yes {
        return Err(fail(
            2,
            format!("discarding parked message {id} means it never applies; add --yes to confirm"),
        ));
    }
    let (report, discarded) = admin.discard_by(id, reason, &actor).await?;
    if args.json {
        render::json(&report);
    } else {
        println!(
            "discarded parked message {id}: {reason}; {} held behind it go to the running consumer",
            discarded.held_behind
        );
    }
    Ok(ExitCode::SUCCESS)
}
