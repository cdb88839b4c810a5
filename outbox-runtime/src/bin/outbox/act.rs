//! Operators' actions by filter (`failed retry|discard`, `inbox retry|discard`): the
//! count first, the action with `--yes`, and what the database says was done.

use std::process::ExitCode;

use outbox_runtime::inbox::InboxAdmin;
use outbox_runtime::ops::{ActionFilter, ActionReport, Ops};
use outbox_runtime::sqlx::PgPool;

use crate::args::ActionArgs;
use crate::commands::parse_optional_time;
use crate::{fail, render, Fail};

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
