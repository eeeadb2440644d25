//! `ember creds`: the users of a locked-down nats-server, one per role and one per executor,
//! each with the permissions of its role (see docs/security.md).
//!
//! A cluster's users are one NATS account of their own, `EMBER_<cluster>`, and their names
//! carry the cluster (`<cluster>.driver`), so several clusters' accounts go into one server
//! config: nothing one account publishes reaches another account's subscribers, inboxes
//! included, and no user name is used twice.
//!
//! The permissions bind an executor's credentials to its id: it may publish only subjects that
//! end in its id and subscribe only its own inbox subjects, so it cannot register, heartbeat or
//! report status as another executor, nor read what the driver sends another. What NATS cannot
//! check (where a reply goes, that a payload's id equals the subject's) the driver checks.
//!
//! Tenants (`--tenant`) are accounts of their own beside the cluster's, which may send the
//! cluster's api requests and see nothing else of it (see [`tenants`]).

use crate::ids::{validate_token, ExecutorId};
use crate::subjects::Subjects;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

mod permissions;
pub mod tenants;
pub mod topology;
pub use permissions::Permissions;
pub use tenants::{tenant_account, tenant_user};
pub use topology::TopologyArgs;

/// The names of the roles that are not executors; a user's name is [`user_name`] of one of
/// these (or of an executor id) and the cluster.
pub const DRIVER_USER: &str = "driver";
pub const CLIENT_USER: &str = "client";
pub const LISTENER_USER: &str = "listener";

/// The NATS user of `name` (a role's or an executor id) in `cluster`: `<cluster>.<name>`.
/// Neither a cluster name nor an executor id holds a `.`, so no two clusters share a user name.
pub fn user_name(cluster: &str, name: &str) -> String {
    format!("{cluster}.{name}")
}

/// The NATS account that holds `cluster`'s users.
pub fn account_name(cluster: &str) -> String {
    format!("EMBER_{cluster}")
}

/// A bcrypt-shaped password no password matches: the shipped example config holds these, so a
/// server started from it unchanged lets nobody in.
pub const PLACEHOLDER_PASSWORD: &str = "$2a$11$PLACEHOLDER.run.ember.creds.to.make.real.passwords";

const PLACEHOLDER_NOTE: &str = "\
# EXAMPLE ONLY. Every password below is a placeholder that matches no password, so a server
# started from this file lets nobody in. Make real ones with, for example,
#   ember creds --executors 4 --password-file ember-passwords --full > nats-secure.conf
";

/// `ember creds`: prints the account of a cluster: users for a driver, a client, a listener and
/// N executors.
#[derive(Debug, Clone, clap::Args)]
pub struct CredsArgs {
    /// Make users for executors exec-1 .. exec-N (the ids `ember up` gives them).
    #[arg(long, default_value_t = 0)]
    pub executors: u32,
    /// Make a user for this executor id too (repeatable).
    #[arg(long = "executor-id", value_parser = |s: &str| ExecutorId::parse(s))]
    pub executor_ids: Vec<ExecutorId>,
    /// Keep the passwords in this file, one `user password` line each (written with mode
    /// 0600): users already in it keep theirs, new users get random ones. Hand each process
    /// only its own line.
    #[arg(long, conflicts_with = "placeholder")]
    pub password_file: Option<PathBuf>,
    /// Random passwords, printed only in the block (the default).
    #[arg(long, conflicts_with_all = ["placeholder", "password_file"])]
    pub random: bool,
    /// Placeholder passwords that match nothing, for an example config.
    #[arg(long)]
    pub placeholder: bool,
    /// Print a complete server config (listen address, max_payload, the account), not only the
    /// account (which goes in a config's `accounts { }` block, with other clusters' accounts).
    #[arg(long, conflicts_with = "nodes")]
    pub full: bool,
    /// Make an account for tenant NAME too (repeatable), next to the cluster's: its user
    /// `<cluster>.tenant.NAME` may send the cluster's api requests, which the driver answers
    /// about NAME's own jobs alone, and sees nothing else of the cluster.
    #[arg(long = "tenant", value_name = "NAME", value_parser = tenants::parse_tenant)]
    pub tenants: Vec<String>,
    #[command(flatten)]
    pub topology: TopologyArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum CredsError {
    #[error("invalid cluster: {0}")]
    Cluster(String),
    #[error("executor id {0:?} is also a role's user name; pick another id")]
    ReservedId(String),
    #[error("executor id {0:?} is given twice")]
    DuplicateId(String),
    #[error("tenant {0:?} is given twice")]
    DuplicateTenant(String),
    #[error("no executors: give --executors N or --executor-id ID")]
    NoExecutors,
    #[error("could not read the password file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Topology(String),
    #[error("could not write the configs: {0}")]
    Configs(std::io::Error),
    #[error("could not write the password file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a user may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Driver,
    Executor(ExecutorId),
    Client,
    Listener,
    /// The link of the leaf server of this name: anything within the account.
    Leaf(String),
    /// The tenant of this name, alone in an account of its own: the api's requests.
    Tenant(String),
}

/// One NATS user of the cluster.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub password: String,
    pub role: Role,
}

/// The executor ids `args` names: exec-1 .. exec-N, then the explicit ones.
pub fn executor_ids(args: &CredsArgs) -> Result<Vec<ExecutorId>, CredsError> {
    let mut ids: Vec<ExecutorId> = (1..=args.executors)
        .map(|i| ExecutorId::parse(format!("exec-{i}")).expect("exec-N is a valid id"))
        .collect();
    ids.extend(args.executor_ids.iter().cloned());
    if ids.is_empty() {
        return Err(CredsError::NoExecutors);
    }
    let mut seen = std::collections::HashSet::new();
    for id in &ids {
        if [DRIVER_USER, CLIENT_USER, LISTENER_USER].contains(&id.as_str()) {
            return Err(CredsError::ReservedId(id.to_string()));
        }
        if !seen.insert(id.as_str()) {
            return Err(CredsError::DuplicateId(id.to_string()));
        }
    }
    Ok(ids)
}

/// The users of `cluster` with these executors; `password` gives each user name its password.
pub fn users(
    cluster: &str,
    executors: &[ExecutorId],
    mut password: impl FnMut(&str) -> String,
) -> Vec<User> {
    let mut user = |name: &str, role| {
        let name = user_name(cluster, name);
        User {
            password: password(&name),
            name,
            role,
        }
    };
    let mut all = vec![user(DRIVER_USER, Role::Driver)];
    all.extend(
        executors
            .iter()
            .map(|id| user(id.as_str(), Role::Executor(id.clone()))),
    );
    all.push(user(CLIENT_USER, Role::Client));
    all.push(user(LISTENER_USER, Role::Listener));
    all
}

/// A fresh random password: 122 random bits from the OS, as 32 hex digits.
pub fn random_password() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Where an account block goes, which decides what it holds besides its users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountFor {
    /// Printed alone, for a config of the reader's: JetStream enabled (used only if the server
    /// runs it), no imports.
    Block,
    /// A config whose account `SYS` exports the disconnect advisories (as [`server_config`]
    /// writes it): JetStream, and its own advisories imported.
    Server,
    /// A leaf server's config: no JetStream (the nodes' answers), no imports.
    Leaf,
}

/// The account of `subjects`' cluster with `users`, as an entry of a server config's
/// `accounts { }` block; see [`AccountFor`].
pub fn account_block(subjects: &Subjects, users: &[User], placed: AccountFor) -> String {
    let cluster = cluster_of(subjects);
    let executors: Vec<ExecutorId> = users
        .iter()
        .filter_map(|u| match &u.role {
            Role::Executor(id) => Some(id.clone()),
            _ => None,
        })
        .collect();
    let mut out = format!(
        "# The Ember cluster {cluster:?}, written by `ember creds`: an account of its own, whose\n\
         # subjects and inboxes no other account's users see. It goes in the `accounts {{ }}`\n\
         # block of a server config, next to other clusters' accounts (see docs/security.md).\n\
         {}: {{\n{}  users = [\n",
        quote(&account_name(cluster)),
        if placed == AccountFor::Leaf {
            ""
        } else {
            "  jetstream: enabled\n"
        },
    );
    // Tenants' users are in accounts of their own (see `tenants`).
    for user in users.iter().filter(|u| !matches!(u.role, Role::Tenant(_))) {
        write_user(&mut out, user, subjects, &executors);
    }
    out.push_str("  ]\n");
    // A leaf server holds no tenants' accounts: tenants log in at the nodes.
    if placed != AccountFor::Leaf {
        out.push_str(&tenants::exports(subjects, users));
    }
    if placed == AccountFor::Server {
        let _ = writeln!(
            out,
            "  # The servers' advisories that a connection of this account closed: the driver\n  \
             # removes an executor whose process is gone at once.\n  \
             imports: [{{ stream: {{ account: SYS, subject: \"$SYS.ACCOUNT.{}.DISCONNECT\" }} }}]",
            account_name(cluster)
        );
    }
    out.push_str("}\n");
    out
}

/// One entry of an account's `users` list, after a comment saying what the user may do; an
/// entry without permissions for a leaf link. `executors` are the cluster's executor ids.
fn write_user(out: &mut String, user: &User, subjects: &Subjects, executors: &[ExecutorId]) {
    let _ = writeln!(out, "    # {}", describe(&user.role));
    if let Role::Leaf(_) = user.role {
        let _ = writeln!(
            out,
            "    {{ user: {}, password: {} }}",
            quote(&user.name),
            quote(&user.password)
        );
        return;
    }
    let perms = user.role.permissions(subjects, executors);
    let _ = writeln!(
        out,
        "    {{ user: {}, password: {}, permissions: {{",
        quote(&user.name),
        quote(&user.password)
    );
    out.push_str(&rule("publish", &perms.publish_allow, &perms.publish_deny));
    out.push_str(&rule(
        "subscribe",
        &perms.subscribe_allow,
        &perms.subscribe_deny,
    ));
    if perms.allow_responses {
        out.push_str("        allow_responses: true\n");
    }
    out.push_str("    } }\n");
}

/// The account of `subjects`' cluster with `users`, followed by the accounts of the tenants
/// among them: [`account_block`] and the tenants' accounts, as entries of a server config's
/// `accounts { }` block.
pub fn accounts(subjects: &Subjects, users: &[User], placed: AccountFor) -> String {
    let mut out = account_block(subjects, users, placed);
    out.push_str(&tenants::tenant_accounts(subjects, users));
    out
}

/// A complete nats-server config: loopback, the limits of nats.conf, no anonymous access, and
/// the account of `users` (and its tenants' accounts). The port and address can be overridden
/// on nats-server's command line.
pub fn server_config(subjects: &Subjects, users: &[User]) -> String {
    let account = indent(&accounts(subjects, users, AccountFor::Server));
    format!(
        "# A locked-down nats-server for the Ember cluster {cluster:?}, written by `ember creds`.\n\
         # No anonymous access: every client logs in as one of the users below, whose\n\
         # permissions allow only what its role needs (see docs/security.md).\n\
         host: 127.0.0.1\n\
         port: 4222\n\
         max_payload: 8MB\n\
         write_deadline: \"10s\"\n\
         {accounts}",
        accounts = with_system_account(&account),
        cluster = cluster_of(subjects),
    )
}

/// The end of a server config: the servers' own account `SYS`, exporting each account's
/// disconnect advisories to that account alone, beside `account` (an indented account block
/// that imports them).
pub(crate) fn with_system_account(account: &str) -> String {
    format!(
        "\n# The servers' own account. It exports each account's disconnect advisories to that\n\
         # account alone (see nats-advisories.conf).\n\
         system_account: SYS\n\
         \naccounts {{\n  \
         SYS: {{\n    \
         exports: [{{ stream: \"$SYS.ACCOUNT.*.DISCONNECT\", account_token_position: 3 }}]\n  \
         }}\n{account}}}\n"
    )
}

/// `text` indented by two spaces, its blank lines left blank.
fn indent(text: &str) -> String {
    text.lines()
        .map(|line| match line {
            "" => "\n".to_string(),
            line => format!("  {line}\n"),
        })
        .collect()
}

/// The cluster name of `subjects` (its prefix is `ember.<cluster>`).
fn cluster_of(subjects: &Subjects) -> &str {
    subjects.prefix().trim_start_matches("ember.")
}

fn describe(role: &Role) -> String {
    match role {
        Role::Driver => {
            "the driver: reads the driver subjects, writes inboxes, events, replies and its journal; makes and purges the object store"
                .into()
        }
        Role::Executor(id) => {
            format!("executor {id}: writes only subjects ending in its id and objects, reads only its inboxes and objects")
        }
        Role::Client => "clients: the driver api, replies (not executors'), events, objects".into(),
        Role::Listener => "listeners: read the events and their history, write nothing".into(),
        Role::Leaf(name) => format!(
            "the link of leaf server {name}: anything in the account; the leaf holds its users to their roles"
        ),
        Role::Tenant(name) => {
            format!("tenant {name}: the cluster's api requests and their replies, nothing else")
        }
    }
}

fn rule(what: &str, allow: &[String], deny: &[String]) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items.iter().map(|s| quote(s)).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut parts = Vec::new();
    if !allow.is_empty() {
        parts.push(format!("allow: {}", list(allow)));
    }
    if !deny.is_empty() {
        parts.push(format!("deny: {}", list(deny)));
    }
    format!("        {what}: {{ {} }}\n", parts.join(", "))
}

/// A string in nats-server's config syntax. Names, subjects and generated passwords hold no
/// quote or backslash; anything else is escaped all the same.
fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Reads `user password` lines; a missing file is an empty one.
pub fn read_passwords(path: &Path) -> Result<BTreeMap<String, String>, CredsError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(CredsError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once(char::is_whitespace))
        .map(|(user, password)| (user.to_string(), password.trim().to_string()))
        .filter(|(_, password)| !password.is_empty())
        .collect())
}

fn write_passwords(path: &Path, users: &[User]) -> Result<(), CredsError> {
    use std::io::Write;
    let mut text = String::from("# user password (keep secret; give each process its own line)\n");
    for user in users {
        let _ = writeln!(text, "{} {}", user.name, user.password);
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let error = |source| CredsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut file = options.open(path).map_err(error)?;
    // `mode` applies only to a new file; an existing one is narrowed too.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(error)?;
    }
    file.write_all(text.as_bytes()).map_err(error)
}

/// Runs `ember creds` for `cluster` (ember's --cluster): the text to print.
pub fn creds(args: &CredsArgs, cluster: &str) -> Result<String, CredsError> {
    validate_token("cluster name", cluster).map_err(CredsError::Cluster)?;
    let subjects = Subjects::new(cluster).map_err(CredsError::Cluster)?;
    let ids = executor_ids(args)?;
    tenants::check(&args.tenants)?;
    if args.topology.wanted() {
        args.topology.check().map_err(CredsError::Topology)?;
    }
    let known = match &args.password_file {
        Some(path) => Some(read_passwords(path)?),
        None => None,
    };
    let mut password = |name: &str| match &known {
        Some(known) => known.get(name).cloned().unwrap_or_else(random_password),
        None if args.placeholder => PLACEHOLDER_PASSWORD.to_string(),
        None => random_password(),
    };
    let mut users = users(cluster, &ids, &mut password);
    users.extend(args.topology.leaf_users().map(|leaf| {
        let name = topology::leaf_user(cluster, leaf);
        User {
            password: password(&name),
            name,
            role: Role::Leaf(leaf.into()),
        }
    }));
    users.extend(args.tenants.iter().map(|tenant| {
        let name = tenant_user(cluster, tenant);
        User {
            password: password(&name),
            name,
            role: Role::Tenant(tenant.clone()),
        }
    }));
    if let Some(path) = &args.password_file {
        write_passwords(path, &users)?;
    }
    let note = match (args.placeholder, args.topology.wanted()) {
        (false, _) => "",
        (true, false) => PLACEHOLDER_NOTE,
        (true, true) => topology::PLACEHOLDER_NOTE,
    };
    if args.topology.wanted() {
        let written = topology::write(&subjects, &users, &args.topology, note)
            .map_err(CredsError::Configs)?;
        return Ok(written
            .iter()
            .map(|path| format!("wrote {}\n", path.display()))
            .collect());
    }
    let text = if args.full {
        server_config(&subjects, &users)
    } else {
        accounts(&subjects, &users, AccountFor::Block)
    };
    Ok(format!("{note}{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ExecutorId {
        ExecutorId::parse(s).unwrap()
    }

    #[test]
    fn an_executor_may_touch_only_subjects_of_its_own_id() {
        let s = Subjects::new("prod").unwrap();
        let p = Role::Executor(id("e1")).permissions(&s, &[]);
        assert_eq!(p.publish_allow[..1], ["ember.prod.driver.*.e1"]);
        // Beyond that, the object store alone.
        assert!(p.publish_allow[1..]
            .iter()
            .all(|r| r.contains("EMBER_prod_OBJECTS") || r == "$JS.API.INFO"));
        // Its inbox and replies, and what a new leader tells every executor.
        assert_eq!(
            p.subscribe_allow,
            [
                "ember.prod.executor.e1",
                "ember.prod.executors",
                "_INBOX.e1.>"
            ]
        );
        assert!(!p.allow_responses);
    }

    #[test]
    fn only_the_driver_may_write_the_journal_the_results_the_pinned_results_and_the_lease() {
        let s = Subjects::new("prod").unwrap();
        let driver = Role::Driver.permissions(&s, &[]);
        for subject in [
            "ember.prod.journal",
            "$KV.EMBER_prod_RESULTS.>",
            "$KV.EMBER_prod_PINNED.>",
            "$KV.EMBER_prod_LEADER.>",
            "$JS.API.STREAM.PURGE.KV_EMBER_prod_PINNED",
        ] {
            assert!(driver.publish_allow.contains(&subject.to_string()));
        }
        assert!(driver
            .publish_allow
            .iter()
            .filter(|r| r.starts_with("$JS.API.") && *r != "$JS.API.INFO")
            .all(|r| [
                ".EMBER_prod_JOURNAL",
                ".EMBER_prod_EVENTS",
                ".KV_EMBER_prod_RESULTS",
                ".KV_EMBER_prod_PINNED",
                ".KV_EMBER_prod_LEADER",
                ".OBJ_EMBER_prod_OBJECTS"
            ]
            .iter()
            .any(|stream| r.contains(stream))));
        for role in [Role::Executor(id("e1")), Role::Client, Role::Listener] {
            let p = role.permissions(&s, &[]);
            // Of JetStream, only the consumers of the events stream, and the object store
            // without its management.
            assert!(
                p.publish_allow.iter().all(|r| !r.contains("journal")
                    && (!r.starts_with("$JS")
                        || r == "$JS.API.INFO"
                        || (r.contains(".EMBER_prod_EVENTS") && !r.contains("STREAM"))
                        || (r.contains(".OBJ_EMBER_prod_OBJECTS")
                            && !["CREATE", "UPDATE", "PURGE", "DELETE"]
                                .iter()
                                .any(|call| r.contains(&format!("STREAM.{call}")))))),
                "{role:?}: {p:?}"
            );
            // None writes the results bucket or the lease.
            assert!(
                p.publish_allow.iter().all(|r| !r.starts_with("$KV")),
                "{role:?}: {p:?}"
            );
        }
    }

    #[test]
    fn clients_cannot_read_executor_replies() {
        let s = Subjects::new("prod").unwrap();
        let p = Role::Client.permissions(&s, &[id("e1"), id("e2")]);
        assert_eq!(p.subscribe_deny, ["_INBOX.e1.>", "_INBOX.e2.>"]);
        assert_eq!(
            p.publish_allow[..3],
            [
                "ember.prod.driver.api",
                "$SRV.*.ember-driver",
                "$SRV.*.ember-driver.>"
            ]
        );
    }

    #[test]
    fn the_account_lists_every_user_once_under_the_cluster_name() {
        let s = Subjects::new("c").unwrap();
        let users = users("c", &[id("exec-1"), id("exec-2")], |n| format!("pw-{n}"));
        let block = account_block(&s, &users, AccountFor::Block);
        assert!(!block.contains("imports"), "{block}");
        for name in ["driver", "exec-1", "exec-2", "client", "listener"] {
            let needle = format!("user: \"c.{name}\", password: \"pw-c.{name}\"");
            assert_eq!(block.matches(&needle).count(), 1, "{name}\n{block}");
        }
        assert_eq!(block.matches("allow_responses: true").count(), 1);
        assert!(
            block.contains("\"EMBER_c\": {\n  jetstream: enabled\n"),
            "{block}"
        );
        let full = server_config(&s, &users);
        assert!(full.contains("\naccounts {\n"), "{full}");
        let import =
            "imports: [{ stream: { account: SYS, subject: \"$SYS.ACCOUNT.EMBER_c.DISCONNECT\" } }]";
        assert!(
            full.ends_with(&format!("    {import}\n  }}\n}}\n")),
            "{full}"
        );
        assert!(full.contains("\nsystem_account: SYS\n"), "{full}");
    }

    #[test]
    fn role_names_and_repeats_are_refused_as_executor_ids() {
        let mut args = CredsArgs {
            executors: 1,
            executor_ids: vec![id("driver")],
            password_file: None,
            random: false,
            placeholder: false,
            full: false,
            tenants: vec![],
            topology: TopologyArgs::default(),
        };
        assert!(matches!(
            executor_ids(&args),
            Err(CredsError::ReservedId(_))
        ));
        args.executor_ids = vec![id("exec-1")];
        assert!(matches!(
            executor_ids(&args),
            Err(CredsError::DuplicateId(_))
        ));
        args.executors = 0;
        args.executor_ids.clear();
        assert!(matches!(executor_ids(&args), Err(CredsError::NoExecutors)));
    }

    #[test]
    fn random_passwords_differ() {
        assert_ne!(random_password(), random_password());
        assert_eq!(random_password().len(), 32);
    }
}
