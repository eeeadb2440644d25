//! The start gate: offers wait until enough executors have registered, or until the longest
//! wait has passed, and then the gate stays open.

use super::*;
use crate::driver::core::StartGate;

fn gated(min_registered: u64, max_wait_ms: u64) -> Core {
    let mut core = new_core(0);
    core.set_start_gate(
        StartGate {
            min_registered,
            max_wait_ms,
        },
        0,
    );
    core
}

#[test]
fn offers_wait_for_the_required_executors() {
    let mut core = gated(2, 30_000);
    add(&mut core, "a", 1, 1);
    let (_, launched) = start(&mut core, job(2, 1, 4), 2);
    assert_eq!(launched, [], "one of two executors: nothing launched");
    core.tick(3);
    assert_eq!(launches(&core.take_effects()), []);
    let gate = core.start_gate().unwrap().clone();
    assert_eq!((gate.opened_at_ms, gate.reason), (None, None));
    let effects = add(&mut core, "b", 1, 4);
    let mut on: Vec<String> = launches(&effects).into_iter().map(|l| l.0).collect();
    on.sort();
    assert_eq!(on, ["a", "b"], "the job spreads over both");
    let gate = core.start_gate().unwrap();
    assert_eq!(gate.opened_at_ms, Some(4));
    assert_eq!(
        gate.reason.as_deref(),
        Some("2 executors registered, of the 2 required")
    );
    check_invariants(&core);
    // Open for good: an executor lost does not close it.
    core.remove_executor(&eid("b"), "gone".into(), 5);
    assert_eq!(launches(&core.take_effects()), []);
    let effects = report(&mut core, "a", vec![finished(1, 0)], 6);
    assert_eq!(launches(&effects), [("a".into(), vec![(2, 1, 1)])]);
}

#[test]
fn the_longest_wait_opens_the_gate_with_fewer() {
    let mut core = gated(3, 1_000);
    add(&mut core, "a", 2, 10);
    let (_, launched) = start(&mut core, job(2, 1, 4), 20);
    assert_eq!(launched, []);
    core.tick(999);
    assert_eq!(launches(&core.take_effects()), []);
    core.tick(1_000);
    let effects = core.take_effects();
    assert_eq!(
        launches(&effects),
        [("a".into(), vec![(1, 0, 0), (2, 1, 0)])]
    );
    let reason = core.start_gate().unwrap().reason.clone().unwrap();
    assert!(reason.contains("longest wait"), "{reason}");
    assert!(
        reason.contains("1 executor registered, of the 3 required"),
        "{reason}"
    );
}

#[test]
fn without_a_gate_offers_are_made_at_once() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (_, launched) = start(&mut core, job(1, 1, 4), 2);
    assert_eq!(launched.len(), 1);
    assert_eq!(core.start_gate(), None);
    assert_eq!(core.executors_snapshot().start_gate, None);
}
