//! `ember creds --node NAME=HOST ... [--leaf NAME=HOST ...]`: the server configs of Ember on
//! many hosts, one file per server: three (or more) nodes routed into one NATS cluster with
//! JetStream on each, and leaf-node servers for sites at the edge.
//!
//! Every server holds the cluster's account with the same users, so any process logs in at
//! any server with its own credentials and its role's permissions. A leaf server has no
//! JetStream of its own: its clients' JetStream requests cross the leaf link to the nodes'.
//! It binds its copy of the account to the nodes' through a user of its own, `<cluster>.leaf.
//! <name>`, which may do anything within the account (the leaf server enforces each of its own
//! users' permissions). With `--tls-dir`, routes and leaf links use mutual TLS.

use super::{
    account_block, account_name, accounts, cluster_of, indent, quote, with_system_account,
    AccountFor, User,
};
use crate::ids::validate_token;
use crate::subjects::Subjects;
use std::path::{Path, PathBuf};

/// The ports every server listens on: clients, routes (nodes only), leaf links (nodes only).
pub const CLIENT_PORT: u16 = 4222;
pub const ROUTE_PORT: u16 = 6222;
pub const LEAF_PORT: u16 = 7422;

/// The name the nodes' routes give their NATS cluster.
pub const ROUTE_CLUSTER: &str = "ember";

/// Where a node keeps its JetStream store unless `--store-dir` says: `<dir>/<node>`.
pub const DEFAULT_STORE_DIR: &str = "/var/lib/nats/jetstream";

/// What the configs of `--placeholder` start with.
pub const PLACEHOLDER_NOTE: &str = "\
# EXAMPLE ONLY. Every password below is a placeholder that matches no password, so a server
# started from this file lets nobody in and no leaf link up. Make real ones with, for example,
#   ember creds --executors 4 --password-file ember-passwords --node n1=HOST1 --node n2=HOST2 \\
#     --node n3=HOST3 --leaf edge=HOST4 --tls-dir /etc/nats/certs --out-dir nats
";

/// A server of the topology: its name (`server_name`, and the stem of its TLS files) and the
/// host it listens on, an address or a DNS name its peers reach it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub name: String,
    pub host: String,
}

/// Parses `NAME=HOST`.
pub fn parse_server(text: &str) -> Result<Server, String> {
    let (name, host) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=HOST, as n1=10.0.0.1"))?;
    validate_token("server name", name)?;
    let fits = |c: char| c.is_ascii_alphanumeric() || ".-:".contains(c);
    if host.is_empty() || !host.chars().all(fits) {
        return Err(format!(
            "{text:?}: the host must be an address or a DNS name (letters, digits, '.', '-', ':')"
        ));
    }
    Ok(Server {
        name: name.into(),
        host: host.into(),
    })
}

/// `ember creds`'s flags for many hosts.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TopologyArgs {
    /// Write the config of a NATS node NAME listening on HOST (repeatable; at least three, so
    /// that JetStream keeps a majority when one is lost): clients on 4222, routes on 6222, leaf
    /// links on 7422, and JetStream. Needs --out-dir.
    #[arg(long = "node", value_name = "NAME=HOST", value_parser = parse_server)]
    pub nodes: Vec<Server>,
    /// Write the config of a leaf-node server NAME on HOST for an edge site (repeatable): its
    /// clients on 4222, linked to every node, no JetStream of its own. Needs --node.
    #[arg(long = "leaf", value_name = "NAME=HOST", value_parser = parse_server, requires = "nodes")]
    pub leaves: Vec<Server>,
    /// Routes and leaf links use mutual TLS with the files in DIR, as each server's host sees
    /// them: ca.pem, and NAME.pem and NAME.key for each server (a certificate for its HOST,
    /// usable as server and as client).
    #[arg(long, value_name = "DIR", requires = "nodes")]
    pub tls_dir: Option<PathBuf>,
    /// Each node keeps its JetStream store in DIR/NAME (default /var/lib/nats/jetstream).
    #[arg(long, value_name = "DIR", requires = "nodes")]
    pub store_dir: Option<PathBuf>,
    /// Where the configs go, one NAME.conf per server (the directory is made if missing).
    #[arg(long, value_name = "DIR", requires = "nodes")]
    pub out_dir: Option<PathBuf>,
}

impl TopologyArgs {
    /// Whether the flags ask for configs of many hosts.
    pub fn wanted(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// The names of the leaf users to make, one per leaf.
    pub fn leaf_users(&self) -> impl Iterator<Item = &str> {
        self.leaves.iter().map(|leaf| leaf.name.as_str())
    }

    /// Refuses a server named twice.
    pub fn check(&self) -> Result<(), String> {
        if self.out_dir.is_none() {
            return Err("--node needs --out-dir, where the configs go".into());
        }
        if self.nodes.len() < 3 {
            return Err(format!(
                "{} --node given: a NATS cluster with JetStream takes at least three nodes, to \
                 keep a majority when one is lost (for one server: ember creds --full)",
                self.nodes.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for server in self.nodes.iter().chain(&self.leaves) {
            if !seen.insert(server.name.as_str()) {
                return Err(format!("server {:?} is named twice", server.name));
            }
        }
        Ok(())
    }
}

/// The NATS user a leaf server's link logs in as: `<cluster>.leaf.<name>`.
pub fn leaf_user(cluster: &str, leaf: &str) -> String {
    super::user_name(cluster, &format!("leaf.{leaf}"))
}

/// The configs of `args`' servers for the account of `users`, as (file name, text).
pub fn configs(subjects: &Subjects, users: &[User], args: &TopologyArgs) -> Vec<(String, String)> {
    let nodes = args
        .nodes
        .iter()
        .map(|node| (node, node_config(subjects, users, args, node)));
    let leaves = args
        .leaves
        .iter()
        .map(|leaf| (leaf, leaf_config(subjects, users, args, leaf)));
    nodes
        .chain(leaves)
        .map(|(server, text)| (format!("{}.conf", server.name), text))
        .collect()
}

/// Writes [`configs`] into `--out-dir`, each after `note`; the paths written.
pub fn write(
    subjects: &Subjects,
    users: &[User],
    args: &TopologyArgs,
    note: &str,
) -> std::io::Result<Vec<PathBuf>> {
    let dir = args.out_dir.as_deref().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    configs(subjects, users, args)
        .into_iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            std::fs::write(&path, format!("{note}{text}"))?;
            Ok(path)
        })
        .collect()
}

/// `host` as it goes in a URL: an IPv6 address in brackets.
fn url_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// What every server's config starts with: its name, where clients reach it, and the limits of
/// nats.conf.
fn head(subjects: &Subjects, server: &Server, what: &str) -> String {
    format!(
        "# {what} of the Ember cluster {cluster:?}, written by `ember creds`.\n\
         # No anonymous access: every client logs in as one of the users below, whose\n\
         # permissions allow only what its role needs (see docs/security.md).\n\
         server_name: {name}\n\
         host: {host}\n\
         port: {CLIENT_PORT}\n\
         max_payload: 8MB\n\
         write_deadline: \"10s\"\n",
        cluster = cluster_of(subjects),
        name = quote(&server.name),
        host = quote(&server.host),
    )
}

/// The `tls { }` block of a route or leaf link of `server`, indented by `pad`; empty without
/// `--tls-dir`. A listening side verifies its peers' certificates.
fn tls(args: &TopologyArgs, server: &Server, pad: &str, listens: bool) -> String {
    let Some(dir) = &args.tls_dir else {
        return String::new();
    };
    let file = |name: String| quote(&dir.join(name).display().to_string());
    format!(
        "{pad}tls {{\n\
         {pad}  cert_file: {}\n\
         {pad}  key_file: {}\n\
         {pad}  ca_file: {}\n\
         {verify}\
         {pad}  timeout: 2\n\
         {pad}}}\n",
        file(format!("{}.pem", server.name)),
        file(format!("{}.key", server.name)),
        file("ca.pem".into()),
        verify = if listens {
            format!("{pad}  verify: true\n")
        } else {
            String::new()
        },
    )
}

fn node_config(subjects: &Subjects, users: &[User], args: &TopologyArgs, node: &Server) -> String {
    let store = args
        .store_dir
        .as_deref()
        .unwrap_or(Path::new(DEFAULT_STORE_DIR))
        .join(&node.name);
    let routes: Vec<String> = args
        .nodes
        .iter()
        .map(|n| quote(&format!("nats-route://{}:{ROUTE_PORT}", url_host(&n.host))))
        .collect();
    let account = indent(&accounts(subjects, users, AccountFor::Server));
    format!(
        "{head}\
         \n# JetStream: every Ember stream and bucket is replicated over the nodes (R3 with three).\n\
         jetstream {{ store_dir: {store} }}\n\
         \n# The routes between the nodes{routes_tls}.\n\
         cluster {{\n  \
           name: {ROUTE_CLUSTER}\n  \
           host: {host}\n  \
           port: {ROUTE_PORT}\n  \
           routes: [{routes}]\n\
         {cluster_tls}}}\n\
         \n# Where leaf servers of edge sites link in, logging in as their leaf user below.\n\
         leafnodes {{\n  \
           host: {host}\n  \
           port: {LEAF_PORT}\n\
         {leaf_tls}}}\n\
         {accounts}",
        head = head(subjects, node, "NATS node"),
        accounts = with_system_account(&account),
        store = quote(&store.display().to_string()),
        routes_tls = if args.tls_dir.is_some() { ", over mutual TLS" } else { "" },
        host = quote(&node.host),
        routes = routes.join(", "),
        cluster_tls = tls(args, node, "  ", true),
        leaf_tls = tls(args, node, "  ", true),
    )
}

fn leaf_config(subjects: &Subjects, users: &[User], args: &TopologyArgs, leaf: &Server) -> String {
    let cluster = cluster_of(subjects);
    let user = leaf_user(cluster, &leaf.name);
    let password = users
        .iter()
        .find(|u| u.name == user)
        .map(|u| u.password.as_str())
        .unwrap_or_default();
    let urls: Vec<String> = args
        .nodes
        .iter()
        .map(|n| {
            quote(&format!(
                "nats-leaf://{user}:{password}@{}:{LEAF_PORT}",
                url_host(&n.host)
            ))
        })
        .collect();
    // Tenants' accounts are left out, and the api's export with them: tenants log in at the
    // nodes, whose copies of the cluster's account export the api to their accounts.
    let account = indent(&account_block(subjects, users, AccountFor::Leaf));
    format!(
        "{head}\
         \n# The link to the nodes{tls_note}: this server's copy of the account is the nodes'\n\
         # account, and its clients' JetStream requests are answered there.\n\
         leafnodes {{\n  \
           remotes: [{{\n    \
             urls: [{urls}]\n    \
             account: {account_name}\n\
         {leaf_tls}  }}]\n\
         }}\n\
         \naccounts {{\n\
         {account}}}\n",
        head = head(subjects, leaf, "A leaf-node server for an edge site"),
        tls_note = if args.tls_dir.is_some() {
            ", over mutual TLS"
        } else {
            ""
        },
        urls = urls.join(", "),
        account_name = quote(&account_name(cluster)),
        leaf_tls = tls(args, leaf, "    ", false),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_name_equals_host() {
        assert_eq!(
            parse_server("n1=10.0.0.1"),
            Ok(Server {
                name: "n1".into(),
                host: "10.0.0.1".into()
            })
        );
        assert!(parse_server("n1").unwrap_err().contains("NAME=HOST"));
        assert!(parse_server("n 1=10.0.0.1").is_err());
        assert!(parse_server("n1=").is_err());
        assert!(parse_server("n1=a\"b").is_err());
        assert_eq!(url_host("fd00::1"), "[fd00::1]");
    }

    #[test]
    fn a_server_named_twice_fewer_than_three_nodes_or_no_out_dir_is_refused() {
        let server = |text| parse_server(text).unwrap();
        let mut args = TopologyArgs {
            nodes: vec![server("n1=h1"), server("n1=h2"), server("n3=h3")],
            ..Default::default()
        };
        assert!(args.check().unwrap_err().contains("--out-dir"));
        args.out_dir = Some("out".into());
        assert!(args.check().unwrap_err().contains("\"n1\" is named twice"));
        args.nodes[1] = server("n2=h2");
        args.leaves = vec![server("n1=h4")];
        assert!(args.check().is_err());
        args.leaves = vec![server("edge=h4")];
        assert_eq!(args.check(), Ok(()));
        args.nodes.pop();
        assert!(args.check().unwrap_err().contains("at least three nodes"));
    }
}
