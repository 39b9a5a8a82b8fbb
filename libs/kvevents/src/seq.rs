//! Per-stream sequence tracking.
//!
//! Each publisher numbers its batches from 0, one more per batch. A jump
//! forward is a gap (PUB/SUB dropped batches; replay may recover them); a step
//! back means the engine restarted and its earlier state is gone.
//!
//! A jump forward larger than the tracker's bound is not believed from one
//! frame: no publisher drops millions of batches between two frames, so it
//! is a corrupt or forged frame, or a publisher that started numbering
//! somewhere else. The frame is refused; if the next frame continues from
//! it, the stream really moved there and that is treated as a restart.

/// What a received sequence number means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqEvent {
    /// The first batch seen on this stream.
    First,
    /// Exactly the next batch.
    Next,
    /// Batches `from ..= to` were not received.
    Gap {
        /// First missing sequence number.
        from: u64,
        /// Last missing sequence number.
        to: u64,
    },
    /// The same batch again (ignore it).
    Duplicate,
    /// The sequence went backwards (or moved far ahead twice in a row):
    /// the publisher restarted.
    Reset {
        /// The last sequence number seen before the restart.
        previous: u64,
    },
    /// A jump forward beyond the bound, not (yet) confirmed by a following
    /// frame: drop the frame.
    Implausible {
        /// The last sequence number accepted.
        last: u64,
    },
}

/// The default bound on a believable forward jump, in batches.
pub const DEFAULT_MAX_JUMP: u64 = 1 << 20;

/// Tracks the last sequence number of one stream.
#[derive(Clone, Debug)]
pub struct SeqTracker {
    last: Option<u64>,
    max_jump: u64,
    /// A refused far-ahead sequence number, confirmed if the next follows it.
    suspect: Option<u64>,
}

impl Default for SeqTracker {
    fn default() -> Self {
        Self::with_max_jump(DEFAULT_MAX_JUMP)
    }
}

impl SeqTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker believing forward jumps of at most `max_jump` batches.
    pub fn with_max_jump(max_jump: u64) -> Self {
        Self {
            last: None,
            max_jump: max_jump.max(1),
            suspect: None,
        }
    }

    /// The last sequence number accepted.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Classifies `seq` and, unless it is a duplicate, makes it the last seen.
    pub fn observe(&mut self, seq: u64) -> SeqEvent {
        let confirmed = self
            .suspect
            .take()
            .is_some_and(|s| seq == s.wrapping_add(1));
        let event = match self.last {
            None => SeqEvent::First,
            Some(last) if seq == last.wrapping_add(1) => SeqEvent::Next,
            Some(last) if seq == last => return SeqEvent::Duplicate,
            Some(last) if seq > last && seq - last > self.max_jump => {
                if !confirmed {
                    self.suspect = Some(seq);
                    return SeqEvent::Implausible { last };
                }
                SeqEvent::Reset { previous: last }
            }
            Some(last) if seq > last => SeqEvent::Gap {
                from: last + 1,
                to: seq - 1,
            },
            Some(last) => SeqEvent::Reset { previous: last },
        };
        self.last = Some(seq);
        event
    }

    /// Forgets the stream (e.g. after the subscriber reconnects).
    pub fn reset(&mut self) {
        self.last = None;
        self.suspect = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_case() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(5), SeqEvent::First);
        assert_eq!(t.observe(6), SeqEvent::Next);
        assert_eq!(t.observe(6), SeqEvent::Duplicate);
        assert_eq!(t.observe(10), SeqEvent::Gap { from: 7, to: 9 });
        assert_eq!(t.last(), Some(10));
        assert_eq!(t.observe(0), SeqEvent::Reset { previous: 10 });
        assert_eq!(t.observe(1), SeqEvent::Next);
        t.reset();
        assert_eq!(t.observe(42), SeqEvent::First);
    }

    #[test]
    fn a_far_jump_is_refused_until_the_next_frame_confirms_it() {
        let mut t = SeqTracker::with_max_jump(100);
        assert_eq!(t.observe(10), SeqEvent::First);
        // One absurd frame: refused, the stream carries on where it was.
        assert_eq!(t.observe(1 << 62), SeqEvent::Implausible { last: 10 });
        assert_eq!(t.observe(11), SeqEvent::Next);
        assert_eq!(t.last(), Some(11));
        // Within the bound it is an ordinary gap.
        assert_eq!(t.observe(111), SeqEvent::Gap { from: 12, to: 110 });
        // Two frames in a row far ahead: the stream moved; a restart.
        assert_eq!(t.observe(5_000), SeqEvent::Implausible { last: 111 });
        assert_eq!(t.observe(5_001), SeqEvent::Reset { previous: 111 });
        assert_eq!(t.observe(5_002), SeqEvent::Next);
    }
}
