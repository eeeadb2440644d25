//! What an executor reads of memory: a process's resident set (`VmRSS` of `/proc/<pid>/status`)
//! and, of its own memory cgroup, how many processes the kernel's out-of-memory killer has
//! killed in it and its limit. cgroup v2 keeps them in `memory.events` (`oom_kill`) and
//! `memory.max`; v1 in `memory.oom_control` (`oom_kill`) and `memory.limit_in_bytes`. The
//! parsing is pure and tested here; the reads are the few small functions at the end, each
//! `None` where the file is not there (not Linux, no memory cgroup, a kernel without the field).

use std::path::{Path, PathBuf};

/// Where cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A v1 limit this large is no limit: v1 writes "none" as the largest page count in bytes,
/// 9223372036854771712 with 4 KiB pages.
const NO_LIMIT_FROM: u64 = 1 << 62;

/// The resident set in bytes of a `/proc/<pid>/status` text: its `VmRSS:  1234 kB` line.
pub(super) fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// The `oom_kill` count of a cgroup v2 `memory.events` or a v1 `memory.oom_control`: both are
/// lines of `<name> <value>`.
pub(super) fn parse_oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix("oom_kill ")?;
        value.trim().parse().ok()
    })
}

/// The limit of a v2 `memory.max` (`max` or bytes) or a v1 `memory.limit_in_bytes` (bytes);
/// `None` when there is none.
pub(super) fn parse_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < NO_LIMIT_FROM).then_some(bytes)
}

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V1,
    V2,
}

impl Version {
    /// The file with the `oom_kill` count, and the file with the limit.
    fn files(self) -> (&'static str, &'static str) {
        match self {
            Version::V1 => ("memory.oom_control", "memory.limit_in_bytes"),
            Version::V2 => ("memory.events", "memory.max"),
        }
    }
}

/// The directories a process's memory cgroup may be at, most likely first, from its
/// `/proc/<pid>/cgroup`: a v1 `<n>:memory:<path>` line (on a machine with both hierarchies the
/// v2 one holds no memory controller), else the v2 `0::<path>` line. Each path is under
/// `root`, and then `root`'s mount itself: a container that sees its host's path mounts only
/// its own cgroup.
pub(super) fn candidates(proc_cgroup: &str, root: &Path) -> Vec<(Version, PathBuf)> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        } else if controllers.is_empty() {
            v2 = Some(path);
        }
    }
    let (version, mount, path) = match (v1, v2) {
        (Some(path), _) => (Version::V1, root.join("memory"), path),
        (None, Some(path)) => (Version::V2, root.to_path_buf(), path),
        (None, None) => return Vec::new(),
    };
    let inside = mount.join(path.trim_start_matches('/'));
    if inside == mount {
        return vec![(version, mount)];
    }
    vec![(version, inside), (version, mount)]
}

/// `bytes` for a person: `900 MiB`, `1.2 GiB`, `512 KiB`, `300 bytes`.
pub(super) fn show_size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    match bytes {
        b if b >= GIB && b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b >= GIB => format!("{:.1} GiB", b as f64 / GIB as f64),
        b if b >= MIB => format!("{} MiB", (b + MIB / 2) / MIB),
        b if b >= 1024 => format!("{} KiB", (b + 512) / 1024),
        b => format!("{b} bytes"),
    }
}

/// The memory cgroup this executor runs in, found once.
#[derive(Debug, Clone)]
pub(super) struct MemoryCgroup {
    version: Version,
    dir: PathBuf,
}

impl MemoryCgroup {
    /// This process's memory cgroup, if the machine has one whose `oom_kill` count can be read.
    pub(super) fn of_self() -> Option<MemoryCgroup> {
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        candidates(&proc_cgroup, Path::new(CGROUP_ROOT))
            .into_iter()
            .map(|(version, dir)| MemoryCgroup { version, dir })
            .find(|cgroup| cgroup.oom_kills().is_some())
    }

    /// How many processes the out-of-memory killer has killed in it so far.
    pub(super) fn oom_kills(&self) -> Option<u64> {
        let (counter, _) = self.version.files();
        parse_oom_kills(&std::fs::read_to_string(self.dir.join(counter)).ok()?)
    }

    /// Its memory limit, if it has one.
    pub(super) fn limit(&self) -> Option<u64> {
        let (_, limit) = self.version.files();
        parse_limit(&std::fs::read_to_string(self.dir.join(limit)).ok()?)
    }
}

/// The resident set of process `pid` in bytes, if it is there to be read.
pub(super) fn resident_bytes(pid: u32) -> Option<u64> {
    parse_vm_rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resident_set_is_read_from_vm_rss_in_kib() {
        let status =
            "Name:\tpython3\nVmPeak:\t  30000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 9000 kB\n";
        assert_eq!(parse_vm_rss(status), Some(12345 * 1024));
        // A kernel thread, or a zombie, has no VmRSS line.
        assert_eq!(parse_vm_rss("Name:\tkthreadd\nState:\tS\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\t lots kB\n"), None);
    }

    #[test]
    fn the_oom_kill_count_is_read_from_v2_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(events), Some(2));
        assert_eq!(parse_oom_kills("low 0\nhigh 0\n"), None);
    }

    #[test]
    fn the_oom_kill_count_is_read_from_v1_memory_oom_control() {
        let control = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(parse_oom_kills(control), Some(7));
        // Kernels before 4.13 have no oom_kill field.
        assert_eq!(parse_oom_kills("oom_kill_disable 0\nunder_oom 0\n"), None);
    }

    #[test]
    fn limits_of_both_versions_and_none() {
        assert_eq!(parse_limit("314572800\n"), Some(300 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit(""), None);
    }

    #[test]
    fn the_memory_cgroup_is_the_v1_memory_line_before_the_v2_one() {
        let root = Path::new("/sys/fs/cgroup");
        let hybrid = "9:name=systemd:/\n5:devices:/\n4:memory:/process_api/33e3\n0::/\n";
        assert_eq!(
            candidates(hybrid, root),
            vec![
                (
                    Version::V1,
                    PathBuf::from("/sys/fs/cgroup/memory/process_api/33e3")
                ),
                (Version::V1, PathBuf::from("/sys/fs/cgroup/memory")),
            ]
        );
        let joined = "3:cpu,memory:/\n";
        assert_eq!(
            candidates(joined, root),
            vec![(Version::V1, PathBuf::from("/sys/fs/cgroup/memory"))]
        );
        let unified = "0::/system.slice/ember.service\n";
        assert_eq!(
            candidates(unified, root),
            vec![
                (
                    Version::V2,
                    PathBuf::from("/sys/fs/cgroup/system.slice/ember.service")
                ),
                (Version::V2, PathBuf::from("/sys/fs/cgroup")),
            ]
        );
        assert_eq!(candidates("", root), Vec::new());
        assert_eq!(candidates("garbage\n", root), Vec::new());
    }

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(show_size(512 << 20), "512 MiB");
        assert_eq!(show_size(1 << 30), "1 GiB");
        assert_eq!(show_size((1 << 30) + (200 << 20)), "1.2 GiB");
        assert_eq!(show_size(900 * 1024 * 1024 + 100), "900 MiB");
        assert_eq!(show_size(4096), "4 KiB");
        assert_eq!(show_size(300), "300 bytes");
    }
}
