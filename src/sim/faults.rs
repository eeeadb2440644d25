//! Node faults: executors killed or decommissioned, executors cut off from the driver, and the
//! driver killed, each a Poisson process at its configured rate until the faults stop. A killed
//! executor is replaced by a new process (a new id) a little later; a killed driver by a new
//! driver instance.

use super::{Event, World};

/// A kind of node fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kill,
    Stop,
    Partition,
    DriverRestart,
    DriverPause,
}

/// How many faults a run injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
    pub partitions: u64,
    pub kills: u64,
    pub stops: u64,
    pub driver_restarts: u64,
    pub driver_pauses: u64,
}

impl Counts {
    pub fn total(&self) -> u64 {
        self.dropped
            + self.duplicated
            + self.delayed
            + self.partitions
            + self.kills
            + self.stops
            + self.driver_restarts
            + self.driver_pauses
    }
}

const MINUTE: f64 = 60_000.0;

impl World {
    /// Schedules the first fault of each kind.
    pub(super) fn schedule_faults(&mut self) {
        for kind in [
            Kind::Kill,
            Kind::Stop,
            Kind::Partition,
            Kind::DriverRestart,
            Kind::DriverPause,
        ] {
            self.schedule_fault(kind);
        }
    }

    /// Schedules the next fault of `kind`, if its rate is not zero and it falls before the
    /// faults stop.
    fn schedule_fault(&mut self, kind: Kind) {
        let f = &self.config.faults;
        let executors = f64::from(self.config.executors);
        let per_minute = match kind {
            Kind::Kill => f.kill * executors,
            Kind::Stop => f.stop * executors,
            Kind::Partition => f.partition * executors,
            Kind::DriverRestart => f.driver_restart,
            Kind::DriverPause => f.driver_pause,
        };
        if per_minute <= 0.0 {
            return;
        }
        let at = self.queue.now() + self.rng.exponential(per_minute / MINUTE);
        if at < f.for_ms {
            self.queue.at(at, Event::Fault(kind));
        }
    }

    pub(super) fn fault(&mut self, kind: Kind) -> Result<(), String> {
        self.schedule_fault(kind);
        let now = self.queue.now();
        match kind {
            Kind::DriverRestart => {
                // Half the time a SIGTERM, which lets the lease go; else a SIGKILL.
                let graceful = self.rng.chance(0.5);
                if self.driver_down(graceful) {
                    self.counts.driver_restarts += 1;
                    let how = if graceful { "stopped" } else { "killed" };
                    self.trace
                        .line(now, format_args!("the leading driver is {how}"));
                }
                return Ok(());
            }
            Kind::DriverPause => {
                let for_ms = self.rng.between(1, self.config.faults.pause_ms);
                if self.driver_pause(for_ms) {
                    self.counts.driver_pauses += 1;
                }
                return Ok(());
            }
            _ => {}
        }
        let Some(pid) = self.live_victim() else {
            return Ok(());
        };
        self.trace
            .line(now, format_args!("fault {kind:?} on e{pid}"));
        match kind {
            Kind::Kill => {
                self.counts.kills += 1;
                self.leave(pid);
                Ok(())
            }
            Kind::Stop => {
                self.counts.stops += 1;
                self.stop(pid, "stopped by the simulation", now);
                self.executor_stepped(pid)
            }
            Kind::Partition => {
                self.counts.partitions += 1;
                let until = now + self.rng.between(1, self.config.faults.partition_ms);
                self.network.partition(pid, until);
                self.ledger.runs.disturb(pid, now, until);
                Ok(())
            }
            Kind::DriverRestart | Kind::DriverPause => unreachable!("handled above"),
        }
    }

    /// A live executor process, drawn at random (none if a few draws find only dead ones).
    fn live_victim(&mut self) -> Option<u32> {
        (0..8).find_map(|_| {
            let pid = self.rng.below(self.procs.len() as u64) as u32;
            self.procs
                .get(pid as usize)
                .filter(|p| p.alive && !p.machine.is_draining())
                .map(|_| pid)
        })
    }

    /// The fault counts, the network's included.
    pub(super) fn counts_with_network(&self) -> Counts {
        Counts {
            dropped: self.network.dropped,
            duplicated: self.network.duplicated,
            delayed: self.network.delayed,
            ..self.counts.clone()
        }
    }
}
