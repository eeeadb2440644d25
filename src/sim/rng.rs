//! The simulation's one source of chance: SplitMix64, seeded from one `u64`. Small, fast, and
//! the same on every machine, so a seed names a run.

/// SplitMix64 (Steele, Lea and Flood): a 64-bit state stepped by a constant and mixed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// A float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// The wait until the next event of a Poisson process of `per_ms` events a millisecond.
    pub fn exponential(&mut self, per_ms: f64) -> u64 {
        let u = 1.0 - self.unit();
        (-u.ln() / per_ms).ceil() as u64
    }

    /// A uuid drawn from the seed (instance ids must replay too).
    pub fn uuid(&mut self) -> uuid::Uuid {
        uuid::Uuid::from_u64_pair(self.next_u64(), self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_draws_the_same_numbers() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let draws: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        assert_eq!(draws, (0..100).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(8).next_u64(), draws[0]);
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = Rng::new(1);
        assert!((0..10_000).all(|_| rng.below(7) < 7));
        assert_eq!(rng.below(0), 0);
    }
}
