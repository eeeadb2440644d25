//! The TCP ports an executor reserves for the tasks of gangs (`--gang-ports`), so that each
//! task of a gang can be told, before any of them starts, where every other will listen.
//!
//! The executor binds each port at start, without listening and without `SO_REUSEADDR`, so
//! that no other socket on the host may bind it (nor may the kernel hand it to an outgoing
//! connection), and a peer that connects early is refused rather than accepted by the wrong
//! process. It registers the ports as the resource [`GANG_PORT`]; the driver gives each gang
//! task one. When such a task starts, its port's socket is closed, so the task can bind it;
//! when the task's work ends, the port is bound again. A port still held by what the task left
//! running (or in `TIME_WAIT`) is tried again every second for two minutes; meanwhile it is
//! lent unreserved.

use crate::protocol::TaskDescription;
use crate::resources::{GANG_PORT, MAX_ADDRESSES};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpSocket;
use tracing::warn;

/// The variable that lists a gang task's peers: `host:port` of each task started with it, in
/// task order, its own among them.
pub const ENV_PEERS: &str = "EMBER_GANG_PEERS";
/// The variable that holds the port reserved for a gang task: the one its peers reach it at.
pub const ENV_PORT: &str = "EMBER_GANG_PORT";
/// The variable that holds a gang task's place in `EMBER_GANG_PEERS`, from 0.
pub const ENV_RANK: &str = "EMBER_GANG_RANK";

/// How often, and how many times, a port the task's leftovers still hold is tried again.
const REBIND_EVERY: Duration = Duration::from_secs(1);
const REBIND_TRIES: u32 = 120;

/// Which ports an executor reserves for gang tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GangPortsConfig {
    /// One for each core (at most 4096), chosen by the kernel among the free ones (the
    /// default).
    Auto,
    /// None: the executor runs no gang tasks.
    Off,
    /// Each port from the first to the last, both included.
    Range(u16, u16),
}

impl GangPortsConfig {
    /// `--gang-ports`: `auto`, `none`, or `FIRST-LAST` (`41000-41063`).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "auto" => return Ok(GangPortsConfig::Auto),
            "none" => return Ok(GangPortsConfig::Off),
            _ => {}
        }
        let range = text.split_once('-').and_then(|(a, b)| {
            Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?))
        });
        match range {
            Some((first, last)) if first > 0 && first <= last => {
                Ok(GangPortsConfig::Range(first, last))
            }
            _ => Err(format!(
                "{text:?} is not auto, none or a range of TCP ports FIRST-LAST (e.g. 41000-41063)"
            )),
        }
    }
}

/// What one port is now.
#[derive(Debug)]
enum Hold {
    /// Bound by the executor: nobody else may bind it. Never read: dropping it frees the port.
    Reserved(#[allow(dead_code)] TcpSocket),
    /// Closed for a task that runs now.
    Lent,
    /// Free, but not bound again yet (what the last task left still held it).
    Loose,
}

/// The executor's gang ports and what each is now.
#[derive(Debug)]
pub struct GangPorts {
    /// The executor's host as the driver reads it from `--host-port`: each task finds its own
    /// place among its peers by it.
    host: String,
    holds: Mutex<BTreeMap<u16, Hold>>,
}

impl GangPorts {
    /// Binds the ports `config` names (`cores` of them for [`GangPortsConfig::Auto`]); none for
    /// [`GangPortsConfig::Off`]. A port of a range that is taken is an error that names it.
    pub fn reserve(config: GangPortsConfig, cores: u32, host_port: &str) -> Result<Self, String> {
        let wanted: Vec<u16> = match config {
            GangPortsConfig::Off => Vec::new(),
            GangPortsConfig::Auto => vec![0; cores.min(MAX_ADDRESSES) as usize],
            GangPortsConfig::Range(first, last) => (first..=last).collect(),
        };
        if wanted.len() > MAX_ADDRESSES as usize {
            return Err(format!(
                "--gang-ports names {} ports; at most {MAX_ADDRESSES} may be reserved",
                wanted.len(),
            ));
        }
        let mut holds = BTreeMap::new();
        for port in wanted {
            let socket = bind(port).map_err(|e| match port {
                0 => format!("could not reserve a gang port: {e}"),
                _ => format!("could not reserve gang port {port} (--gang-ports): {e}"),
            })?;
            let port = socket.local_addr().map_err(|e| e.to_string())?.port();
            holds.insert(port, Hold::Reserved(socket));
        }
        let host = crate::ids::host_of(host_port).to_string();
        Ok(Self {
            host,
            holds: Mutex::new(holds),
        })
    }

    /// Reserves the ports `config` asks for and adds them to the resources it registers, as
    /// the resource [`GANG_PORT`] (none added when it reserves none).
    pub fn register(config: &mut super::ExecutorConfig) -> Result<Arc<Self>, String> {
        let ports = Self::reserve(config.gang_ports, config.cores, &config.host_port)?;
        let addresses = ports.addresses();
        if !addresses.is_empty() {
            config.resources.insert(GANG_PORT.to_string(), addresses);
        }
        Ok(Arc::new(ports))
    }

    /// The ports, as the addresses of the resource [`GANG_PORT`] the executor registers.
    pub fn addresses(&self) -> Vec<String> {
        self.lock().keys().map(u16::to_string).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Hold>> {
        self.holds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The seat of `task` in its gang, if it is a gang's task: its port, closed now so that the
    /// task can bind it, and bound again when the seat is dropped with the task's work.
    pub fn seat(self: &Arc<Self>, task: &TaskDescription) -> Option<Arc<GangSeat>> {
        let port: u16 = task.resources.get(GANG_PORT)?.first()?.parse().ok()?;
        if let Some(hold) = self.lock().get_mut(&port) {
            // Dropping the socket closes it.
            *hold = Hold::Lent;
        }
        let own = crate::ids::join_host_port(&self.host, &port.to_string());
        let rank = task.gang_peers.iter().position(|p| *p == own);
        Some(Arc::new(GangSeat {
            peers: task.gang_peers.clone(),
            port,
            rank,
            ports: Arc::clone(self),
        }))
    }

    /// Binds `port` again once its task is done with it; tried again later while what the task
    /// left holds it.
    fn give_back(self: &Arc<Self>, port: u16) {
        if self.rebind(port) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let ports = Arc::clone(self);
        runtime.spawn(async move {
            for _ in 0..REBIND_TRIES {
                tokio::time::sleep(REBIND_EVERY).await;
                if ports.rebind(port) {
                    return;
                }
            }
            warn!(
                port,
                "a gang port is still held by what a task left: lent unreserved"
            );
        });
    }

    /// Binds `port` if it is loose (not lent to a task meanwhile); whether it is settled.
    fn rebind(&self, port: u16) -> bool {
        let mut holds = self.lock();
        let Some(hold) = holds.get_mut(&port) else {
            return true;
        };
        match hold {
            Hold::Reserved(_) => true,
            Hold::Lent | Hold::Loose => match bind(port) {
                Ok(socket) => {
                    *hold = Hold::Reserved(socket);
                    true
                }
                Err(_) => {
                    *hold = Hold::Loose;
                    false
                }
            },
        }
    }
}

/// A socket bound to `port` on every IPv4 address, not listening, without `SO_REUSEADDR`.
fn bind(port: u16) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))?;
    Ok(socket)
}

/// A gang task's place: its peers, its port and its rank. Its port is bound again by the
/// executor when the last copy of it (the task's context) is dropped.
#[derive(Debug)]
pub struct GangSeat {
    /// `host:port` of each task of the gang started with this one, in task order.
    pub peers: Vec<String>,
    /// The port reserved for this task.
    pub port: u16,
    /// This task's place in `peers`, from 0.
    pub rank: Option<usize>,
    ports: Arc<GangPorts>,
}

impl GangSeat {
    /// The variables a command or python task of the gang sees.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (ENV_PEERS, self.peers.join(",")),
            (ENV_PORT, self.port.to_string()),
        ];
        if let Some(rank) = self.rank {
            env.push((ENV_RANK, rank.to_string()));
        }
        env
    }
}

impl Drop for GangSeat {
    fn drop(&mut self) {
        self.ports.give_back(self.port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn task(port: u16, peers: &[&str]) -> TaskDescription {
        TaskDescription {
            task_id: 1,
            job_id: 1,
            index: 0,
            attempt: 0,
            cpus: 1,
            spec: Arc::new(crate::protocol::TaskSpec::Handler {
                name: "noop".into(),
                arg: serde_json::Value::Null,
            }),
            resources: [(GANG_PORT.to_string(), vec![port.to_string()])].into(),
            gang_peers: peers.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn flags_parse() {
        assert_eq!(GangPortsConfig::parse("auto"), Ok(GangPortsConfig::Auto));
        assert_eq!(GangPortsConfig::parse("none"), Ok(GangPortsConfig::Off));
        assert_eq!(
            GangPortsConfig::parse("41000-41003"),
            Ok(GangPortsConfig::Range(41000, 41003))
        );
        for bad in ["", "0-3", "5-4", "41000", "a-b", "41000-70000"] {
            assert!(GangPortsConfig::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_reserved_port_is_taken_from_others_lent_to_its_task_and_reserved_again() {
        let ports = Arc::new(GangPorts::reserve(GangPortsConfig::Auto, 2, "h1:0").unwrap());
        let addresses = ports.addresses();
        assert_eq!(addresses.len(), 2);
        let port: u16 = addresses[0].parse().unwrap();
        // Reserved: nobody else binds it, not even with SO_REUSEADDR (as std's listeners do).
        assert!(std::net::TcpListener::bind(("0.0.0.0", port)).is_err());
        // Reserving the same range again fails, naming the port.
        let again = GangPorts::reserve(GangPortsConfig::Range(port, port), 1, "h1:0");
        assert!(again.unwrap_err().contains(&format!("gang port {port}")));
        let own = format!("h1:{port}");
        let seat = ports.seat(&task(port, &["h0:7", &own])).unwrap();
        assert_eq!((seat.port, seat.rank), (port, Some(1)));
        assert_eq!(
            seat.env(),
            [
                (ENV_PEERS, format!("h0:7,{own}")),
                (ENV_PORT, port.to_string()),
                (ENV_RANK, "1".to_string())
            ]
        );
        // Lent: the task binds it.
        let listener = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
        drop(listener);
        // Given back: reserved again.
        drop(seat);
        assert!(std::net::TcpListener::bind(("0.0.0.0", port)).is_err());
        assert!(ports.seat(&task(port, &[])).unwrap().rank.is_none());
        // A task that is not a gang's has no seat.
        let mut plain = task(port, &[]);
        plain.resources.clear();
        assert!(ports.seat(&plain).is_none());
    }

    #[tokio::test]
    async fn a_port_the_task_left_held_is_reserved_again_once_it_is_free() {
        let ports = Arc::new(GangPorts::reserve(GangPortsConfig::Auto, 1, "h1:0").unwrap());
        let port: u16 = ports.addresses()[0].parse().unwrap();
        let seat = ports.seat(&task(port, &[])).unwrap();
        let leftover = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
        drop(seat);
        assert!(matches!(ports.lock()[&port], Hold::Loose));
        drop(leftover);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !matches!(ports.lock()[&port], Hold::Reserved(_)) {
            assert!(std::time::Instant::now() < deadline, "not reserved again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
