//! The one random source of a run, below both the fleet replay and the
//! timing model's load balancing.

/// A small deterministic PRNG (xorshift64*), so runs are reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (v % n.max(1) as u64) as usize
    }
}
