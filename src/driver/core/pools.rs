//! Which job an offer looks at first: Spark's scheduling modes.
//!
//! Under FIFO (the default) the offer queue holds the jobs with tasks waiting, higher
//! `priority` first and then older first; a job's place is found once, when it joins the queue,
//! so an offer costs nothing more than before.
//!
//! Under FAIR, jobs run in named pools, each with a weight, a minimum share (in cores) and a
//! mode for its own jobs, as in Spark's fair scheduler (`Pool`, `FairSchedulingAlgorithm`):
//! pools below their minimum share come first, the least served of them (cores in use over
//! minimum share) first; then the others by cores in use over weight; ties by name. Within a
//! pool, `fifo` orders its jobs as above, and `fair` by cores in use (each job weight 1, no
//! minimum share), then as `fifo`. Each pool keeps its cores in use and its jobs in order,
//! updated as tasks start and end, so each task an offer deals costs a sort of the pools (a
//! few) and a walk from the first job, never a sort of every job.
//!
//! "Cores in use" are the cores of a pool's (or job's) running attempts: a task of
//! `cpus_per_task` 2 counts 2. A job naming a pool nobody declared gets a pool of its own name
//! with weight 1, minimum share 0 and mode `fifo`, as Spark does; it goes when its last job has.

use super::Core;
use crate::ids::JobId;
use crate::protocol::{ApiReply, PoolSummary, SubmitJob};
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, HashMap};

/// The pool of a job that names none.
pub const DEFAULT_POOL: &str = "default";
/// The longest pool name, in bytes.
pub const MAX_POOL_NAME_LEN: usize = 64;
/// The range of a job's priority.
pub const MIN_PRIORITY: i32 = -1000;
pub const MAX_PRIORITY: i32 = 1000;
/// The largest weight and minimum share a pool may be declared with.
pub const MAX_WEIGHT: u32 = 1000;
pub const MAX_MIN_SHARE: u32 = 1_000_000;

/// How jobs share the cores: the driver's `--scheduling`, or a pool's `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingMode {
    /// Higher priority first, then the older job first.
    #[default]
    Fifo,
    /// By cores in use, against weights and minimum shares.
    Fair,
}

impl SchedulingMode {
    /// `fifo` or `fair`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "fifo" => Ok(SchedulingMode::Fifo),
            "fair" => Ok(SchedulingMode::Fair),
            _ => Err(format!(
                "{text:?} is not a scheduling mode: write fifo or fair"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingMode::Fifo => "fifo",
            SchedulingMode::Fair => "fair",
        }
    }
}

/// A pool as the driver declares it (Spark's `fairscheduler.xml` entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub name: String,
    /// Its share of the cores against other pools' weights, once every pool has its minimum.
    pub weight: u32,
    /// Cores it gets before any pool beyond its own minimum gets more.
    pub min_share: u32,
    /// How it orders its own jobs.
    pub mode: SchedulingMode,
}

impl PoolConfig {
    /// The pool a job gets when it names a pool nobody declared: weight 1, minimum share 0,
    /// `fifo`.
    pub fn undeclared(name: &str) -> Self {
        PoolConfig {
            name: name.to_string(),
            weight: 1,
            min_share: 0,
            mode: SchedulingMode::Fifo,
        }
    }

    /// `NAME[:weight=W][,min-share=M][,mode=fifo|fair]`, as `--pool` takes it; what is not
    /// given is as for an undeclared pool.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, settings) = text.split_once(':').unwrap_or((text, ""));
        validate_pool_name(name)?;
        let mut pool = PoolConfig::undeclared(name);
        let mut seen = Vec::new();
        for setting in settings.split(',').filter(|s| !s.trim().is_empty()) {
            let (key, value) = setting.split_once('=').ok_or_else(|| {
                format!("pool {name}: {setting:?} is not KEY=VALUE (weight, min-share or mode)")
            })?;
            let key = key.trim();
            if seen.contains(&key) {
                return Err(format!("pool {name}: {key} is given twice"));
            }
            seen.push(key);
            let number = |max: u32, min: u32| match value.trim().parse::<u32>() {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                _ => Err(format!(
                    "pool {name}: {key} must be a whole number from {min} to {max}; got {value:?}"
                )),
            };
            match key {
                "weight" => pool.weight = number(MAX_WEIGHT, 1)?,
                "min-share" | "min_share" | "minShare" => {
                    pool.min_share = number(MAX_MIN_SHARE, 0)?
                }
                "mode" => {
                    pool.mode =
                        SchedulingMode::parse(value).map_err(|e| format!("pool {name}: {e}"))?
                }
                _ => {
                    return Err(format!(
                        "pool {name}: unknown setting {key:?} (weight, min-share or mode)"
                    ))
                }
            }
        }
        Ok(pool)
    }
}

/// The driver's scheduling: its mode and the pools it declares (used under `fair` only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scheduling {
    pub mode: SchedulingMode,
    pub pools: Vec<PoolConfig>,
}

impl Scheduling {
    /// `mode` with `pools`, each declared once.
    pub fn new(mode: SchedulingMode, pools: Vec<PoolConfig>) -> Result<Self, String> {
        for (i, pool) in pools.iter().enumerate() {
            if pools[..i].iter().any(|p| p.name == pool.name) {
                return Err(format!("pool {} is declared twice", pool.name));
            }
        }
        Ok(Scheduling { mode, pools })
    }
}

/// A pool name: 1 to 64 bytes of letters, digits, `_`, `-` and `.`.
pub fn validate_pool_name(name: &str) -> Result<(), String> {
    crate::text::validate_key("pool name", name, MAX_POOL_NAME_LEN)
}

/// Checks a submission's pool and priority.
pub(super) fn validate_submission(submit: &SubmitJob) -> Result<(), String> {
    if let Some(pool) = &submit.pool {
        validate_pool_name(pool)?;
    }
    if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&submit.priority) {
        return Err(format!(
            "priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}; got {}",
            submit.priority
        ));
    }
    Ok(())
}

/// A job's place among its pool's: cores in use (in a `fair` pool; 0 in a `fifo` one), then
/// higher priority, then older.
type Key = (u64, Reverse<i32>, JobId);

#[derive(Debug)]
struct Pool {
    config: PoolConfig,
    declared: bool,
    /// Cores in use by its jobs' running attempts.
    running: u64,
    /// Its running jobs, in the order its mode gives them.
    jobs: BTreeSet<Key>,
    /// Its members: running jobs, and ended ones whose attempts still run.
    members: u32,
}

/// A job the pools count: its pool, its priority and the cores its attempts use.
#[derive(Debug)]
struct Member {
    pool: usize,
    priority: i32,
    running: u64,
    /// Whether it is still offered (it runs); an ended job stays a member until its last
    /// attempt ends, so its pool's count stays right.
    offered: bool,
}

/// The pools of FAIR scheduling and the running jobs in each.
#[derive(Debug)]
pub(super) struct Pools {
    pools: Vec<Pool>,
    by_name: HashMap<String, usize>,
    members: HashMap<JobId, Member, crate::IdHasher>,
}

impl Pools {
    fn new(declared: &[PoolConfig]) -> Self {
        let mut pools = Pools {
            pools: Vec::new(),
            by_name: HashMap::new(),
            members: HashMap::default(),
        };
        for config in declared {
            pools.by_name.insert(config.name.clone(), pools.pools.len());
            pools.pools.push(Pool {
                config: config.clone(),
                declared: true,
                running: 0,
                jobs: BTreeSet::new(),
                members: 0,
            });
        }
        pools
    }

    /// The running jobs in the order offers look at them: pools in fair order, each pool's
    /// jobs in its own.
    pub(super) fn order(&self) -> impl Iterator<Item = &JobId> {
        let mut order: Vec<&Pool> = self.pools.iter().filter(|p| !p.jobs.is_empty()).collect();
        if order.len() > 1 {
            order.sort_by(|a, b| fair_order(a, b));
        }
        order
            .into_iter()
            .flat_map(|pool| pool.jobs.iter().map(|(_, _, id)| id))
    }

    /// Counts a running job, with the cores its attempts use.
    fn add(&mut self, job_id: JobId, pool: Option<&str>, priority: i32, running: u64) {
        let name = pool.unwrap_or(DEFAULT_POOL);
        let index = match self.by_name.get(name) {
            Some(index) => *index,
            None => {
                self.by_name.insert(name.to_string(), self.pools.len());
                self.pools.push(Pool {
                    config: PoolConfig::undeclared(name),
                    declared: false,
                    running: 0,
                    jobs: BTreeSet::new(),
                    members: 0,
                });
                self.pools.len() - 1
            }
        };
        let member = Member {
            pool: index,
            priority,
            running,
            offered: true,
        };
        let pool = &mut self.pools[index];
        pool.running += running;
        pool.members += 1;
        pool.jobs.insert(key(pool, &member, job_id));
        self.members.insert(job_id, member);
    }

    /// An attempt of `job_id` taking `cores` started.
    pub(super) fn started(&mut self, job_id: JobId, cores: u32) {
        self.change(job_id, |running| running + u64::from(cores));
    }

    /// An attempt of `job_id` taking `cores` ended.
    pub(super) fn ended(&mut self, job_id: JobId, cores: u32) {
        self.change(job_id, |running| running.saturating_sub(u64::from(cores)));
        self.forget_if_done(job_id);
    }

    /// `job_id` ended: it is offered no more, and counts until its last attempt ends.
    fn job_ended(&mut self, job_id: JobId) {
        let Some(member) = self.members.get_mut(&job_id) else {
            return;
        };
        let pool = &mut self.pools[member.pool];
        pool.jobs.remove(&key(pool, member, job_id));
        member.offered = false;
        self.forget_if_done(job_id);
    }

    fn change(&mut self, job_id: JobId, f: impl FnOnce(u64) -> u64) {
        let Some(member) = self.members.get_mut(&job_id) else {
            return;
        };
        let pool = &mut self.pools[member.pool];
        let old = key(pool, member, job_id);
        let running = f(member.running);
        pool.running = pool.running.saturating_sub(member.running) + running;
        member.running = running;
        // Only a fair pool orders its jobs by what they run.
        if member.offered && pool.config.mode == SchedulingMode::Fair {
            pool.jobs.remove(&old);
            pool.jobs.insert(key(pool, member, job_id));
        }
    }

    /// Forgets an ended job with nothing running, and its pool if nobody declared it and it
    /// has no member left.
    fn forget_if_done(&mut self, job_id: JobId) {
        let done = self
            .members
            .get(&job_id)
            .is_some_and(|m| !m.offered && m.running == 0);
        if !done {
            return;
        }
        let Some(member) = self.members.remove(&job_id) else {
            return;
        };
        let index = member.pool;
        let pool = &mut self.pools[index];
        pool.members -= 1;
        if pool.declared || pool.members > 0 {
            return;
        }
        let gone = self.pools.swap_remove(index);
        self.by_name.remove(&gone.config.name);
        if let Some(moved) = self.pools.get(index) {
            let from = self.pools.len();
            self.by_name.insert(moved.config.name.clone(), index);
            for member in self.members.values_mut().filter(|m| m.pool == from) {
                member.pool = index;
            }
        }
    }

    /// Each pool with its cores in use, for tests and views: (name, running cores, jobs
    /// offered, config), declared ones first.
    #[cfg(test)]
    pub(super) fn pool_counts(&self) -> Vec<(String, u64, usize)> {
        self.pools
            .iter()
            .map(|p| (p.config.name.clone(), p.running, p.jobs.len()))
            .collect()
    }
}

fn key(pool: &Pool, member: &Member, job_id: JobId) -> Key {
    let running = match pool.config.mode {
        SchedulingMode::Fair => member.running,
        SchedulingMode::Fifo => 0,
    };
    (running, Reverse(member.priority), job_id)
}

/// Spark's `FairSchedulingAlgorithm.comparator` between two pools, in whole numbers: a pool
/// below its minimum share goes before one that is not; two below theirs go by cores in use
/// over minimum share, two above by cores in use over weight; ties by name.
fn fair_order(a: &Pool, b: &Pool) -> Ordering {
    let needy = |p: &Pool| p.running < u64::from(p.config.min_share);
    let ratio = |x: &Pool, over: fn(&Pool) -> u64, y: &Pool| {
        let left = u128::from(x.running) * u128::from(over(y));
        let right = u128::from(y.running) * u128::from(over(x));
        left.cmp(&right)
    };
    let by = match (needy(a), needy(b)) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (true, true) => ratio(a, |p| u64::from(p.config.min_share.max(1)), b),
        (false, false) => ratio(a, |p| u64::from(p.config.weight.max(1)), b),
    };
    by.then_with(|| a.config.name.cmp(&b.config.name))
}

impl Core {
    /// Sets how jobs share the cores. Under `fair`, the running jobs so far join their pools.
    pub fn set_scheduling(&mut self, scheduling: Scheduling) {
        self.pools = match scheduling.mode {
            SchedulingMode::Fifo => None,
            SchedulingMode::Fair => Some(Box::new(Pools::new(&scheduling.pools))),
        };
        self.join_pools();
    }

    /// Puts `job_id`, just accepted, in the offer queue and, under FAIR, in its pool.
    pub(super) fn queue_new_job(&mut self, job_id: JobId) {
        self.enqueue(job_id);
        if let (Some(pools), Some(job)) = (self.pools.as_deref_mut(), self.jobs.get(&job_id)) {
            let running = u64::from(job.running) * u64::from(job.cpus_per_task);
            pools.add(job_id, job.pool.as_deref(), job.priority, running);
        }
    }

    /// Puts `job_id` in the offer queue at its place: after the jobs of higher or equal
    /// priority submitted before it, before the rest.
    pub(super) fn enqueue(&mut self, job_id: JobId) {
        let key = self.queue_key(job_id);
        // Most jobs go last: no priority, or the newest.
        let position = match self.queue.back() {
            Some(last) if self.queue_key(*last) > key => {
                self.queue.partition_point(|id| self.queue_key(*id) < key)
            }
            _ => self.queue.len(),
        };
        self.queue.insert(position, job_id);
    }

    /// Where a job goes in the offer queue: higher priority first, then older first.
    pub(super) fn queue_key(&self, job_id: JobId) -> (Reverse<i32>, JobId) {
        let priority = self.jobs.get(&job_id).map_or(0, |job| job.priority);
        (Reverse(priority), job_id)
    }

    /// Answers `ListPools`: under FAIR, every pool in the order offers serve them now.
    pub(super) fn pools_reply(&self) -> ApiReply {
        let Some(pools) = self.pools.as_deref() else {
            return ApiReply::Pools {
                scheduling: SchedulingMode::Fifo.as_str().into(),
                pools: Vec::new(),
            };
        };
        let mut order: Vec<&Pool> = pools.pools.iter().collect();
        order.sort_by(|a, b| fair_order(a, b));
        let pools = order
            .into_iter()
            .map(|pool| PoolSummary {
                name: pool.config.name.clone(),
                weight: pool.config.weight,
                min_share: pool.config.min_share,
                mode: pool.config.mode.as_str().into(),
                declared: pool.declared,
                running_cores: pool.running,
                jobs: pool.jobs.len() as u32,
            })
            .collect();
        ApiReply::Pools {
            scheduling: SchedulingMode::Fair.as_str().into(),
            pools,
        }
    }

    /// `job_id` has ended: its pool offers it no more.
    pub(super) fn pools_job_ended(&mut self, job_id: JobId) {
        if let Some(pools) = self.pools.as_deref_mut() {
            pools.job_ended(job_id);
        }
    }

    /// After a replay: the offer queue in priority order, and the running jobs in their pools.
    pub(super) fn order_restored(&mut self) {
        let mut queue = std::mem::take(&mut self.queue);
        queue
            .make_contiguous()
            .sort_by_key(|id| self.queue_key(*id));
        self.queue = queue;
        self.join_pools();
    }

    /// Every running job not yet in a pool joins its pool.
    fn join_pools(&mut self) {
        let Some(pools) = self.pools.as_deref_mut() else {
            return;
        };
        for job in self.jobs.values().filter(|job| job.is_active()) {
            if !pools.members.contains_key(&job.id) {
                let running = u64::from(job.running) * u64::from(job.cpus_per_task);
                pools.add(job.id, job.pool.as_deref(), job.priority, running);
            }
        }
    }

    /// What the pools count agrees with the jobs: every running job is offered in its pool,
    /// with the cores its attempts use, and each pool's count is its members'.
    #[cfg(test)]
    pub(super) fn check_pools(&self) {
        let Some(pools) = self.pools.as_deref() else {
            return;
        };
        for job in self.jobs.values() {
            let member = pools.members.get(&job.id);
            // Speculative copies (and the losers of a pair) hold cores too.
            let copies = job.speculation.as_ref().map_or(0, |s| s.others_out());
            let running = u64::from(job.running + copies) * u64::from(job.cpus_per_task);
            if job.is_active() || job.attempts_out() {
                let member = member.unwrap_or_else(|| panic!("job {} is in no pool", job.id));
                assert_eq!(member.running, running, "job {}", job.id);
                assert_eq!(member.offered, job.is_active(), "job {}", job.id);
                let pool = &pools.pools[member.pool];
                let name = job.pool.as_deref().unwrap_or(DEFAULT_POOL);
                assert_eq!(pool.config.name, name, "job {}", job.id);
                let offered = pool.jobs.contains(&key(pool, member, job.id));
                assert_eq!(offered, member.offered, "job {}", job.id);
            } else {
                assert!(member.is_none(), "job {} ended but is in a pool", job.id);
            }
        }
        for (index, pool) in pools.pools.iter().enumerate() {
            let members: Vec<&Member> =
                pools.members.values().filter(|m| m.pool == index).collect();
            assert_eq!(pool.members as usize, members.len(), "{}", pool.config.name);
            let running: u64 = members.iter().map(|m| m.running).sum();
            assert_eq!(pool.running, running, "pool {}", pool.config.name);
            let offered = members.iter().filter(|m| m.offered).count();
            assert_eq!(pool.jobs.len(), offered, "pool {}", pool.config.name);
            assert_eq!(pools.by_name.get(&pool.config.name), Some(&index));
            assert!(pool.declared || pool.members > 0, "{}", pool.config.name);
        }
        assert_eq!(pools.by_name.len(), pools.pools.len());
    }

    /// The pools' cores in use and offered jobs, for tests.
    #[cfg(test)]
    pub(super) fn pool_counts(&self) -> Vec<(String, u64, usize)> {
        self.pools.as_deref().map_or(Vec::new(), Pools::pool_counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_declaration_reads_as_spark_s_pool_settings() {
        let pool = PoolConfig::parse("etl:weight=3,min-share=2,mode=fair").unwrap();
        assert_eq!(
            pool,
            PoolConfig {
                name: "etl".into(),
                weight: 3,
                min_share: 2,
                mode: SchedulingMode::Fair
            }
        );
        assert_eq!(
            PoolConfig::parse("adhoc").unwrap(),
            PoolConfig::undeclared("adhoc")
        );
        for (bad, says) in [
            ("", "empty"),
            ("a b:weight=1", "' '"),
            ("p:weight=0", "weight must be a whole number from 1"),
            ("p:weight=x", "weight must be"),
            ("p:min-share=-1", "min-share must be"),
            ("p:mode=lifo", "not a scheduling mode"),
            ("p:speed=3", "unknown setting"),
            ("p:weight", "not KEY=VALUE"),
            ("p:weight=1,weight=2", "given twice"),
        ] {
            let error = PoolConfig::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
        let long = "p".repeat(MAX_POOL_NAME_LEN + 1);
        assert!(PoolConfig::parse(&long)
            .unwrap_err()
            .contains("longer than"));
        let twice = Scheduling::new(
            SchedulingMode::Fair,
            vec![PoolConfig::undeclared("a"), PoolConfig::undeclared("a")],
        );
        assert!(twice.unwrap_err().contains("declared twice"));
    }

    fn pool(name: &str, weight: u32, min_share: u32, running: u64) -> Pool {
        Pool {
            config: PoolConfig {
                weight,
                min_share,
                ..PoolConfig::undeclared(name)
            },
            declared: true,
            running,
            jobs: BTreeSet::new(),
            members: 0,
        }
    }

    #[test]
    fn pools_compare_as_spark_s_fair_algorithm() {
        // Below its minimum share goes first, whatever the weights.
        let needy = pool("b", 1, 4, 3);
        let heavy = pool("a", 10, 0, 0);
        assert_eq!(fair_order(&needy, &heavy), Ordering::Less);
        // Two below theirs: by running over minimum share (1/4 before 1/2).
        assert_eq!(
            fair_order(&pool("x", 1, 4, 1), &pool("a", 1, 2, 1)),
            Ordering::Less
        );
        // Two above: by running over weight (3/3 ties 1/1: by name).
        assert_eq!(
            fair_order(&pool("b", 3, 0, 3), &pool("a", 1, 0, 1)),
            Ordering::Greater
        );
        assert_eq!(
            fair_order(&pool("b", 3, 0, 2), &pool("a", 1, 0, 1)),
            Ordering::Less
        );
    }
}
