//! The lease's decisions, on a clock passed in: how often a standby reads the key, when a
//! revision has stood long enough to take, when the leader renews, and when its lease has run
//! out in its own eyes. No I/O and no clock of its own: [`lease`](super::lease) runs it against
//! the lease bucket and tokio's clock, the simulator against its broker and virtual time.

use super::Moment;
use std::time::Duration;

/// What a standby adds to its holder's lease before it takes over: room for clocks that run at
/// slightly different rates, and for a renewal on its way.
pub fn grace(lease: Duration) -> Duration {
    (lease / 5).max(Duration::from_millis(100))
}

/// How often a standby reads the key, and how soon a leader tries again a renewal that failed.
pub fn poll_interval(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(20), Duration::from_millis(500))
}

/// How often the leader renews: three tries within one lease.
pub fn renew_interval(lease: Duration) -> Duration {
    lease / 3
}

/// How long a standby waits for one read or write of the key: one whose answer was lost
/// would otherwise hold it for JetStream's own timeout (10 s), well past the lease.
pub fn ask_patience(lease: Duration) -> Duration {
    renew_interval(lease)
}

/// What a standby read in the lease key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Never written, deleted, or let go by a leader that stopped: it may be taken at once.
    Free,
    /// Written at `revision` by a holder whose renewals last `lease` (the reader's own lease
    /// for a value it cannot read: such a key is held, never free).
    Held { revision: u64, lease: Duration },
}

/// A standby's watch on the key: the revision it last saw, and since when.
#[derive(Debug, Clone, Copy)]
pub struct Watch<T> {
    seen: Option<(u64, T)>,
}

impl<T> Default for Watch<T> {
    fn default() -> Self {
        Self { seen: None }
    }
}

impl<T: Moment> Watch<T> {
    /// Whether the key, read at `now`, may be taken: it is free, or this standby has seen its
    /// revision, and no other, for the holder's lease and a grace. The first sight of a
    /// revision starts the clock.
    pub fn may_take(&mut self, key: Key, now: T) -> bool {
        let Key::Held { revision, lease } = key else {
            return true;
        };
        let since = match self.seen {
            Some((seen, at)) if seen == revision => at,
            _ => self.seen.insert((revision, now)).1,
        };
        now >= since + lease + grace(lease)
    }
}

/// A leadership's hold on the lease, as its leader counts it: each renewal from when it was
/// *sent*, so that the leader's lease runs out in its own eyes before any standby, which counts
/// from when it *saw* the renewal, may take over.
#[derive(Debug, Clone, Copy)]
pub struct Hold<T> {
    lease: Duration,
    /// The key's revision at this leader's last write of it.
    revision: u64,
    /// Until when this leader may send.
    valid_until: T,
    /// When the lease was made to lapse before its time, if it was since its last renewal:
    /// only a renewal sent after that counts.
    lapsed_at: Option<T>,
}

impl<T: Moment> Hold<T> {
    /// The lease taken by a write at `revision` sent at `sent`.
    pub fn taken(lease: Duration, revision: u64, sent: T) -> Self {
        Self {
            lease,
            revision,
            valid_until: sent + lease,
            lapsed_at: None,
        }
    }

    /// Whether this leader may still send at `now`.
    pub fn is_current(&self, now: T) -> bool {
        now < self.valid_until
    }

    pub fn valid_until(&self) -> T {
        self.valid_until
    }

    /// The revision the next renewal or release expects.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// When the first renewal goes, for a leadership that starts at `now`.
    pub fn first_renewal(&self, now: T) -> T {
        now + renew_interval(self.lease)
    }

    /// A renewal sent at `sent` was stored at `revision`: the lease counts from `sent`.
    /// Returns when the next renewal goes. One sent before the lease was made to lapse counts
    /// for nothing but its revision (it may name the connection that was lost, which a standby
    /// may take the key from), and the next goes at once.
    pub fn renewed(&mut self, revision: u64, sent: T) -> T {
        self.revision = revision;
        if self.lapsed_at.is_some_and(|lapsed| sent <= lapsed) {
            return sent;
        }
        self.lapsed_at = None;
        self.valid_until = self.valid_until.max(sent + self.lease);
        sent + renew_interval(self.lease)
    }

    /// A renewal was refused, but the key holds this leader's own write at `revision` (a
    /// renewal stored whose answer was lost): it goes on from that revision at once, without
    /// counting the lease from it, since when it was sent is not known. Returns when the next
    /// renewal goes.
    pub fn found_own(&mut self, revision: u64, now: T) -> T {
        self.revision = revision;
        now
    }

    /// The lease ends now in this leader's eyes (its connection was lost, say), whatever its
    /// last renewal gave: it sends nothing until a renewal of the same revision succeeds.
    pub fn lapse(&mut self, now: T) {
        self.valid_until = self.valid_until.min(now);
        self.lapsed_at = Some(now);
    }

    /// A renewal failed for a reason that may pass: when to try again.
    pub fn retry(&self, now: T) -> T {
        now + poll_interval(self.lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(3_000);

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_timings_follow_the_lease() {
        assert_eq!(grace(LEASE), at(600));
        assert_eq!(grace(at(200)), at(100), "never less than 100 ms");
        assert_eq!(poll_interval(LEASE), at(300));
        assert_eq!(poll_interval(at(100)), at(20));
        assert_eq!(poll_interval(at(60_000)), at(500));
        assert_eq!(renew_interval(LEASE), at(1_000));
        assert_eq!(ask_patience(LEASE), at(1_000));
    }

    #[test]
    fn a_standby_takes_a_revision_that_stood_for_the_lease_and_a_grace() {
        let mut watch = Watch::default();
        let held = |revision| Key::Held {
            revision,
            lease: LEASE,
        };
        assert!(
            !watch.may_take(held(4), at(1_000)),
            "first sight starts the clock"
        );
        assert!(!watch.may_take(held(4), at(4_599)));
        assert!(
            !watch.may_take(held(5), at(4_600)),
            "a renewal starts it again"
        );
        assert!(!watch.may_take(held(5), at(8_199)));
        assert!(watch.may_take(held(5), at(8_200)));
        assert!(watch.may_take(Key::Free, at(0)), "a free key at once");
        let short = Key::Held {
            revision: 6,
            lease: at(500),
        };
        assert!(!watch.may_take(short, at(10_000)));
        assert!(watch.may_take(short, at(10_600)), "the holder's own lease");
    }

    #[test]
    fn a_leader_counts_its_lease_from_each_renewal_sent() {
        let mut hold = Hold::taken(LEASE, 7, at(100));
        assert!(hold.is_current(at(3_099)));
        assert!(!hold.is_current(at(3_100)));
        assert_eq!(hold.first_renewal(at(150)), at(1_150));
        assert_eq!(hold.renewed(8, at(1_150)), at(2_150));
        assert_eq!((hold.revision(), hold.valid_until()), (8, at(4_150)));
        // A renewal answered late, after a later one: the lease never shrinks.
        hold.renewed(9, at(1_000));
        assert_eq!(hold.valid_until(), at(4_150));
        assert_eq!(hold.found_own(11, at(2_000)), at(2_000));
        assert_eq!((hold.revision(), hold.valid_until()), (11, at(4_150)));
        assert_eq!(hold.retry(at(2_000)), at(2_300));
    }

    #[test]
    fn a_lease_made_to_lapse_counts_only_renewals_sent_after() {
        let mut hold = Hold::taken(LEASE, 7, at(0));
        hold.lapse(at(1_000));
        assert!(!hold.is_current(at(1_000)), "it lapses at once");
        // Sent before the lapse, answered after: its revision, but no time.
        assert_eq!(hold.renewed(8, at(900)), at(900), "the next goes at once");
        assert_eq!(hold.revision(), 8);
        assert!(!hold.is_current(at(1_200)));
        assert_eq!(hold.renewed(9, at(1_200)), at(2_200));
        assert!(hold.is_current(at(4_199)));
        assert!(!hold.is_current(at(4_200)));
        // A lapse never lengthens a lease.
        hold.lapse(at(5_000));
        assert_eq!(hold.valid_until(), at(4_200));
    }
}
