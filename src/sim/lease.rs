//! The driver processes' lease, as `driver::lease` holds it with the decisions of
//! `driver::lease_clock` on virtual time: a standby polls the key and takes it once free or
//! lapsed; a leader renews it every third of the lease, and while it has lapsed sends nothing
//! until a renewal of its revision succeeds or the key is found taken.

use super::driver::{AtDriver, Role, ToBroker};
use super::writes::at;
use super::World;
use crate::driver::lease_clock::{self as lease, Key, Watch};
use std::time::Duration;

impl World {
    pub(super) fn lease(&self) -> Duration {
        Duration::from_millis(self.config.lease_ms)
    }

    /// Whether driver `node` may act: not a leader whose lease has lapsed, as
    /// `Guard::is_current` decides.
    pub(super) fn current(&mut self, node: u32) -> bool {
        if !self.config.fencing {
            return true;
        }
        let now = at(self.queue.now());
        let Some(leader) = self.drivers[node as usize].leader() else {
            return true;
        };
        let lapsed = leader.hold.is_some_and(|hold| !hold.is_current(now));
        if lapsed && !std::mem::replace(&mut leader.lapsed, true) {
            self.trace.line(
                self.queue.now(),
                format_args!("d{node}'s lease has lapsed: it sends nothing until renewed"),
            );
        }
        !lapsed
    }

    /// Leadership lost: the process goes back to standing by, its state gone.
    pub(super) fn depose(&mut self, node: u32, why: &str) {
        let now = self.queue.now();
        let driver = &mut self.drivers[node as usize];
        driver.turn += 1;
        driver.role = Role::Standby {
            watch: Watch::default(),
        };
        self.trace
            .line(now, format_args!("d{node} stops leading: {why}"));
        let poll = Self::ms(lease::poll_interval(self.lease()));
        self.due(node, poll, AtDriver::Poll);
    }

    /// A standby's look at the lease key, and a compare-and-set if it is free or lapsed.
    pub(super) fn poll(&mut self, node: u32) -> Result<(), String> {
        let now = self.queue.now();
        let lease = self.lease();
        let Role::Standby { watch } = &mut self.drivers[node as usize].role else {
            return Ok(());
        };
        let revision = self.broker.lease.revision;
        // Every driver of the run declares the same lease.
        let key = match self.broker.lease.holder {
            None => Key::Free,
            Some(_) => Key::Held { revision, lease },
        };
        if watch.may_take(key, at(now)) {
            if let Some(epoch) = self.broker.write_lease(node, revision) {
                return self.lead(node, epoch);
            }
        }
        self.due(node, Self::ms(lease::poll_interval(lease)), AtDriver::Poll);
        Ok(())
    }

    pub(super) fn renew(&mut self, node: u32) -> Result<(), String> {
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let Some(hold) = leader.hold else {
            return Ok(());
        };
        let (expected, sent) = (hold.revision(), self.queue.now());
        self.send_to_broker(node, ToBroker::Renew { expected, sent })
    }

    pub(super) fn renewed(
        &mut self,
        node: u32,
        sent: u64,
        revision: Option<u64>,
    ) -> Result<(), String> {
        let now = self.queue.now();
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let Some(hold) = leader.hold.as_mut() else {
            return Ok(());
        };
        let Some(revision) = revision else {
            self.depose(node, "another driver took the lease");
            return Ok(());
        };
        let next = hold.renewed(revision, at(sent));
        let valid_until = hold.valid_until();
        if hold.is_current(at(now)) && std::mem::take(&mut leader.lapsed) {
            self.trace
                .line(now, format_args!("d{node}'s lease renewed after it lapsed"));
        }
        let (expire, next) = (
            Self::ms(valid_until).saturating_sub(now),
            Self::ms(next).saturating_sub(now),
        );
        self.due(node, expire, AtDriver::Expire);
        self.due(node, next, AtDriver::Renew);
        Ok(())
    }
}
