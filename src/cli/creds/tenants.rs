//! `ember creds --tenant NAME`: the accounts of tenants, other parties that may send the
//! cluster's api requests and see nothing else of it.
//!
//! A tenant is a NATS account of its own, `EMBER_<cluster>_TENANT_<NAME>`, holding one user,
//! `<cluster>.tenant.<NAME>`. The account has no JetStream and imports the api subject from the
//! cluster's account, which exports it to the tenants' accounts alone. A request that crosses
//! the import reaches the driver with a `Nats-Request-Info` header naming the tenant's account,
//! which the server sets and no tenant can forge; the driver answers it about that tenant's
//! own jobs alone. The driver tells each tenant the events of its jobs on subjects of its own
//! (`<p>.tenant.<account>.events.>`), which the cluster's account exports to that tenant alone
//! and the tenant imports as the cluster's event subjects: `ember events` works for a tenant
//! as for a listener, and shows its own jobs alone. Executors' subjects, inboxes, the event
//! history and JetStream stay in the cluster's account, out of the tenant's reach.

use super::{account_name, cluster_of, quote, user_name, write_user, CredsError, Role, User};
use crate::ids::validate_token;
use crate::subjects::Subjects;
use std::fmt::Write as _;

/// Parses a tenant's name: one subject token, as an executor id.
pub fn parse_tenant(text: &str) -> Result<String, String> {
    validate_token("tenant name", text)?;
    Ok(text.to_string())
}

/// The NATS account of tenant `name` of `cluster`: `EMBER_<cluster>_TENANT_<name>`.
pub fn tenant_account(cluster: &str, name: &str) -> String {
    format!("{}_TENANT_{name}", account_name(cluster))
}

/// The NATS user of tenant `name` of `cluster`: `<cluster>.tenant.<name>`. A tenant's name
/// holds no `.`, nor does an executor id, so it is no other user's name.
pub fn tenant_user(cluster: &str, name: &str) -> String {
    user_name(cluster, &format!("tenant.{name}"))
}

/// Refuses a tenant named twice.
pub(super) fn check(tenants: &[String]) -> Result<(), CredsError> {
    let mut seen = std::collections::HashSet::new();
    match tenants.iter().find(|name| !seen.insert(name.as_str())) {
        Some(name) => Err(CredsError::DuplicateTenant(name.clone())),
        None => Ok(()),
    }
}

/// The tenants among `users`, each with its name.
fn tenants(users: &[User]) -> impl Iterator<Item = (&str, &User)> {
    users.iter().filter_map(|user| match &user.role {
        Role::Tenant(name) => Some((name.as_str(), user)),
        _ => None,
    })
}

/// The `exports` entry of the cluster's account that lets the tenants among `users` call its
/// api and hear the events of their own jobs, indented as a property of the account; empty
/// without tenants.
pub(super) fn exports(subjects: &Subjects, users: &[User]) -> String {
    let cluster = cluster_of(subjects);
    let accounts: Vec<String> = tenants(users)
        .map(|(name, _)| tenant_account(cluster, name))
        .collect();
    if accounts.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = accounts.iter().map(|account| quote(account)).collect();
    let mut out = format!(
        "  # The api, for the tenants' accounts (below) to import. The server adds to each request\n  \
         # that crosses the import a Nats-Request-Info header naming the tenant's account, and\n  \
         # the driver answers it about that tenant's own jobs alone. Each tenant's events, the\n  \
         # events of its own jobs, go to that tenant's account alone.\n  \
         exports: [\n    {{ service: {}, accounts: [{}] }}\n",
        quote(&subjects.api()),
        quoted.join(", "),
    );
    for (account, quoted) in accounts.iter().zip(&quoted) {
        let _ = writeln!(
            out,
            "    {{ stream: {}, accounts: [{quoted}] }}",
            quote(&subjects.tenant_events(account)),
        );
    }
    out.push_str("  ]\n");
    out
}

/// The accounts of the tenants among `users`, each after a blank line, as entries of a server
/// config's `accounts { }` block beside the cluster's account; empty without tenants.
pub(super) fn tenant_accounts(subjects: &Subjects, users: &[User]) -> String {
    let cluster = cluster_of(subjects);
    let mut out = String::new();
    for (name, user) in tenants(users) {
        let account = tenant_account(cluster, name);
        let _ = write!(
            out,
            "\n# Tenant {name:?} of the Ember cluster {cluster:?}, written by `ember creds`: an\n\
             # account of its own that may send the cluster's api requests, answered about the\n\
             # tenant's own jobs alone, and hears the events of those jobs on the cluster's\n\
             # event subjects; it sees nothing else of the cluster and has no JetStream.\n\
             {}: {{\n  users = [\n",
            quote(&account),
        );
        write_user(&mut out, user, subjects, &[]);
        let _ = writeln!(
            out,
            "  ]\n  imports: [\n    {{ service: {{ account: {home}, subject: {} }} }}\n    \
             {{ stream: {{ account: {home}, subject: {} }}, to: {} }}\n  ]\n}}",
            quote(&subjects.api()),
            quote(&subjects.tenant_events(&account)),
            quote(&subjects.events_all()),
            home = quote(&account_name(cluster)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{
        account_block, accounts, creds, random_password, server_config, users, AccountFor,
        CredsArgs, TopologyArgs,
    };
    use super::*;
    use crate::ids::ExecutorId;

    /// The users of cluster `c` with one executor and `tenants`, as `creds` makes them.
    fn users_with(tenants: &[&str]) -> Vec<User> {
        let mut all = users("c", &[ExecutorId::parse("exec-1").unwrap()], |n| {
            format!("pw-{n}")
        });
        all.extend(tenants.iter().map(|name| User {
            name: tenant_user("c", name),
            password: format!("pw-{name}"),
            role: Role::Tenant(name.to_string()),
        }));
        all
    }

    fn args(tenants: &[&str]) -> CredsArgs {
        CredsArgs {
            executors: 1,
            executor_ids: vec![],
            password_file: None,
            random: false,
            placeholder: true,
            full: false,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            topology: TopologyArgs::default(),
        }
    }

    const EXPORT: &str = "exports: [\n    { service: \"ember.c.driver.api\", \
                          accounts: [\"EMBER_c_TENANT_a\", \"EMBER_c_TENANT_b\"] }\n    \
                          { stream: \"ember.c.tenant.EMBER_c_TENANT_a.events.>\", \
                          accounts: [\"EMBER_c_TENANT_a\"] }\n    \
                          { stream: \"ember.c.tenant.EMBER_c_TENANT_b.events.>\", \
                          accounts: [\"EMBER_c_TENANT_b\"] }\n  ]\n";

    /// Tenant `name`'s imports: the api, and its own events as the cluster's.
    fn import(name: &str) -> String {
        format!(
            "imports: [\n    \
             {{ service: {{ account: \"EMBER_c\", subject: \"ember.c.driver.api\" }} }}\n    \
             {{ stream: {{ account: \"EMBER_c\", \
             subject: \"ember.c.tenant.EMBER_c_TENANT_{name}.events.>\" }}, \
             to: \"ember.c.events.>\" }}\n  ]"
        )
    }

    /// `text` with every run of white space made one space: a block nested in another is
    /// indented more.
    fn squashed(text: &str) -> String {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn names() {
        assert_eq!(tenant_account("c", "acme"), "EMBER_c_TENANT_acme");
        assert_eq!(tenant_user("c", "acme"), "c.tenant.acme");
        assert!(parse_tenant("a.b").is_err());
        assert!(parse_tenant("").is_err());
        assert_eq!(parse_tenant("acme-2"), Ok("acme-2".into()));
    }

    #[test]
    fn each_tenant_is_an_account_importing_the_api_the_cluster_exports_to_them() {
        let s = Subjects::new("c").unwrap();
        let users = users_with(&["a", "b"]);
        for placed in [AccountFor::Block, AccountFor::Server] {
            let text = accounts(&s, &users, placed);
            let (cluster, tenants) = text.split_once("\n\n").expect("tenants after a blank line");
            assert_eq!(cluster.matches(EXPORT).count(), 1, "{cluster}");
            assert!(!cluster.contains("\"c.tenant."), "{cluster}");
            for name in ["a", "b"] {
                let account = format!("\"EMBER_c_TENANT_{name}\": {{\n  users = [\n");
                let user = format!("{{ user: \"c.tenant.{name}\", password: \"pw-{name}\", ");
                assert_eq!(tenants.matches(&account).count(), 1, "{tenants}");
                assert_eq!(tenants.matches(&user).count(), 1, "{tenants}");
                assert_eq!(tenants.matches(&import(name)).count(), 1, "{tenants}");
            }
            assert_eq!(
                tenants
                    .matches("publish: { allow: [\"ember.c.driver.api\"] }")
                    .count(),
                2
            );
            assert!(!tenants.contains("jetstream"), "{tenants}");
        }
        // A complete config holds them in its one `accounts { }` block, beside the cluster's.
        let full = server_config(&s, &users);
        let accounts_block = full.split_once("\naccounts {\n").unwrap().1;
        assert!(
            accounts_block.contains("  \"EMBER_c_TENANT_b\": {\n"),
            "{full}"
        );
        assert!(
            squashed(accounts_block).ends_with(&squashed(&format!("{} }} }}", import("b")))),
            "{full}"
        );
        // A leaf server holds neither them nor the export.
        let leaf = account_block(&s, &users, AccountFor::Leaf);
        assert!(
            !leaf.contains("exports") && !leaf.contains("TENANT") && !leaf.contains("\"c.tenant."),
            "{leaf}"
        );
    }

    #[test]
    fn without_tenants_nothing_changes() {
        let s = Subjects::new("c").unwrap();
        let without = users_with(&[]);
        let with = users_with(&["a", "b"]);
        for placed in [AccountFor::Block, AccountFor::Server, AccountFor::Leaf] {
            let alone = account_block(&s, &without, placed);
            assert_eq!(accounts(&s, &without, placed), alone);
            assert!(!alone.contains("exports"), "{alone}");
            // Tenants add their export to the cluster's account, and nothing else.
            let export = exports(&s, &with);
            assert_eq!(
                account_block(&s, &with, placed).replacen(&export, "", 1),
                alone
            );
        }
        let text = creds(&args(&[]), "c").unwrap();
        assert!(
            !text.contains("exports") && !text.contains("TENANT"),
            "{text}"
        );
    }

    #[test]
    fn a_tenant_named_twice_is_refused() {
        assert!(matches!(
            creds(&args(&["a", "b", "a"]), "c"),
            Err(CredsError::DuplicateTenant(name)) if name == "a"
        ));
        assert!(creds(&args(&["a", "b"]), "c").is_ok());
    }

    #[test]
    fn a_tenant_keeps_its_password_in_the_password_file() {
        let dir = std::env::temp_dir().join(format!("ember-tenants-{}", random_password()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("passwords");
        std::fs::write(&file, "c.tenant.a kept-secret\n").unwrap();
        let mut args = args(&["a", "b"]);
        args.placeholder = false;
        args.password_file = Some(file.clone());
        let text = creds(&args, "c").unwrap();
        assert!(text.contains("{ user: \"c.tenant.a\", password: \"kept-secret\", "));
        let written = std::fs::read_to_string(&file).unwrap();
        assert!(written.contains("\nc.tenant.a kept-secret\n"), "{written}");
        assert!(written.contains("\nc.tenant.b "), "{written}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
