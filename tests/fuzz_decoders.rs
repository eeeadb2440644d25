//! Property-based fuzzing of every decoder: arbitrary bytes, byte-level mutations of valid
//! messages and structural mutations (a field replaced by any JSON) go into
//! `ember::protocol::decode::<T>` for every message enum. Each must return `Ok` or `Err` and
//! never panic; what decodes must encode and decode back to itself. The hot messages' fast
//! readers (`Message::decode_fast`, beside each one's writer in src/protocol/) are held to serde: `decode` must read what serde reads from the same
//! bytes, and refuse what it refuses in the same words.
//!
//! CI runs proptest's default 256 cases per property. For a long run:
//!
//! ```sh
//! PROPTEST_CASES=100000 cargo test --release --test fuzz_decoders
//! ```
//!
//! A failure is shrunk and saved under proptest-regressions/ and replayed first next time.

use ember::protocol::{
    decode, encode, ApiReply, ApiRequest, DecodeError, Event, ExecutorMessage, HeartbeatReply,
    HeartbeatRequest, Message, RegisterReply, RegisterRequest, StatusReply, StatusRequest,
    TaskSpec,
};
use proptest::prelude::*;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// Valid messages, at least one of every enum, as other-language senders write them.
const SEEDS: &[&str] = &[
    r#"{"type":"RegisterExecutor","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"worker-3:7078","cores":8,"log_urls":{"stderr":"http://w/e"},"attributes":{"rack":"r1"}}"#,
    r#"{"type":"RegisteredExecutor","executor_id":"exec-1","driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    r#"{"type":"RegisterExecutorFailed","message":"Duplicate executor ID: exec-1"}"#,
    r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[{"task_id":42,"attempt":0,"state":"FINISHED","result":{"exit_code":0}},{"task_id":43,"attempt":1,"state":"FAILED","error":"boom"},[44,0]]}"#,
    r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[[42,0],[43,1]],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    r#"{"type":"StatusAck","accepted":1,"refused":[{"task_id":43,"attempt":1,"reason":"stale"}]}"#,
    r#"{"type":"StatusAck","accepted":1,"refused":[],"launch":[{"job_id":2,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[44,3,0],[45,4,1]]}]}"#,
    r#"{"type":"UnknownExecutor","message":"executor exec-1 is not registered"}"#,
    r#"{"type":"Heartbeat","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":[{"task_id":42,"attempt":0}]}"#,
    r#"{"type":"DecommissionExecutor","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"}"#,
    r#"{"type":"HeartbeatResponse","reregister":true}"#,
    r#"{"type":"SubmitJob","name":"pi","tasks":[{"kind":"handler","name":"sleep","arg":{"ms":100}},{"kind":"command","argv":["sh","-c","echo hi"],"env":{"A":"1"},"cwd":"/tmp","timeout_ms":1000}],"repeat":3,"max_failures":4,"cpus_per_task":1}"#,
    r#"{"type":"KillJob","job_id":7}"#,
    r#"{"type":"GetResults","job_id":7,"offset":0,"limit":10}"#,
    r#"{"type":"ListExecutors"}"#,
    r#"{"type":"StopExecutor","executor_id":"exec-1"}"#,
    r#"{"type":"JobAccepted","job_id":7}"#,
    r#"{"type":"Error","message":"no job with id 99"}"#,
    r#"{"type":"Results","job_id":7,"results":[{"index":0,"task_id":40,"state":"FINISHED","attempts":1,"executor_id":"exec-1","result":{"exit_code":0}}],"next_offset":null}"#,
    r#"{"type":"LaunchTasks","tasks":[{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[42,3,0],[43,4,0]]},{"job_id":8,"cpus":2,"spec":{"kind":"command","argv":["true"]},"tasks":[[50,0,2]]}],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    r#"{"type":"KillTask","task_id":42,"attempt":0,"reason":"job 7 killed","driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    r#"{"type":"StopExecutor","reason":"decommissioned by request"}"#,
    r#"{"type":"ExecutorAdded","time_ms":1700000000000,"executor_id":"exec-1","info":{"host":"worker-3","host_port":"worker-3:7078","total_cores":8,"log_urls":{},"attributes":{}}}"#,
    r#"{"type":"TaskEnd","time_ms":3000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[41,2,0,3],{"task_id":42,"index":3,"attempt":0,"state":"FAILED","duration_ms":15,"error":"boom"}]}]}"#,
    r#"{"type":"TaskStart","time_ms":2000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[42,3,0],[44,5,0]]}]}"#,
    r#"{"type":"TaskStart","time_ms":2000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[42,3,0,3],[46,7,1]]}]}"#,
    r#"{"type":"TaskEnd","time_ms":3000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[41,2,0,[3,0,1]],[44,5,0,2]]}]}"#,
    r#"{"type":"JobEnd","time_ms":4001,"job_id":8,"state":"KILLED","succeeded":1,"failed":0,"killed":9,"reason":"killed by request"}"#,
    r#"{"kind":"command","argv":["true"]}"#,
    r#"{"kind":"python","function":"gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==","args":"gASVDAAAAAAAAABDAmFilIWUfZSGlC4=","map":true,"timeout_ms":1000}"#,
    r#"{"type":"LaunchTasks","tasks":[{"job_id":9,"cpus":1,"spec":{"kind":"python","function":"gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==","args":"gASVDAAAAAAAAABDAmFilIWUfZSGlC4="},"tasks":[[60,0,0]]}]}"#,
];

/// Decodes `payload` as `T` under a generous and a tight limit. Whatever decodes must survive
/// an encode and decode unchanged; messages with floats are left to
/// `floats_in_task_args_survive_the_wire_exactly`, which checks them exactly.
fn check<T>(payload: &[u8]) -> Result<(), TestCaseError>
where
    T: Message + Serialize + PartialEq + std::fmt::Debug + 'static,
{
    let _ = decode::<T>(payload, 64);
    let decoded = decode::<T>(payload, usize::MAX);
    same_as_serde(payload, &decoded)?;
    if let Ok(message) = decoded {
        if serde_json::from_slice::<Value>(payload).is_ok_and(|v| has_float(&v)) {
            return Ok(());
        }
        let again = decode::<T>(&encode(&message), usize::MAX);
        prop_assert!(
            again.as_ref().is_ok_and(|m| *m == message),
            "{message:?} did not survive a round trip: {again:?}"
        );
    }
    Ok(())
}

/// `decode`'s answer, for a payload it does not refuse as empty, is serde's: the same message,
/// or an error in the same words.
fn same_as_serde<T>(payload: &[u8], decoded: &Result<T, DecodeError>) -> Result<(), TestCaseError>
where
    T: DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let serde = serde_json::from_slice::<T>(payload);
    match (decoded, &serde) {
        (Ok(ours), Ok(theirs)) => prop_assert_eq!(ours, theirs),
        (Err(DecodeError::Json(ours)), Err(theirs)) => {
            prop_assert_eq!(ours.to_string(), theirs.to_string())
        }
        _ => prop_assert!(false, "decode gave {decoded:?} where serde gave {serde:?}"),
    }
    Ok(())
}

/// Feeds `payload` to every decoder. Returns how many accepted it.
fn check_all(payload: &[u8]) -> Result<usize, TestCaseError> {
    check::<RegisterRequest>(payload)?;
    check::<RegisterReply>(payload)?;
    check::<StatusRequest>(payload)?;
    check::<StatusReply>(payload)?;
    check::<HeartbeatRequest>(payload)?;
    check::<HeartbeatReply>(payload)?;
    check::<ApiRequest>(payload)?;
    check::<ApiReply>(payload)?;
    check::<ExecutorMessage>(payload)?;
    check::<Event>(payload)?;
    check::<TaskSpec>(payload)?;
    Ok(accepted(payload))
}

fn has_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_f64(),
        Value::Array(items) => items.iter().any(has_float),
        Value::Object(map) => map.values().any(has_float),
        _ => false,
    }
}

fn accepted(payload: &[u8]) -> usize {
    let ok = |r: bool| r as usize;
    ok(decode::<RegisterRequest>(payload, usize::MAX).is_ok())
        + ok(decode::<RegisterReply>(payload, usize::MAX).is_ok())
        + ok(decode::<StatusRequest>(payload, usize::MAX).is_ok())
        + ok(decode::<StatusReply>(payload, usize::MAX).is_ok())
        + ok(decode::<HeartbeatRequest>(payload, usize::MAX).is_ok())
        + ok(decode::<HeartbeatReply>(payload, usize::MAX).is_ok())
        + ok(decode::<ApiRequest>(payload, usize::MAX).is_ok())
        + ok(decode::<ApiReply>(payload, usize::MAX).is_ok())
        + ok(decode::<ExecutorMessage>(payload, usize::MAX).is_ok())
        + ok(decode::<Event>(payload, usize::MAX).is_ok())
        + ok(decode::<TaskSpec>(payload, usize::MAX).is_ok())
}

/// One byte-level edit.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
}

/// Bytes that matter to JSON, and some that break UTF-8, more often than chance would pick.
fn interesting_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        prop::sample::select(b"{}[]\":,\\0123456789-+.eEtrufalsn \x00\x7f\xc3\xed\xff".to_vec()),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), interesting_byte()).prop_map(|(at, b)| Edit::Flip(at, b)),
        (any::<usize>(), interesting_byte()).prop_map(|(at, b)| Edit::Insert(at, b)),
        (any::<usize>(), 1..16usize).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), 1..64usize).prop_map(|(at, n)| Edit::Duplicate(at, n)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = bytes.len().max(1);
        match *edit {
            Edit::Flip(at, b) if !bytes.is_empty() => bytes[at % len] = b,
            Edit::Insert(at, b) => bytes.insert(at % (bytes.len() + 1), b),
            Edit::Delete(at, n) if !bytes.is_empty() => {
                let start = at % len;
                bytes.drain(start..(start + n).min(bytes.len()));
            }
            Edit::Duplicate(at, n) if !bytes.is_empty() => {
                let start = at % len;
                let piece = bytes[start..(start + n).min(bytes.len())].to_vec();
                bytes.splice(start..start, piece);
            }
            Edit::Truncate(at) => bytes.truncate(at % len),
            _ => {}
        }
    }
    bytes
}

/// Any JSON value, numbers at their extremes included.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![u64::MAX, u32::MAX as u64 + 1, 0, 1, 65_536, 65_537])
            .prop_map(Value::from),
        ".{0,24}".prop_map(Value::String),
        prop::sample::select(vec![
            "exec-1",
            "a.b",
            "*",
            ">",
            "",
            "FINISHED",
            "LOST",
            "handler",
            "command",
            "python",
            "gASVDAAAAAAAAABDAmFilIWUfZSGlC4=",
            "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b",
            "RegisterExecutor",
            "SubmitJob",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,12}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces the `pick`-th node of `value` (in depth-first order) by `with`.
fn replace_node(value: &mut Value, pick: &mut usize, with: &Value) -> bool {
    if *pick == 0 {
        *value = with.clone();
        return true;
    }
    *pick -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|v| replace_node(v, pick, with)),
        Value::Object(map) => map.values_mut().any(|v| replace_node(v, pick, with)),
        _ => false,
    }
}

/// The hot messages as Ember writes them: the fast path's own input.
const HOT: &[&str] = &[
    r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[[42,0],[18446744073709551615,4294967295],[0,1]],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    r#"{"type":"StatusAck","accepted":3,"refused":[],"launch":[{"job_id":2,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[44,3,0],[45,4,1]]},{"job_id":3,"cpus":4294967295,"spec":{"kind":"command","argv":["true"],"env":{},"cwd":null,"timeout_ms":null},"tasks":[[46,0,9]]}]}"#,
    r#"{"type":"LaunchTasks","tasks":[{"job_id":18446744073709551615,"cpus":2,"spec":{"kind":"handler","name":"echo","arg":{"value":[1,"x"]}},"tasks":[[7,0,0]]}],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[[42,0],{"task_id":43,"attempt":1,"state":"FAILED","result":{"exit_code":3},"error":"boom"},{"task_id":44,"attempt":0,"state":"FINISHED","result_object":{"object":"abababababababababababababababababababababababababababababababab","bytes":2000000}}]}"#,
    r#"{"type":"StatusAck","accepted":1,"refused":[{"task_id":43,"attempt":1,"reason":"stale"}],"launch":[{"job_id":2,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"resources":{"gpu":["0","1"]},"tasks":[[44,3,0]]}]}"#,
];

/// Bytes that change how a number, a string or a list reads.
fn number_byte() -> impl Strategy<Value = u8> {
    prop::sample::select(b"0123456789-+.eE ,[]{}\"\\".to_vec())
}

fn seed() -> impl Strategy<Value = &'static str> {
    prop::sample::select(SEEDS.to_vec())
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        check_all(&bytes)?;
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,512}") {
        check_all(text.as_bytes())?;
    }

    #[test]
    fn mutated_messages_never_panic(
        seed in seed(),
        edits in prop::collection::vec(edit(), 1..8),
    ) {
        check_all(&apply(seed.as_bytes().to_vec(), &edits))?;
    }

    #[test]
    fn mutated_hot_messages_read_as_serde_reads(
        seed in prop::sample::select(HOT.to_vec()),
        edits in prop::collection::vec(
            prop_oneof![
                (any::<usize>(), number_byte()).prop_map(|(at, b)| Edit::Flip(at, b)),
                (any::<usize>(), number_byte()).prop_map(|(at, b)| Edit::Insert(at, b)),
                (any::<usize>(), 1..4usize).prop_map(|(at, n)| Edit::Delete(at, n)),
            ],
            1..4,
        ),
    ) {
        let payload = apply(seed.as_bytes().to_vec(), &edits);
        check::<StatusRequest>(&payload)?;
        check::<StatusReply>(&payload)?;
        check::<ExecutorMessage>(&payload)?;
    }

    #[test]
    fn a_field_replaced_by_any_json_never_panics(
        seed in seed(),
        pick in 0..64usize,
        with in json(),
    ) {
        let mut value: Value = serde_json::from_str(seed).expect("seeds are JSON");
        let mut pick = pick;
        replace_node(&mut value, &mut pick, &with);
        check_all(&serde_json::to_vec(&value).expect("a Value serializes"))?;
    }

    #[test]
    fn an_added_field_of_any_json_never_panics(
        seed in seed(),
        key in "[a-z_]{1,12}",
        with in json(),
    ) {
        let mut value: Value = serde_json::from_str(seed).expect("seeds are JSON");
        if let Value::Object(map) = &mut value {
            map.insert(key, with);
        }
        check_all(&serde_json::to_vec(&value).expect("a Value serializes"))?;
    }

    #[test]
    fn deep_nesting_never_panics(
        depth in 100..20_000usize,
        opener in prop::sample::select(vec!["[", "{\"a\":", "{\"type\":\"SubmitJob\",\"tasks\":["]),
    ) {
        let body = format!("{}{}", opener.repeat(depth), "]".repeat(depth));
        prop_assert_eq!(check_all(body.as_bytes())?, 0);
    }
}

#[test]
fn every_seed_decodes_as_some_message() {
    for seed in SEEDS.iter().chain(HOT) {
        let accepted = check_all(seed.as_bytes()).expect("round trip");
        assert!(accepted >= 1, "no decoder accepts the seed {seed}");
    }
}

/// Found by `a_field_replaced_by_any_json_never_panics`: a float in a task's `arg` (or a
/// `result`) can come out of the driver one unit in the last place off, because serde_json
/// parses floats fast but not exactly unless its `float_roundtrip` feature is on.
#[test]
fn floats_in_task_args_survive_the_wire_exactly() {
    let sent = r#"{"type":"SubmitJob","tasks":[{"kind":"handler","name":"x","arg":4.686893672333539e197}]}"#;
    let once: ApiRequest = decode(sent.as_bytes(), usize::MAX).expect("decodes");
    let twice: ApiRequest = decode(&encode(&once), usize::MAX).expect("decodes");
    assert_eq!(once, twice);
}
