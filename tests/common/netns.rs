//! Hosts made of network namespaces: each host a namespace with its own address on a bridge
//! that lives in a namespace of its own, so a test touches nothing of the machine's network and
//! every test may use the same addresses. Processes start inside a host with `ip netns exec`;
//! a thread of the test enters one to run a client there. Faults are nftables tables inside a
//! host's namespace: a cut (everything but loopback dropped) and random loss. Dropping the
//! [`Net`] deletes every namespace it made, and with them their links and tables; a net left
//! by a test process that died is deleted by the next one that starts.
//!
//! Needs root, `ip` and `nft`. `EMBER_NETNS_TESTS=0` skips these tests ([`Net::new`] returns
//! `None`); otherwise a machine that cannot make namespaces fails them, saying why.

use std::ffi::OsStr;
use std::future::Future;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Where every namespace of these tests starts its name: `emb<pid>x<n>-<host>`.
const PREFIX: &str = "emb";
/// The hosts' subnet (the bridge's own namespace keeps it away from the machine's).
const SUBNET: &str = "10.77.0";

static NETS: AtomicU32 = AtomicU32::new(0);

/// A bridge and the hosts on it, deleted on drop.
pub struct Net {
    id: String,
    switch: String,
    namespaces: Vec<String>,
    hosts: u8,
}

/// One host: a namespace with an address on the net's bridge.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    pub ns: String,
    pub addr: String,
}

/// Runs `ip` (or `nft`) with `args`; its failure, with what it printed.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// Runs `nft -f -` with `script` in namespace `ns`.
fn nft(ns: &str, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "nft in {ns}: {}\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Deletes the namespaces of nets whose test process is gone.
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('x').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

impl Net {
    /// A new net with its bridge, or `None` when `EMBER_NETNS_TESTS=0` says to skip these
    /// tests. Panics, saying why, when namespaces cannot be made.
    pub fn new() -> Option<Net> {
        if std::env::var("EMBER_NETNS_TESTS").is_ok_and(|v| v == "0") {
            eprintln!("skipped: EMBER_NETNS_TESTS=0");
            return None;
        }
        sweep_stale();
        let n = NETS.fetch_add(1, Ordering::SeqCst);
        let id = format!("{PREFIX}{}x{n}", std::process::id());
        let switch = format!("{id}-sw");
        let mut net = Net {
            id,
            switch: switch.clone(),
            namespaces: Vec::new(),
            hosts: 0,
        };
        let made = (|| {
            run("ip", &["netns", "add", &switch])?;
            net.namespaces.push(switch.clone());
            run(
                "ip",
                &["-n", &switch, "link", "add", "br0", "type", "bridge"],
            )?;
            run("ip", &["-n", &switch, "link", "set", "br0", "up"])?;
            run("nft", &["--version"])
        })();
        if let Err(error) = made {
            panic!(
                "these tests make hosts of network namespaces, which takes root, iproute2 and \
                 nftables (scripts/test installs nftables); set EMBER_NETNS_TESTS=0 to skip \
                 them: {error}"
            );
        }
        Some(net)
    }

    /// A new host on the bridge, at the next address.
    pub fn host(&mut self, name: &str) -> Host {
        self.hosts += 1;
        let n = self.hosts;
        assert!(n < 250, "too many hosts");
        let ns = format!("{}-{name}", self.id);
        let addr = format!("{SUBNET}.{n}");
        let port = format!("p{n}");
        let made = (|| {
            run("ip", &["netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            run(
                "ip",
                &[
                    "link",
                    "add",
                    "eth0",
                    "netns",
                    &ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &port,
                    "netns",
                    &self.switch,
                ],
            )?;
            run(
                "ip",
                &["-n", &self.switch, "link", "set", &port, "master", "br0"],
            )?;
            run("ip", &["-n", &self.switch, "link", "set", &port, "up"])?;
            run(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    "eth0",
                ],
            )?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])
        })();
        if let Err(error) = made {
            panic!("could not make host {name}: {error}");
        }
        Host {
            name: name.into(),
            ns,
            addr,
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // A namespace's links and nftables tables go with it.
        for ns in self.namespaces.iter().rev() {
            if let Err(error) = run("ip", &["netns", "del", ns]) {
                eprintln!("{error}");
            }
        }
    }
}

impl Host {
    /// `program`, to start inside this host (killed when the handle drops).
    pub fn command(&self, program: impl AsRef<OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ip");
        command
            .args(["netns", "exec", &self.ns])
            .arg(program)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Cuts the host off: every packet in or out but loopback's is dropped until [`Host::heal`].
    pub fn cut(&self) {
        let script = "table inet ember_cut {
            chain input { type filter hook input priority -10; policy drop; iif lo accept; }
            chain output { type filter hook output priority -10; policy drop; oif lo accept; }
        }";
        nft(&self.ns, script).expect("cut");
    }

    /// Ends a cut, or a partition.
    pub fn heal(&self) {
        nft(&self.ns, "delete table inet ember_cut").expect("heal");
    }

    /// Parts this host from `others`: every packet between it and them is dropped until
    /// [`Host::heal`]; the rest of the net still reaches it.
    pub fn part_from(&self, others: &[&Host]) {
        let addrs: Vec<&str> = others.iter().map(|h| h.addr.as_str()).collect();
        let set = addrs.join(", ");
        let script = format!(
            "table inet ember_cut {{
                chain input {{ type filter hook input priority -10; policy accept;
                    ip saddr {{ {set} }} drop; }}
                chain output {{ type filter hook output priority -10; policy accept;
                    ip daddr {{ {set} }} drop; }}
            }}"
        );
        nft(&self.ns, &script).expect("part");
    }

    /// Drops `percent` of the packets in each direction, at random, until [`Host::clear_loss`].
    pub fn lossy(&self, percent: u32) {
        let script = format!(
            "table inet ember_loss {{
                chain input {{ type filter hook input priority -5; policy accept;
                    iif != lo numgen random mod 100 < {percent} drop; }}
                chain output {{ type filter hook output priority -5; policy accept;
                    oif != lo numgen random mod 100 < {percent} drop; }}
            }}"
        );
        nft(&self.ns, &script).expect("lossy");
    }

    /// Ends random loss.
    pub fn clear_loss(&self) {
        nft(&self.ns, "delete table inet ember_loss").expect("clear loss");
    }

    /// Runs `work` on a thread of its own inside this host's namespace, on a runtime of that
    /// thread alone (so every socket it opens is the host's), and gives what it returns.
    pub async fn run<T, F, Fut>(&self, work: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let path = format!("/var/run/netns/{}", self.ns);
        let thread = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("the host's namespace");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the host's namespace");
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(work())
        });
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .expect("joined")
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// Waits up to `limit` for `check` to hold, polling.
pub fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
