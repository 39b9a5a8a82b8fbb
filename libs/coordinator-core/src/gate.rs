//! The event gate: per-instance admission by incarnation and sequence.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Admission state of one instance's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Incarnation being followed.
    pub incarnation: u64,
    /// Highest admitted seq.
    pub last_seq: u64,
    /// Sticky: some seq of this incarnation was skipped.
    pub gap_detected: bool,
}

/// What the gate decided for one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Apply the batch. `fence` asks consumers to drop the instance's L1
    /// state first (a newer incarnation); `gap` reports skipped seqs.
    Admit {
        /// A restart was detected: fence before applying.
        fence: bool,
        /// Events were lost just before this batch.
        gap: bool,
    },
    /// Already seen (retry or redelivery).
    Duplicate,
    /// From an older incarnation.
    Stale,
}

/// Running totals of the gate's decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GateStats {
    /// Admitted batches.
    pub admitted: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Stale batches dropped.
    pub stale: u64,
    /// Gaps seen.
    pub gaps: u64,
    /// Restarts fenced.
    pub fences: u64,
    /// Events emitters admitted dropping.
    pub dropped_events: u64,
}

/// The gate: one cursor per instance.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    cursors: HashMap<String, Cursor>,
    stats: GateStats,
}

impl Gate {
    /// An empty gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides on a batch and advances the cursor when admitted.
    /// `dropped_events > 0` is admitted loss: it counts and marks a gap.
    pub fn offer(
        &mut self,
        instance_id: &str,
        incarnation: u64,
        seq: u64,
        dropped_events: u64,
    ) -> Verdict {
        let verdict = match self.cursors.get_mut(instance_id) {
            None => {
                // A new stream that starts above 1 already missed something.
                let gap = seq > 1;
                self.cursors.insert(
                    instance_id.to_owned(),
                    Cursor {
                        incarnation,
                        last_seq: seq,
                        gap_detected: gap,
                    },
                );
                Verdict::Admit { fence: false, gap }
            }
            Some(c) if incarnation < c.incarnation => Verdict::Stale,
            Some(c) if incarnation > c.incarnation => {
                let gap = seq > 1;
                *c = Cursor {
                    incarnation,
                    last_seq: seq,
                    gap_detected: gap,
                };
                Verdict::Admit { fence: true, gap }
            }
            Some(c) if seq <= c.last_seq => Verdict::Duplicate,
            Some(c) => {
                let gap = seq > c.last_seq + 1;
                c.gap_detected |= gap;
                c.last_seq = seq;
                Verdict::Admit { fence: false, gap }
            }
        };
        match verdict {
            Verdict::Admit { fence, gap } => {
                self.stats.admitted += 1;
                self.stats.fences += u64::from(fence);
                self.stats.gaps += u64::from(gap);
                if dropped_events > 0 {
                    // A client's figure: summed without overflowing.
                    self.stats.dropped_events =
                        self.stats.dropped_events.saturating_add(dropped_events);
                    if let Some(c) = self.cursors.get_mut(instance_id) {
                        c.gap_detected = true;
                    }
                }
            }
            Verdict::Duplicate => self.stats.duplicates += 1,
            Verdict::Stale => self.stats.stale += 1,
        }
        verdict
    }

    /// Forgets an instance's cursor (deregistration or timeout); its next
    /// batch is admitted at any incarnation. Returns whether it had one.
    pub fn forget(&mut self, instance_id: &str) -> bool {
        self.cursors.remove(instance_id).is_some()
    }

    /// The cursor of one instance.
    pub fn cursor(&self, instance_id: &str) -> Option<Cursor> {
        self.cursors.get(instance_id).copied()
    }

    /// Every cursor.
    pub fn cursors(&self) -> &HashMap<String, Cursor> {
        &self.cursors
    }

    /// Replaces every cursor (checkpoint restore).
    pub fn restore(&mut self, cursors: HashMap<String, Cursor>) {
        self.cursors = cursors;
    }

    /// Totals since start.
    pub fn stats(&self) -> GateStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIT: Verdict = Verdict::Admit {
        fence: false,
        gap: false,
    };

    #[test]
    fn first_batch_admitted_at_any_incarnation() {
        let mut g = Gate::new();
        assert_eq!(g.offer("a", 1000, 1, 0), ADMIT);
        assert_eq!(g.cursor("a").unwrap().last_seq, 1);
    }

    #[test]
    fn dropped_event_counts_sum_without_overflowing() {
        let mut g = Gate::new();
        for seq in 1..=3 {
            assert!(matches!(
                g.offer("a", 1, seq, u64::MAX / 2),
                Verdict::Admit { .. }
            ));
        }
        assert_eq!(g.stats().dropped_events, u64::MAX);
    }

    #[test]
    fn duplicate_and_stale_dropped() {
        let mut g = Gate::new();
        g.offer("a", 1000, 1, 0);
        assert_eq!(g.offer("a", 1000, 2, 0), ADMIT);
        assert_eq!(g.offer("a", 1000, 2, 0), Verdict::Duplicate);
        assert_eq!(g.offer("a", 1000, 1, 0), Verdict::Duplicate);
        assert_eq!(g.offer("a", 999, 50, 0), Verdict::Stale);
        let s = g.stats();
        assert_eq!((s.admitted, s.duplicates, s.stale), (2, 2, 1));
    }

    #[test]
    fn gap_flagged_but_admitted_and_sticky() {
        let mut g = Gate::new();
        g.offer("a", 1, 1, 0);
        assert_eq!(
            g.offer("a", 1, 5, 0),
            Verdict::Admit {
                fence: false,
                gap: true
            }
        );
        assert!(g.cursor("a").unwrap().gap_detected);
        assert_eq!(g.offer("a", 1, 3, 0), Verdict::Duplicate);
        assert_eq!(g.offer("a", 1, 6, 0), ADMIT);
        assert!(g.cursor("a").unwrap().gap_detected, "gap flag is sticky");
        // A brand-new stream starting above 1 is a gap too.
        assert_eq!(
            g.offer("b", 1, 4, 0),
            Verdict::Admit {
                fence: false,
                gap: true
            }
        );
        assert_eq!(g.stats().gaps, 2);
    }

    #[test]
    fn newer_incarnation_fences_and_resets() {
        let mut g = Gate::new();
        g.offer("a", 1, 1, 0);
        g.offer("a", 1, 2, 0);
        assert_eq!(
            g.offer("a", 2, 1, 0),
            Verdict::Admit {
                fence: true,
                gap: false
            }
        );
        assert_eq!(
            g.cursor("a").unwrap(),
            Cursor {
                incarnation: 2,
                last_seq: 1,
                gap_detected: false
            }
        );
        assert_eq!(g.offer("a", 1, 9, 0), Verdict::Stale);
    }

    #[test]
    fn forget_readmits_any_incarnation() {
        let mut g = Gate::new();
        g.offer("a", 5, 3, 0);
        assert!(g.forget("a"));
        assert!(!g.forget("a"));
        assert_eq!(g.offer("a", 1, 1, 0), ADMIT);
    }

    #[test]
    fn dropped_events_count_as_loss() {
        let mut g = Gate::new();
        assert_eq!(g.offer("a", 1, 1, 7), ADMIT);
        assert_eq!(g.stats().dropped_events, 7);
        assert!(g.cursor("a").unwrap().gap_detected);
    }
}
