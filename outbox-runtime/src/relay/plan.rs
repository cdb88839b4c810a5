//! The planner settings the relay's statements run under, and a way to explain them as
//! they run: prepared once per connection, one generic plan each.

/// Planner settings for the claim, local to its transaction. One generic plan per
/// connection (`plan_cache_mode`): planned for the values bound, the claim of a
/// partitioned outbox took 8 ms to plan and 11 ms to run (2,000 rows), on every claim. The
/// only plans left are
/// ordered walks of the `fresh` and `due` indexes that stop at the limit, each row's order
/// check probing the blocked index. Left to the planner, a table whose statistics are missing or
/// stale (a sudden backlog while autovacuum is behind, or autovacuum off) got a bitmap
/// scan and a sort of every pending row for every claim: 600 ms instead of 5 ms at 100,000
/// pending rows. `enable_*` only prices a plan out, so a claim never fails for want of one.
pub(crate) const CLAIM_PLAN: &str = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), \
     set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true), \
     set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)";

/// [`CLAIM_PLAN`] for a partitioned outbox, with no materialized inner side either: the
/// planner took a partitioned table's per-aggregate probe as one read of every partition's
/// waiting rows, kept and filtered again for each claimed row, which is O(waiting rows) per
/// row in a broker outage; this leaves it the probe of each row's aggregate, bounded to the
/// partitions from the lowest open id.
pub(crate) const CLAIM_PLAN_PARTITIONED: &str = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), \
     set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true), \
     set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), \
     set_config('enable_material', 'off', true)";

/// Planner settings for the marks, local to their transaction: one generic plan per
/// connection, as for the claim (3 ms of planning in 30 for 2,000 rows; a partitioned
/// outbox's partitions are left out as it runs, by the batch's lowest and highest id). The
/// rows are found by
/// primary key (`id = ANY`, the batch's ids) and hash-joined with their values. Left to the
/// planner, an un-analysed table got a hash of every pending row, each with its own fence
/// subquery, for every mark: 750 ms instead of 50 ms for 2,000 of 100,000 pending rows.
pub(crate) const MARK_PLAN: &str = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true), \
     set_config('enable_bitmapscan', 'off', true), set_config('enable_nestloop', 'off', true), \
     set_config('enable_mergejoin', 'off', true), set_config('enable_hashjoin', 'on', true), \
     set_config('enable_sort', 'on', true)";

/// A statement prepared as the relay's statements are and explained as it runs them:
/// `PREPARE` with its parameters' `types`, and `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE`
/// with these `args` (SQL literals: `EXECUTE` takes no bound parameters). An `EXPLAIN` of
/// the statement itself plans it for the values bound, which the relay's plan settings
/// ([`CLAIM_PLAN`], [`MARK_PLAN`]: one generic plan per connection) never do.
/// [`EXPLAINED_DONE`] drops it.
pub(crate) fn explained(statement: &str, types: &str, args: &[String]) -> (String, String) {
    (
        format!("PREPARE outbox_explained({types}) AS {statement}"),
        format!("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE outbox_explained({})", args.join(", ")),
    )
}

/// `values` as an SQL array literal of `element` type (numbers, or text quoted).
pub(crate) fn array_literal<T: ToString>(values: &[T], element: &str) -> String {
    let items: Vec<String> = values
        .iter()
        .map(|v| {
            let v = v.to_string();
            if element == "text" {
                format!("'{}'", v.replace('\'', "''"))
            } else {
                v
            }
        })
        .collect();
    format!("ARRAY[{}]::{element}[]", items.join(", "))
}

/// Drops the statement [`explained`] prepared.
pub(crate) const EXPLAINED_DONE: &str = "DEALLOCATE outbox_explained";
