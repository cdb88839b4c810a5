//! What a failure to process one message means for that message: park it now, retry it a
//! bounded number of times, or wait for the database ([invariant 11](crate::guarantees#i11): a failure that repeats
//! ends in a recorded outcome after bounded attempts, never in an unbounded loop).
//!
//! Database errors are classified by SQLSTATE class, the way sqlx's
//! `DatabaseError::kind()` reads them; nothing is decided by matching message strings.

use crate::error::Error;

/// How one failure is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Fails the same way every time (bad data, a constraint, a program limit, a panic):
    /// park the message now with this reason.
    Permanent(String),
    /// May pass (a serialization failure, a deadlock, a lock or statement timeout, a
    /// transient handler error, anything unclassified): retry with backoff, and park with
    /// this reason once the attempt limit is reached.
    Transient(String),
    /// The connection to the database is gone: nothing could be recorded, so wait for it
    /// with backoff. Not the message's fault; attempts are not counted.
    Unavailable(String),
}

/// SQLSTATE classes and codes that repeat for the same input.
fn permanent_code(code: &str) -> bool {
    // 22 data exception (22021 bad byte sequence, 22P05 untranslatable character, 22001
    // string too long), 23 integrity constraint violation, 54 program limit exceeded
    // (54000 index row too big).
    code.starts_with("22") || code.starts_with("23") || code.starts_with("54")
}

// The SQLSTATE classes that mean the connection to the database is gone are
// `crate::error::server_gone_code`'s (08 connection exception, 57P01-57P05 shutdown and
// crash recovery). Everything else (53 insufficient resources, 25006 read-only after a
// failover, ...) is retried and counted while the database answers a ping, so that a
// record that causes it every time is still bounded.

/// The failure a database error makes.
pub(crate) fn of_sqlx(error: &sqlx::Error, what: String) -> Failure {
    match error {
        sqlx::Error::PoolTimedOut => Failure::Unavailable(what),
        error if crate::error::server_gone(error) => Failure::Unavailable(what),
        sqlx::Error::Encode(_) => Failure::Permanent(what),
        // The dedup table was partitioned, or a partition attached, under the insert.
        error if crate::inbox::partitions::layout_changed(error) => Failure::Transient(what),
        _ => match error.as_database_error().and_then(|d| d.code()) {
            Some(code) if permanent_code(&code) => Failure::Permanent(what),
            _ => Failure::Transient(what),
        },
    }
}

/// The failure an error of the inbox's own statements makes.
pub(crate) fn of_error(error: &Error) -> Failure {
    let what = error.to_string();
    match error {
        Error::Database(e) => of_sqlx(e, what),
        _ => Failure::Transient(what),
    }
}

/// Whether a database error in a handler repeats for the same input.
pub(crate) fn sqlx_is_permanent(error: &sqlx::Error) -> bool {
    matches!(of_sqlx(error, String::new()), Failure::Permanent(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::server_gone_code as unavailable_code;

    #[test]
    fn classes_map_to_what_repeats() {
        for code in ["22021", "22P05", "23505", "54000", "22001"] {
            assert!(permanent_code(code), "{code}");
            assert!(!unavailable_code(code), "{code}");
        }
        for code in ["08006", "57P01", "57P03"] {
            assert!(unavailable_code(code), "{code}");
            assert!(!permanent_code(code), "{code}");
        }
        for code in ["40001", "40P01", "55P03", "57014", "42P01", "53200", "53300", "25006"] {
            assert!(!unavailable_code(code) && !permanent_code(code), "{code} is retried, bounded");
        }
        assert_eq!(of_sqlx(&sqlx::Error::PoolTimedOut, "x".into()), Failure::Unavailable("x".into()));
        assert_eq!(of_sqlx(&sqlx::Error::RowNotFound, "x".into()), Failure::Transient("x".into()));
        assert_eq!(
            of_error(&Error::Config("c".into())),
            Failure::Transient("invalid configuration: c".into())
        );
    }
}
