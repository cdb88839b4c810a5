//! The seeded generator of tests, the fuzz run and `cargo xtask chaos`: a run that prints
//! its seed can be repeated with it.

/// The variable that fixes the seed of a run ([`Rng::seed_from_env`]).
pub const SEED_VAR: &str = "OUTBOX_TEST_SEED";

/// A deterministic generator ([`fastrand::Rng`]) for runs that print their seed.
#[derive(Debug, Clone)]
pub struct Rng(fastrand::Rng);

impl Rng {
    /// Seeded from [`SEED_VAR`] or the clock; prints the seed.
    pub fn from_env(name: &str) -> Rng {
        Rng::seeded(Rng::seed_from_env(name))
    }

    /// [`SEED_VAR`], or one from the clock; printed with `name`, so that a failing run can
    /// be repeated.
    pub fn seed_from_env(name: &str) -> u64 {
        let seed = std::env::var(SEED_VAR).ok().and_then(|s| s.parse().ok()).unwrap_or_else(Rng::clock_seed);
        eprintln!("{name}: {SEED_VAR}={seed}");
        seed
    }

    /// A seed from the clock, for a run not given one.
    pub fn clock_seed() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    }

    /// The generator of `seed`.
    pub fn seeded(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    /// Next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0.u64(..)
    }

    /// A number in `lo..hi`; `lo` when the range is empty (`lo == hi`).
    ///
    /// # Panics
    /// When `hi < lo`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if lo == hi {
            lo
        } else {
            self.0.u64(lo..hi)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_repeats_its_numbers_and_ranges_hold() {
        let (mut a, mut b) = (Rng::seeded(42), Rng::seeded(42));
        let first: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..16).map(|_| b.next_u64()).collect::<Vec<_>>());
        let mut other = Rng::seeded(43);
        assert_ne!(first, (0..16).map(|_| other.next_u64()).collect::<Vec<_>>());
        for _ in 0..1000 {
            assert!((5..9).contains(&a.range(5, 9)));
        }
        assert_eq!(a.range(7, 7), 7);
        assert_eq!(a.range(0, 1), 0);
    }
}
