//! Epochs on the wire: everything a leading driver sends carries its leadership's epoch (the
//! lease key's revision, see `driver::lease`) in the `Ember-Epoch` header, and whoever
//! receives it (executors, clients, listeners) ignores a message from an epoch older than the
//! newest it has seen. A deposed leader stops sending the moment its lease runs out in its own
//! eyes; the epoch catches what it had already handed to its connection when it was paused.
//! A driver without a journal has no lease and sends no epoch (epoch 0).

use async_nats::{HeaderMap, Message};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The header that carries the epoch.
pub const HEADER: &str = "Ember-Epoch";

/// The headers a driver of `epoch` sends with everything, or none for epoch 0.
pub fn headers(epoch: u64) -> Option<HeaderMap> {
    (epoch > 0).then(|| {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, epoch.to_string().as_str());
        headers
    })
}

/// The epoch `message` was sent in: 0 without the header (a driver without a lease), and 0
/// for a header that is not a number.
pub fn of(message: &Message) -> u64 {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(HEADER))
        .and_then(|v| v.as_str().parse().ok())
        .unwrap_or(0)
}

/// The rule every receiver applies, on a clock of its own in milliseconds: a message of an
/// epoch older than the newest seen is refused, unless the newest has been silent past the
/// patience (a leader whose lease bucket was made anew counts its epochs from 1 again, and a
/// leader of the newest epoch that said nothing for that long is gone). [`Newest`] runs it on
/// the wall clock; the simulation runs it on its virtual one.
#[derive(Debug, Clone, Copy)]
pub struct Fence {
    epoch: u64,
    /// When a message of the newest epoch was last admitted.
    heard_ms: u64,
    patience_ms: u64,
}

impl Fence {
    pub fn new(patience_ms: u64) -> Self {
        Self {
            epoch: 0,
            heard_ms: 0,
            patience_ms,
        }
    }

    /// Whether a message of `epoch` arriving at `now_ms` is to be acted on: it is not older
    /// than the newest seen (which it becomes if it is newer), or the newest has been silent
    /// past the patience.
    pub fn admit(&mut self, epoch: u64, now_ms: u64) -> bool {
        if epoch >= self.epoch {
            self.epoch = epoch;
            self.heard_ms = self.heard_ms.max(now_ms);
            return true;
        }
        if now_ms.saturating_sub(self.heard_ms) < self.patience_ms {
            return false;
        }
        self.epoch = epoch;
        self.heard_ms = now_ms;
        true
    }

    /// The newest epoch seen.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// The newest epoch seen, shared by whatever reads the driver's messages: a [`Fence`] on the
/// wall clock.
#[derive(Debug)]
pub struct Newest {
    fence: Mutex<Fence>,
    origin: Instant,
}

impl Newest {
    /// A tracker that hears an older epoch again once the newest has been silent for
    /// `patience` (see [`Fence`]).
    pub fn new(patience: Duration) -> Self {
        Self {
            fence: Mutex::new(Fence::new(patience.as_millis() as u64)),
            origin: Instant::now(),
        }
    }

    /// Whether a message of `epoch` is to be acted on ([`Fence::admit`] now).
    pub fn admit(&self, epoch: u64) -> bool {
        let now = self.origin.elapsed().as_millis() as u64;
        self.fence().admit(epoch, now)
    }

    /// Whether `message` is to be acted on ([`Newest::admit`] of its epoch); one that is not
    /// is logged with its epoch and the newest.
    pub fn hears(&self, message: &Message) -> bool {
        let epoch = of(message);
        let heard = self.admit(epoch);
        if !heard {
            tracing::warn!(
                epoch,
                newest = self.get(),
                subject = %message.subject,
                "ignored a message from a driver that no longer leads"
            );
        }
        heard
    }

    /// The newest epoch seen.
    pub fn get(&self) -> u64 {
        self.fence().epoch()
    }

    fn fence(&self) -> std::sync::MutexGuard<'_, Fence> {
        // The fence is two numbers, always consistent: a panic elsewhere cannot break it.
        self.fence
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_epoch_is_refused_and_a_newer_one_raises_the_bar() {
        let newest = Newest::new(Duration::from_secs(3600));
        assert!(newest.admit(0), "no epoch yet: a driver without a lease");
        assert!(newest.admit(5));
        assert!(newest.admit(5), "the same leader again");
        assert!(!newest.admit(4));
        assert!(!newest.admit(0), "no header, after a leased driver");
        assert!(newest.admit(9));
        assert!(!newest.admit(5));
        assert_eq!(newest.get(), 9);
    }

    #[test]
    fn an_older_epoch_is_heard_again_once_the_newest_has_been_silent_past_the_patience() {
        let newest = Newest::new(Duration::from_millis(30));
        assert!(newest.admit(7));
        assert!(!newest.admit(2));
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            newest.admit(2),
            "a lease bucket made anew counts from 1 again"
        );
        assert!(!newest.admit(1));
        assert_eq!(newest.get(), 2);
    }

    #[test]
    fn the_header_round_trips_and_epoch_zero_sends_none() {
        assert!(headers(0).is_none());
        let message = Message {
            subject: "s".into(),
            reply: None,
            payload: bytes::Bytes::new(),
            headers: headers(42),
            status: None,
            description: None,
            length: 0,
        };
        assert_eq!(of(&message), 42);
        let bare = Message {
            headers: None,
            ..message.clone()
        };
        assert_eq!(of(&bare), 0);
    }
}
