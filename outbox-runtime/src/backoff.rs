//! Exponential backoff with jitter.

use std::time::Duration;

/// The delay before attempt `attempt + 1` after `attempt` failures (1-based): `base * 2^(attempt-1)`,
/// capped at `max`, then jittered to between half and all of it ("equal jitter"), so that
/// retries spread out while still growing.
pub(crate) fn delay(base: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20)).min(max);
    exp / 2 + exp.mul_f64(random_unit() / 2.0)
}

/// A uniformly distributed number in `[0, 1)`.
pub(crate) fn random_unit() -> f64 {
    fastrand::f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_within_jitter_and_cap() {
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(2));
        for attempt in 1..=10 {
            let full = (base * 2u32.pow(attempt - 1)).min(max);
            for _ in 0..50 {
                let d = delay(base, max, attempt);
                assert!(
                    d >= full / 2 && d <= full,
                    "attempt {attempt}: {d:?} not in [{:?}, {full:?}]",
                    full / 2
                );
            }
        }
        assert!(delay(base, max, u32::MAX) <= max);
    }

    #[test]
    fn jitter_varies() {
        let samples: std::collections::BTreeSet<u64> = (0..20).map(|_| random_unit().to_bits()).collect();
        assert!(samples.len() > 15, "{samples:?}");
        assert!((0..1000).map(|_| random_unit()).all(|u| (0.0..1.0).contains(&u)));
    }
}
