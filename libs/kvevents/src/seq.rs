//! Per-stream sequence tracking.
//!
//! Each publisher numbers its batches from 0, one more per batch. A jump
//! forward is a gap (PUB/SUB dropped batches; replay may recover them); a step
//! back means the engine restarted and its earlier state is gone.

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
    /// The sequence went backwards: the publisher restarted.
    Reset {
        /// The last sequence number seen before the restart.
        previous: u64,
    },
}

/// Tracks the last sequence number of one stream.
#[derive(Clone, Debug, Default)]
pub struct SeqTracker {
    last: Option<u64>,
}

impl SeqTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last sequence number accepted.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Classifies `seq` and, unless it is a duplicate, makes it the last seen.
    pub fn observe(&mut self, seq: u64) -> SeqEvent {
        let event = match self.last {
            None => SeqEvent::First,
            Some(last) if seq == last.wrapping_add(1) => SeqEvent::Next,
            Some(last) if seq == last => return SeqEvent::Duplicate,
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
}
