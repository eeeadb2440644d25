//! Reading the event history: the cluster's events stream (`EMBER_<cluster>_EVENTS`, see
//! `driver::history`) through an ordered consumer, from a point in time, from the start, or
//! from now on. The reader remembers the stream sequence of the last event it gave out: a
//! consumer lost to a nats-server restart is made again from the one after it (async-nats'
//! ordered consumer does so itself; a reader whose consumer ends makes a new one the same
//! way), and an event at or below it is never given out twice.

use crate::protocol::{decode, Event};
use crate::subjects::Subjects;
use async_nats::jetstream::consumer::pull::{Ordered, OrderedConfig};
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::{self, Context};
use async_nats::Client;
use futures::StreamExt;
use std::time::{Duration, SystemTime};

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// With the first event the stream still holds.
    All,
    /// With the first event stored at or after this time.
    Since(SystemTime),
    /// With the next event stored.
    New,
}

/// Parses `--since`: a duration back from now (`10m`, `2h`, `1day`) or an RFC 3339 time
/// (`2026-01-31T09:00:00Z`).
pub fn parse_since(text: &str) -> Result<SystemTime, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text:?} reaches back before 1970"));
    }
    humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!(
            "{text:?} is neither a duration nor a time (write e.g. 10m, 2h, or \
             2026-01-31T09:00:00Z)"
        )
    })
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(
        "could not read the event history {stream} ({message}); the driver keeps it only with \
         a journal in JetStream (not with --journal off), and the user needs the listener's \
         rights to it (see docs/security.md)"
    )]
    Unavailable { stream: String, message: String },
}

/// One event read from the stream.
pub struct Stored {
    /// Its place in the stream.
    pub sequence: u64,
    pub payload: bytes::Bytes,
    pub event: Result<Event, String>,
    /// Whether it comes from the newest leadership the reader has seen, or one no longer
    /// superseded (see [`crate::epoch::Fence`]); one that is not should be left out.
    pub current: bool,
    /// How many events the stream held after it when it was delivered: 0 means the reader
    /// has caught up with the stream's end.
    pub pending: u64,
}

/// An ordered reader of the events stream.
pub struct Reader {
    context: Context,
    stream: String,
    messages: Ordered,
    /// The name of the consumer `messages` reads, as made.
    consumer: String,
    /// The stream sequence of the last event given out, 0 before the first.
    last: u64,
    /// How many events the stream held from the start when the reader was made.
    pending_at_open: u64,
    /// The epoch fence, on the clock of the events' stored times.
    fence: crate::epoch::Fence,
}

impl Reader {
    /// Opens a reader of `subjects`' events stream at `start`.
    pub async fn open(
        client: &Client,
        subjects: &Subjects,
        start: Start,
    ) -> Result<Reader, HistoryError> {
        let context = jetstream::new(client.clone());
        let stream = subjects.events_stream();
        let deliver = match start {
            Start::All => DeliverPolicy::All,
            Start::New => DeliverPolicy::New,
            Start::Since(time) => DeliverPolicy::ByStartTime {
                start_time: time.into(),
            },
        };
        let (messages, consumer, pending_at_open) = consume(&context, &stream, deliver).await?;
        let patience = crate::client::FAILOVER_PATIENCE.as_millis() as u64;
        Ok(Reader {
            context,
            stream,
            messages,
            consumer,
            last: 0,
            pending_at_open,
            fence: crate::epoch::Fence::new(patience),
        })
    }

    /// Deletes the reader's consumer on the server, which would otherwise stay there, one of
    /// the stream's limited number, until it had been idle for 30 s. Best effort, for up to
    /// `CLOSE_WAIT`: a consumer the server no longer has, or a server that does not answer,
    /// leaves nothing to do. One that the client library made again under another name (after
    /// missed heartbeats) is not known here and idles out as a killed reader's does.
    pub async fn close(self) {
        let delete = self
            .context
            .delete_consumer_from_stream(&self.consumer, &self.stream);
        match tokio::time::timeout(CLOSE_WAIT, delete).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(%error, "the event reader's consumer was not deleted")
            }
            Err(_) => tracing::debug!("the server did not answer the event reader's delete"),
        }
    }

    /// Whether the stream held nothing from the start when the reader was made.
    pub fn empty_at_open(&self) -> bool {
        self.pending_at_open == 0
    }

    /// The next event, waiting for one to be stored if need be. Errors of the consumer are
    /// logged and read past; a consumer that ends is made again after the last event read.
    pub async fn next(&mut self) -> Stored {
        loop {
            match self.messages.next().await {
                Some(Ok(message)) => {
                    if let Some(stored) = self.admit(message) {
                        return stored;
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "reading the event history; going on");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => self.reopen().await,
            }
        }
    }

    /// The event `message` holds, unless it was given out already.
    fn admit(&mut self, message: jetstream::Message) -> Option<Stored> {
        let info = message.info().ok()?;
        let (sequence, pending) = (info.stream_sequence, info.pending);
        if sequence <= self.last {
            return None;
        }
        let stored_ms = (info.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
        self.last = sequence;
        let current = self
            .fence
            .admit(crate::epoch::of(&message.message), stored_ms);
        let payload = message.message.payload;
        let event = decode::<Event>(&payload, usize::MAX).map_err(|e| e.to_string());
        Some(Stored {
            sequence,
            payload,
            event,
            current,
            pending,
        })
    }

    /// Makes the consumer again from the event after the last one read, trying until it can.
    async fn reopen(&mut self) {
        loop {
            let deliver = DeliverPolicy::ByStartSequence {
                start_sequence: self.last + 1,
            };
            match consume(&self.context, &self.stream, deliver).await {
                Ok((messages, consumer, _)) => {
                    (self.messages, self.consumer) = (messages, consumer);
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "could not resume the event history; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// How long [`Reader::close`] waits for the server to delete its consumer.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// An ordered consumer of `stream` from `deliver`, its name, and how many events it has to
/// deliver.
async fn consume(
    context: &Context,
    stream: &str,
    deliver: DeliverPolicy,
) -> Result<(Ordered, String, u64), HistoryError> {
    let failed = |message: String| HistoryError::Unavailable {
        stream: stream.to_string(),
        message,
    };
    let config = OrderedConfig {
        deliver_policy: deliver,
        ..Default::default()
    };
    let consumer = context
        .create_consumer_on_stream(config, stream)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let (name, pending) = (
        consumer.cached_info().name.clone(),
        consumer.cached_info().num_pending,
    );
    let messages = consumer
        .messages()
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok((messages, name, pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_back_or_a_time_and_refuses_anything_else() {
        let ten_minutes_ago = parse_since("10m").unwrap();
        let ago = SystemTime::now().duration_since(ten_minutes_ago).unwrap();
        assert!(ago >= Duration::from_secs(600) && ago < Duration::from_secs(660));
        let at = parse_since("2026-01-31T09:00:00Z").unwrap();
        let since_epoch = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(since_epoch.as_secs(), 1_769_850_000);
        for bad in ["", "yesterday", "10 parsecs", "2026-13-01T00:00:00Z", "-5m"] {
            let error = parse_since(bad).unwrap_err();
            assert!(
                error.contains("neither a duration nor a time"),
                "{bad:?}: {error}"
            );
        }
    }
}
