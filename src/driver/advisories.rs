//! The NATS servers' disconnect advisories: how the leader learns within milliseconds, rather
//! than after `--executor-timeout`, that an executor's process is gone.
//!
//! A server publishes `$SYS.ACCOUNT.<account>.DISCONNECT` in its system account each time one of
//! its client connections ends. An account that imports those subjects (see
//! `nats-advisories.conf`) sees its own; the leader subscribes to them, and where no
//! import exists nothing arrives and heartbeats alone judge executors. Executors name the
//! connection they speak through in registrations and heartbeats ([`ConnectionId`]); a close
//! the client's side caused (its process exited or was killed, its socket failed) is handed to
//! the core after a short grace, and the core removes the executor only if it still names that
//! connection. An executor that reconnected within the grace has said so by then (it sends a
//! heartbeat as soon as it is connected again), and a server that dies publishes nothing: a
//! NATS node killed removes no executor.
//!
//! Standby drivers listen too: the leader names its connection in the lease key at each
//! renewal, and a standby that hears it closed takes the key at once, by a compare-and-set on
//! the revision the closed connection wrote, rather than wait out the lease.

use crate::protocol::ConnectionId;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use serde::Deserialize;
use std::collections::VecDeque;
use std::time::Duration;
use tracing::warn;

/// Where the servers' disconnect advisories arrive, for every account that imports them.
pub const DISCONNECT_ADVISORIES: &str = "$SYS.ACCOUNT.*.DISCONNECT";

/// How long the leader waits after an advisory before it acts on it, unless told: long enough
/// for an executor that lost its connection but not its life to reconnect and say so on a
/// nearby server, short enough that a dead executor's tasks start again within about 100 ms.
pub const DEFAULT_DISCONNECT_GRACE: Duration = Duration::from_millis(50);

/// The most closes waiting out their grace at once; past it, a close is left to the
/// heartbeats (a flood of advisories cannot grow the driver's memory).
const MAX_CLOSING: usize = 4096;

/// The server's reasons for a close that the client's side caused: its socket was closed (the
/// process exited or was killed) or failed. A close the server chose (`Server Shutdown`,
/// `Stale Connection`, a slow consumer, `Kicked`) leaves a live process that reconnects.
const CLOSED_BY_CLIENT: [&str; 3] = ["Client Closed", "Read Error", "Write Error"];

/// A connection that closed, and the server's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    pub connection: ConnectionId,
    pub reason: String,
}

#[derive(Deserialize)]
struct Advisory {
    server: Server,
    client: Client,
    reason: String,
}

#[derive(Deserialize)]
struct Server {
    id: String,
}

#[derive(Deserialize)]
struct Client {
    id: u64,
}

/// The connection a disconnect advisory names, if the client's side closed it. Anything else
/// (another reason, a payload that is no advisory) is none: an advisory is only ever a hint.
pub fn closed_by_client(payload: &[u8]) -> Option<Closed> {
    let advisory: Advisory = serde_json::from_slice(payload).ok()?;
    let connection = ConnectionId {
        server_id: advisory.server.id,
        client_id: advisory.client.id,
    };
    let fits = ConnectionId::check(&Some(connection.clone())).is_ok();
    (fits && CLOSED_BY_CLIENT.contains(&advisory.reason.as_str())).then_some(Closed {
        connection,
        reason: advisory.reason,
    })
}

/// The next advisory of `advisories`, if there is a subscription; pending if not.
pub async fn next_advisory(
    advisories: &mut Option<async_nats::Subscriber>,
) -> Option<async_nats::Message> {
    match advisories {
        Some(advisories) => advisories.next().await,
        None => std::future::pending().await,
    }
}

/// The connections a standby heard closed lately, their grace over: the last
/// [`REMEMBERED`] of them.
#[derive(Debug, Default)]
pub struct Gone(VecDeque<ConnectionId>);

/// How many closed connections a standby remembers: a leader's close is acted on at the next
/// look at the key, long before that many others close.
const REMEMBERED: usize = 64;

impl Gone {
    pub fn add(&mut self, connection: ConnectionId) {
        if self.0.len() == REMEMBERED {
            self.0.pop_front();
        }
        self.0.push_back(connection);
    }

    pub fn has(&self, connection: &ConnectionId) -> bool {
        self.0.contains(connection)
    }
}

/// Closes waiting out their grace.
pub struct Closing {
    grace: Duration,
    waiting: FuturesUnordered<BoxFuture<'static, Closed>>,
}

impl Closing {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            waiting: FuturesUnordered::new(),
        }
    }

    /// Starts `closed`'s grace.
    pub fn push(&mut self, closed: Closed) {
        if self.waiting.len() >= MAX_CLOSING {
            warn!(
                connection = ?closed.connection,
                "too many connection closes waiting; this one is left to the heartbeats"
            );
            return;
        }
        let grace = self.grace;
        self.waiting.push(Box::pin(async move {
            tokio::time::sleep(grace).await;
            closed
        }));
    }

    /// Whether some close waits out its grace.
    pub fn waits(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The next close whose grace is over; pending while none waits.
    pub async fn next(&mut self) -> Closed {
        match self.waiting.next().await {
            Some(closed) => closed,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As nats-server 2.15.1 publishes it (shortened).
    const ADVISORY: &str = r#"{"type":"io.nats.server.advisory.v1.client_disconnect",
        "id":"54ygLKQ1lXm2sAFaKqvnnT","timestamp":"2026-12-06T01:05:50.494331641Z",
        "server":{"name":"n1","host":"0.0.0.0",
          "id":"NBUTR4XR4ECFS5XYWGHY5JJERSGQC6K47STJSF6WVQRFONML7MYFO2M6","ver":"2.15.1",
          "jetstream":true,"flags":7,"seq":35,"time":"2026-12-06T01:05:50.494346008Z"},
        "client":{"start":"2026-12-06T01:05:50.493719313Z","host":"127.0.0.1","id":10,
          "acc":"APP","user":"app","name":"ember-executor","lang":"rust","kind":"Client"},
        "sent":{"msgs":0,"bytes":0},"received":{"msgs":0,"bytes":0},"reason":"REASON"}"#;

    fn advisory(reason: &str) -> Vec<u8> {
        ADVISORY.replace("REASON", reason).into_bytes()
    }

    #[test]
    fn a_close_by_the_client_names_its_connection_and_others_are_ignored() {
        let closed = closed_by_client(&advisory("Client Closed")).expect("a client's close");
        assert_eq!(
            closed.connection,
            ConnectionId {
                server_id: "NBUTR4XR4ECFS5XYWGHY5JJERSGQC6K47STJSF6WVQRFONML7MYFO2M6".into(),
                client_id: 10,
            }
        );
        assert!(closed_by_client(&advisory("Read Error")).is_some());
        for reason in ["Server Shutdown", "Stale Connection", "Kicked", ""] {
            assert_eq!(closed_by_client(&advisory(reason)), None, "{reason}");
        }
    }

    #[test]
    fn a_payload_that_is_no_advisory_is_ignored() {
        for junk in [
            &b""[..],
            b"null",
            b"{}",
            br#"{"server":{"id":""},"client":{"id":1},"reason":"Client Closed"}"#,
            br#"{"server":{"id":"s"},"client":{"id":-1},"reason":"Client Closed"}"#,
            &[0xff, 0xfe],
        ] {
            assert_eq!(closed_by_client(junk), None, "{junk:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_is_handed_on_when_its_grace_is_over() {
        let mut closing = Closing::new(Duration::from_millis(50));
        let closed = closed_by_client(&advisory("Client Closed")).unwrap();
        closing.push(closed.clone());
        let started = tokio::time::Instant::now();
        assert_eq!(closing.next().await, closed);
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        let nothing = tokio::time::timeout(Duration::from_secs(60), closing.next()).await;
        assert!(nothing.is_err(), "nothing waits");
    }
}
