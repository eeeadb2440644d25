//! The in-memory network between the driver and the executors. Each message is dropped,
//! duplicated or held up by chance, and none passes between the driver and a partitioned
//! executor; delays differ per message, so messages overtake each other. After the fault period
//! it is a reliable network with a millisecond or two of latency.

use super::config::Faults;
use super::rng::Rng;
use crate::protocol::{
    ExecutorMessage, HeartbeatReply, HeartbeatRequest, RegisterExecutor, RegisterReply,
    StatusReply, StatusRequest,
};

/// An executor process, by its number in the run (a restarted executor is a new process).
pub type Pid = u32;

/// Which driver sent a message: the process, its leadership's number in the run, and its
/// epoch (the executor sees only the epoch; the ledger sees all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    pub node: u32,
    pub leadership: u32,
    pub epoch: u64,
}

/// What travels between the nodes.
#[derive(Debug, Clone)]
pub enum Message {
    /// A request from executor `from`, numbered by it so its answer can be matched.
    Request { from: Pid, id: u64, body: Request },
    /// The answer to request `id` of executor `to` (a status acknowledgement may launch
    /// tasks).
    Reply {
        to: Pid,
        id: u64,
        sender: Sender,
        body: Reply,
    },
    /// A message to executor `to`'s inbox.
    Inbox {
        to: Pid,
        sender: Sender,
        body: ExecutorMessage,
    },
}

#[derive(Debug, Clone)]
pub enum Request {
    Register(Box<RegisterExecutor>),
    Lifecycle(HeartbeatRequest),
    Status(StatusRequest),
}

#[derive(Debug, Clone)]
pub enum Reply {
    Register(RegisterReply),
    Lifecycle(HeartbeatReply),
    Status(StatusReply),
}

impl Message {
    /// The executor at the far end.
    pub fn executor(&self) -> Pid {
        match self {
            Message::Request { from, .. } => *from,
            Message::Reply { to, .. } | Message::Inbox { to, .. } => *to,
        }
    }

    /// The driver that sent it, unless an executor did.
    pub fn sender(&self) -> Option<Sender> {
        match self {
            Message::Request { .. } => None,
            Message::Reply { sender, .. } | Message::Inbox { sender, .. } => Some(*sender),
        }
    }
}

/// The network's state: its faults, while they last, and the partitions.
pub struct Network {
    faults: Faults,
    /// Until when each executor process is cut off (0: never).
    cut_until: Vec<u64>,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
}

impl Network {
    pub fn new(faults: Faults) -> Self {
        Self {
            faults,
            cut_until: Vec::new(),
            dropped: 0,
            duplicated: 0,
            delayed: 0,
        }
    }

    /// Cuts `pid` off from the driver until `until`.
    pub fn partition(&mut self, pid: Pid, until: u64) {
        let pid = pid as usize;
        if self.cut_until.len() <= pid {
            self.cut_until.resize(pid + 1, 0);
        }
        self.cut_until[pid] = until;
    }

    fn is_cut(&self, pid: Pid, now: u64) -> bool {
        self.cut_until.get(pid as usize).is_some_and(|&t| now < t)
    }

    /// When copies of a message sent at `now` to or from `pid` arrive: none if it is lost, two
    /// if it is duplicated.
    pub fn arrivals(&mut self, rng: &mut Rng, pid: Pid, now: u64) -> [Option<u64>; 2] {
        if self.is_cut(pid, now) {
            self.dropped += 1;
            return [None, None];
        }
        if now >= self.faults.for_ms {
            return [Some(now + 1 + rng.below(2)), None];
        }
        if rng.chance(self.faults.drop) {
            self.dropped += 1;
            return [None, None];
        }
        let first = Some(self.latency(rng, now));
        if rng.chance(self.faults.duplicate) {
            self.duplicated += 1;
            return [first, Some(self.latency(rng, now))];
        }
        [first, None]
    }

    /// When a message sent at `now` between a driver and JetStream arrives. Never lost (a
    /// JetStream request is retried until answered, and the retries are idempotent), but held
    /// up as any other.
    pub fn arrival_at_broker(&mut self, rng: &mut Rng, now: u64) -> u64 {
        if now >= self.faults.for_ms {
            return now + 1 + rng.below(2);
        }
        self.latency(rng, now)
    }

    fn latency(&mut self, rng: &mut Rng, now: u64) -> u64 {
        let mut at = now + 1 + rng.below(2);
        if rng.chance(self.faults.delay) {
            self.delayed += 1;
            at += rng.between(1, self.faults.delay_ms);
        }
        at
    }
}
