//! The outbox table in partitions, for operators: converting it and running a maintenance
//! round (see `crate::partition`).

use std::time::Duration;

use sqlx::PgPool;

use super::Ops;
use crate::error::Result;
use crate::partition::{convert, is_partitioned, maintain};

pub use crate::partition::{KeptPartition, PartitionReport};

impl Ops {
    /// Whether the outbox table is partitioned (see [`Ops::partition_table`]).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the catalog cannot be read.
    pub async fn is_partitioned(&self, pool: &PgPool) -> Result<bool> {
        is_partitioned(pool, self.outbox().names()).await
    }

    /// Makes the outbox table partitioned by id range, online (see the book's
    /// "Partitions" chapter): appends, relays and operators' actions go on during the
    /// conversion, but for one short transaction at its end that waits at most 5 s for its
    /// lock (an error then: run it again). Returns `false` when the table was partitioned
    /// already. Relays running during the conversion keep working; restart them to get
    /// the claim that reads only the partitions holding open rows. A conversion stopped
    /// half-way is taken up again by running it again. A new install's outbox is
    /// partitioned by its migrations already; this is for an existing install's.
    ///
    /// # Errors
    /// [`Error::MigrationsBehind`](crate::Error::MigrationsBehind) before migration 12; [`Error::Config`](crate::Error::Config) when the table is
    /// in a publication (its new partitions' inserts would not be published: drop the
    /// change-data-capture setup first, and set it up again after);
    /// [`Error::Conflict`](crate::Error::Conflict) while another conversion runs; [`Error::Database`](crate::Error::Database) if a step
    /// fails, for example its lock timeout.
    pub async fn partition_table(&self, pool: &PgPool) -> Result<bool> {
        convert::partition_table(pool, self.outbox().names()).await
    }

    /// One maintenance round of a partitioned outbox (see [`Ops::partition_table`]):
    /// creates the partitions ahead, moves appends on to the next partition once the
    /// current one's first event is older than its span, and, with a `retention`, drops
    /// every partition before the current one whose events are all published or discarded,
    /// whose newest event was appended more than `retention` ago and none of which was
    /// published within it, counting its rows into the cleaned tally first. Relays run it at their cleanup's interval. `None` when
    /// the table is not partitioned.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if a step fails; what a lock timeout
    /// stopped is reported as kept (`busy`), not as an error.
    pub async fn maintain_partitions(
        &self,
        pool: &PgPool,
        retention: Option<Duration>,
    ) -> Result<Option<PartitionReport>> {
        maintain::round(pool, self.outbox().names(), retention).await
    }
}
