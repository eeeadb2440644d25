//! A fast path for decoding the messages that come once per round trip at high task rates, in
//! the exact form `encode` writes them: a status batch of plain finishes, its `StatusAck`, and a
//! `LaunchTasks`.
//!
//! serde reads each number of a task through several layers of generic calls; at 64 tasks a
//! message that made decoding the largest cost in an executor's profile and a fifth of the
//! driver's. These recognizers read the bytes directly, but only bytes laid out as `encode`
//! lays them out: the same keys in the same order, no whitespace, integers without sign,
//! fraction, exponent or leading zero, strings of printable ASCII without escapes, and a spec
//! that nests shallowly. At the first byte that differs they give up, and `decode` reads the
//! message with serde as before. So the fast path can only produce what serde produces from the
//! same bytes, and every refusal, with its error text, still comes from serde.
//! tests/fuzz_decoders.rs holds the two together on mutated messages.
//!
//! Encoding has no such path: serde_json writes these messages about as fast as a writer by
//! hand does (docs/benchmarks.md).

use super::{ExecutorMessage, StatusReply, StatusRequest, StatusUpdate, TaskDescription, TaskSpec};
use crate::ids::InstanceId;
use serde::de::value::{BorrowedStrDeserializer, Error};
use serde::Deserialize;
use std::sync::Arc;

impl super::Message for StatusRequest {
    fn decode_fast(payload: &[u8]) -> Option<Self> {
        status_request(Cursor(payload))
    }
}

impl super::Message for StatusReply {
    fn decode_fast(payload: &[u8]) -> Option<Self> {
        status_ack(Cursor(payload))
    }
}

impl super::Message for ExecutorMessage {
    fn decode_fast(payload: &[u8]) -> Option<Self> {
        launch_tasks(Cursor(payload))
    }
}

/// `{"type":"StatusUpdates","executor_id":"..","updates":[[task_id,attempt],..]` then
/// optionally `,"driver_instance":".."`, then `}`.
fn status_request(mut c: Cursor<'_>) -> Option<StatusRequest> {
    c.eat(br#"{"type":"StatusUpdates","executor_id":"#)?;
    let executor_id = c.string()?;
    c.eat(br#","updates":"#)?;
    let mut updates = Vec::new();
    c.list(|c| {
        let [task_id, attempt] = c.numbers()?;
        updates.push(StatusUpdate::finished(
            task_id,
            u32::try_from(attempt).ok()?,
        ));
        Some(())
    })?;
    let driver_instance = c.driver_instance()?;
    c.close()?;
    Some(StatusRequest::StatusUpdates {
        executor_id,
        updates,
        driver_instance,
    })
}

/// `{"type":"StatusAck","accepted":n,"refused":[]` then optionally `,"launch":[groups]`, then
/// `}`. An answer that refused anything is left to serde.
fn status_ack(mut c: Cursor<'_>) -> Option<StatusReply> {
    c.eat(br#"{"type":"StatusAck","accepted":"#)?;
    let accepted = c.u32()?;
    c.eat(br#","refused":[]"#)?;
    let launch = match c.eat_if(b',') {
        true => {
            c.eat(br#""launch":"#)?;
            c.groups()?
        }
        false => Vec::new(),
    };
    c.close()?;
    Some(StatusReply::StatusAck {
        accepted,
        refused: Vec::new(),
        launch,
    })
}

/// `{"type":"LaunchTasks","tasks":[groups]` then optionally `,"driver_instance":".."`, then `}`.
fn launch_tasks(mut c: Cursor<'_>) -> Option<ExecutorMessage> {
    c.eat(br#"{"type":"LaunchTasks","tasks":"#)?;
    let tasks = c.groups()?;
    let driver_instance = c.driver_instance()?;
    c.close()?;
    Some(ExecutorMessage::LaunchTasks {
        tasks,
        driver_instance,
    })
}

/// Where a recognizer has got to: the bytes not read yet.
struct Cursor<'a>(&'a [u8]);

/// A spec with more than this many `{` and `[` in its bytes (strings included, so never fewer
/// than its depth) is left to serde, which alone knows how deep the whole message nests.
const SPEC_BRACKETS: usize = 64;

impl<'a> Cursor<'a> {
    /// Reads `literal`, or gives up.
    fn eat(&mut self, literal: &[u8]) -> Option<()> {
        self.0 = self.0.strip_prefix(literal)?;
        Some(())
    }

    /// Reads `byte` if it comes next.
    fn eat_if(&mut self, byte: u8) -> bool {
        self.eat(&[byte]).is_some()
    }

    /// The closing `}` of the message, which must end there.
    fn close(&mut self) -> Option<()> {
        self.eat(b"}")?;
        self.0.is_empty().then_some(())
    }

    /// A non-negative integer as JSON writes it: `0`, or digits that do not start with `0`.
    /// Gives up on overflow; what follows is for the caller to check.
    fn u64(&mut self) -> Option<u64> {
        let digit = |b: &u8| b.is_ascii_digit().then(|| u64::from(b - b'0'));
        let (first, mut rest) = self.0.split_first()?;
        let mut n = digit(first)?;
        if n != 0 {
            while let Some(d) = rest.first().and_then(digit) {
                n = n.checked_mul(10)?.checked_add(d)?;
                rest = &rest[1..];
            }
        }
        self.0 = rest;
        Some(n)
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    /// A string of printable ASCII without escapes, read as serde reads a string into a `T`.
    fn string<T: Deserialize<'a>>(&mut self) -> Option<T> {
        self.eat(b"\"")?;
        let len = self.0.iter().position(|&b| b == b'"')?;
        let (text, rest) = self.0.split_at(len);
        if !text
            .iter()
            .all(|&b| (b' '..=b'~').contains(&b) && b != b'\\')
        {
            return None;
        }
        let text = std::str::from_utf8(text).ok()?;
        self.0 = &rest[1..];
        T::deserialize(BorrowedStrDeserializer::<Error>::new(text)).ok()
    }

    /// `,"driver_instance":".."` if it comes next. `None` gives up; `Some(None)` means absent.
    fn driver_instance(&mut self) -> Option<Option<InstanceId>> {
        if !self.eat_if(b',') {
            return Some(None);
        }
        self.eat(br#""driver_instance":"#)?;
        self.string().map(Some)
    }

    /// A list of task groups, as `groups.rs` writes it: every task of every group, in order,
    /// each group's tasks sharing its spec.
    fn groups(&mut self) -> Option<Vec<TaskDescription>> {
        let mut tasks = Vec::new();
        self.list(|c| {
            c.eat(br#"{"job_id":"#)?;
            let job_id = c.u64()?;
            c.eat(br#","cpus":"#)?;
            let cpus = c.u32()?;
            c.eat(br#","spec":"#)?;
            let spec = Arc::new(c.spec()?);
            c.eat(br#","tasks":["#)?;
            // At least one task: serde refuses an empty group.
            c.items(|c| {
                let [task_id, index, attempt] = c.numbers()?;
                tasks.push(TaskDescription {
                    task_id,
                    job_id,
                    index: u32::try_from(index).ok()?,
                    attempt: u32::try_from(attempt).ok()?,
                    cpus,
                    spec: Arc::clone(&spec),
                    resources: Default::default(),
                });
                Some(())
            })?;
            c.eat(b"}")
        })?;
        Some(tasks)
    }

    /// `[`, then what [`Cursor::items`] reads, or nothing.
    fn list(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b"[")?;
        match self.eat_if(b']') {
            true => Some(()),
            false => self.items(item),
        }
    }

    /// Items separated by commas, at least one, each read by `item`, then `]`.
    fn items(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        loop {
            item(self)?;
            if self.eat_if(b']') {
                return Some(());
            }
            self.eat(b",")?;
        }
    }

    /// `[a,b,..]`: exactly `N` integers.
    fn numbers<const N: usize>(&mut self) -> Option<[u64; N]> {
        self.eat(b"[")?;
        let mut numbers = [0; N];
        for (i, n) in numbers.iter_mut().enumerate() {
            if i > 0 {
                self.eat(b",")?;
            }
            *n = self.u64()?;
        }
        self.eat(b"]")?;
        Some(numbers)
    }

    /// A task spec: an object, read by serde, that must start right here and nest shallowly.
    fn spec(&mut self) -> Option<TaskSpec> {
        if self.0.first() != Some(&b'{') {
            return None;
        }
        let mut specs = serde_json::Deserializer::from_slice(self.0).into_iter::<TaskSpec>();
        let spec = specs.next()?.ok()?;
        let (read, rest) = self.0.split_at(specs.byte_offset());
        if read.iter().filter(|&&b| b == b'{' || b == b'[').count() > SPEC_BRACKETS {
            return None;
        }
        self.0 = rest;
        Some(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{self, Message, TaskState};
    use serde_json::json;

    /// What the fast reader of `T` makes of `payload`.
    fn decode<T: Message>(payload: &[u8]) -> Option<T> {
        T::decode_fast(payload)
    }

    fn task(task_id: u64, job_id: u64, spec: &Arc<TaskSpec>) -> TaskDescription {
        TaskDescription {
            task_id,
            job_id,
            index: 3,
            attempt: 1,
            cpus: 2,
            spec: Arc::clone(spec),
            resources: Default::default(),
        }
    }

    fn messages() -> (Vec<StatusRequest>, Vec<StatusReply>, Vec<ExecutorMessage>) {
        let noop = Arc::new(TaskSpec::Handler {
            name: "noop".into(),
            arg: serde_json::Value::Null,
        });
        let command = Arc::new(TaskSpec::Command {
            argv: vec!["sh".into(), "-c".into(), "echo \"hi\"\n".into()],
            env: [("A".to_string(), "é".to_string())].into(),
            cwd: Some("/tmp".into()),
            timeout_ms: Some(5),
        });
        let launch = vec![
            task(u64::MAX, 7, &noop),
            task(0, 7, &noop),
            task(9, 8, &command),
        ];
        let id = crate::ids::ExecutorId::parse("exec-1_A").unwrap();
        let requests = vec![
            StatusRequest::StatusUpdates {
                executor_id: id.clone(),
                updates: vec![
                    StatusUpdate::finished(u64::MAX, u32::MAX),
                    StatusUpdate::finished(0, 0),
                    StatusUpdate::finished(10, 7),
                ],
                driver_instance: Some(uuid::Uuid::new_v4()),
            },
            StatusRequest::StatusUpdates {
                executor_id: id,
                updates: Vec::new(),
                driver_instance: None,
            },
        ];
        let replies = vec![
            StatusReply::StatusAck {
                accepted: 3,
                refused: Vec::new(),
                launch: launch.clone(),
            },
            StatusReply::StatusAck {
                accepted: 0,
                refused: Vec::new(),
                launch: Vec::new(),
            },
        ];
        let launches = vec![
            ExecutorMessage::LaunchTasks {
                tasks: launch,
                driver_instance: Some(uuid::Uuid::new_v4()),
            },
            ExecutorMessage::LaunchTasks {
                tasks: Vec::new(),
                driver_instance: None,
            },
        ];
        (requests, replies, launches)
    }

    #[test]
    fn what_encode_writes_takes_the_fast_path_and_reads_back_the_same() {
        let (requests, replies, launches) = messages();
        for message in requests {
            assert_eq!(decode(&protocol::encode(&message)), Some(message));
        }
        for message in replies {
            assert_eq!(decode(&protocol::encode(&message)), Some(message));
        }
        for message in launches {
            assert_eq!(decode(&protocol::encode(&message)), Some(message));
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        let declined = |text: &str| {
            let bytes = text.as_bytes();
            decode::<StatusRequest>(bytes).is_none()
                && decode::<StatusReply>(bytes).is_none()
                && decode::<ExecutorMessage>(bytes).is_none()
        };
        let valid_elsewhere = [
            // Whitespace, and keys in another order.
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0] ]}"#,
            r#"{"type":"StatusUpdates","updates":[[1,0]],"executor_id":"e"}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0]]} "#,
            // An update with a result, an escaped id, an unknown field.
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[{"task_id":1,"attempt":0,"state":"FINISHED","result":1}]}"#,
            r#"{"type":"StatusUpdates","executor_id":"\u0065","updates":[]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[],"extra":1}"#,
            // Refusals, and answers other than an ack.
            r#"{"type":"StatusAck","accepted":1,"refused":[{"task_id":1,"attempt":0,"reason":"r"}]}"#,
            r#"{"type":"UnknownExecutor","message":"m"}"#,
            r#"{"type":"KillTask","task_id":1,"attempt":0,"reason":"r"}"#,
        ];
        let invalid = [
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[01,0]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[-1,0]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1.0,0]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1e3,0]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[18446744073709551616,0]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,4294967296]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0,0]]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0],]}"#,
            r#"{"type":"StatusUpdates","executor_id":"a.b","updates":[]}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[],"driver_instance":"x"}"#,
            r#"{"type":"StatusUpdates","executor_id":"e","updates":[]}}"#,
            r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[]}]}"#,
            r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"nope"},"tasks":[[1,0,0]]}]}"#,
            r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,0,0]]}]"#,
        ];
        for text in valid_elsewhere.iter().chain(&invalid) {
            assert!(declined(text), "took the fast path: {text}");
        }
        // The valid ones are serde's to read, and it reads them.
        assert!(serde_json::from_str::<StatusRequest>(valid_elsewhere[3]).is_ok());
        assert!(serde_json::from_str::<StatusReply>(valid_elsewhere[6]).is_ok());
    }

    #[test]
    fn a_deeply_nested_spec_is_left_to_serde() {
        let mut arg = json!(1);
        for _ in 0..SPEC_BRACKETS {
            arg = json!([arg]);
        }
        let spec = Arc::new(TaskSpec::Handler {
            name: "echo".into(),
            arg,
        });
        let launch = ExecutorMessage::LaunchTasks {
            tasks: vec![task(1, 1, &spec)],
            driver_instance: None,
        };
        let bytes = protocol::encode(&launch);
        assert_eq!(decode::<ExecutorMessage>(&bytes), None);
        assert_eq!(
            serde_json::from_slice::<ExecutorMessage>(&bytes).unwrap(),
            launch
        );
    }

    #[test]
    fn only_plain_finishes_have_a_fast_form() {
        let failed = StatusRequest::StatusUpdates {
            executor_id: crate::ids::ExecutorId::parse("e").unwrap(),
            updates: vec![StatusUpdate {
                state: TaskState::Failed,
                error: Some("boom".into()),
                ..StatusUpdate::finished(1, 0)
            }],
            driver_instance: None,
        };
        assert_eq!(decode::<StatusRequest>(&protocol::encode(&failed)), None);
    }
}
