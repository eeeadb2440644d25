//! `nats` CLI contexts (`nats context add NAME ...`): the JSON file a NATS shop already keeps for
//! each system it reaches, read by `--context NAME` so Ember needs no second copy of the servers,
//! credentials and TLS files.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The settings of a context file that Ember uses, named as the `nats` CLI writes them. Every
/// field is optional: the CLI writes empty strings for what was not set.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Context {
    pub url: String,
    pub token: String,
    pub user: String,
    pub password: String,
    pub creds: String,
    pub nkey: String,
    pub cert: String,
    pub key: String,
    pub ca: String,
    pub inbox_prefix: String,
    pub tls_first: bool,
    // Settings Ember cannot honour: a context that sets one is refused rather than half used.
    jetstream_domain: String,
    jetstream_api_prefix: String,
    socks_proxy: String,
    user_jwt: String,
    nsc: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("no nats context {name:?}: {path} {reason} (`nats context ls` lists them)")]
    Unreadable {
        name: String,
        path: PathBuf,
        reason: String,
    },
    #[error("the nats context {path} is not a context file: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error(
        "the nats context {path} sets {setting}, which Ember does not support: use a context \
         without it"
    )]
    Unsupported {
        path: PathBuf,
        setting: &'static str,
    },
}

impl Context {
    /// Reads the context `name`: a path to a context file (anything with a `/` or ending in
    /// `.json`), else `<config>/nats/context/<name>.json`, where `<config>` is
    /// `$XDG_CONFIG_HOME` or `~/.config`, as the `nats` CLI keeps them.
    pub fn load(name: &str) -> Result<Context, ContextError> {
        let path = context_path(name, |key| std::env::var_os(key).map(PathBuf::from));
        let text = std::fs::read_to_string(&path).map_err(|e| ContextError::Unreadable {
            name: name.to_string(),
            path: path.clone(),
            reason: e.to_string(),
        })?;
        Context::parse(&text, &path)
    }

    fn parse(text: &str, path: &Path) -> Result<Context, ContextError> {
        let context: Context = serde_json::from_str(text).map_err(|e| ContextError::Malformed {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let unsupported = [
            ("jetstream_domain", &context.jetstream_domain),
            ("jetstream_api_prefix", &context.jetstream_api_prefix),
            ("socks_proxy", &context.socks_proxy),
            ("user_jwt", &context.user_jwt),
            ("nsc", &context.nsc),
        ];
        if let Some((setting, _)) = unsupported.iter().find(|(_, value)| !value.is_empty()) {
            return Err(ContextError::Unsupported {
                path: path.to_path_buf(),
                setting,
            });
        }
        Ok(context)
    }

    /// A path setting of the context, with a leading `~/` taken as the home directory (the CLI
    /// writes them so).
    pub fn file(value: &str) -> Option<PathBuf> {
        match value.strip_prefix("~/") {
            _ if value.is_empty() => None,
            Some(rest) => Some(home(|key| std::env::var_os(key).map(PathBuf::from)).join(rest)),
            None => Some(PathBuf::from(value)),
        }
    }

    /// A text setting of the context, `None` when empty.
    pub fn text(value: &str) -> Option<String> {
        (!value.is_empty()).then(|| value.to_string())
    }
}

fn home(env: impl Fn(&str) -> Option<PathBuf>) -> PathBuf {
    env("HOME").unwrap_or_else(|| PathBuf::from("/"))
}

fn context_path(name: &str, env: impl Fn(&str) -> Option<PathBuf>) -> PathBuf {
    if name.contains('/') || name.ends_with(".json") {
        return PathBuf::from(name);
    }
    let config = env("XDG_CONFIG_HOME")
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| home(&env).join(".config"));
    config
        .join("nats")
        .join("context")
        .join(format!("{name}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<PathBuf> + 'a {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| PathBuf::from(v))
        }
    }

    #[test]
    fn a_context_name_is_found_where_the_nats_cli_keeps_it() {
        let home = [("HOME", "/home/ada")];
        assert_eq!(
            context_path("prod", env(&home)),
            Path::new("/home/ada/.config/nats/context/prod.json")
        );
        let xdg = [("HOME", "/home/ada"), ("XDG_CONFIG_HOME", "/etc/cfg")];
        assert_eq!(
            context_path("prod", env(&xdg)),
            Path::new("/etc/cfg/nats/context/prod.json")
        );
        assert_eq!(
            context_path("./prod.json", env(&home)),
            Path::new("./prod.json")
        );
    }

    #[test]
    fn a_context_as_the_cli_writes_it_is_read_and_empty_settings_are_unset() {
        let text = r#"{"description":"","url":"nats://a:4222,nats://b:4222","socks_proxy":"",
            "token":"","user":"ada","password":"pw","creds":"","nkey":"","cert":"","key":"",
            "ca":"/etc/ca.pem","nsc":"","jetstream_domain":"","jetstream_api_prefix":"",
            "jetstream_event_prefix":"","inbox_prefix":"_INBOX_ada","user_jwt":"",
            "color_scheme":"","tls_first":false,"windows_cert_store":""}"#;
        let context = Context::parse(text, Path::new("c.json")).unwrap();
        assert_eq!(context.url, "nats://a:4222,nats://b:4222");
        assert_eq!(Context::text(&context.user).as_deref(), Some("ada"));
        assert_eq!(Context::text(&context.token), None);
        assert_eq!(
            Context::file(&context.ca),
            Some(PathBuf::from("/etc/ca.pem"))
        );
        assert_eq!(Context::file(&context.creds), None);
        assert_eq!(context.inbox_prefix, "_INBOX_ada");
    }

    #[test]
    fn a_context_with_a_setting_ember_cannot_honour_is_refused_by_name() {
        let error = Context::parse(
            r#"{"url":"nats://a","jetstream_domain":"hub"}"#,
            Path::new("c"),
        )
        .unwrap_err();
        assert!(error.to_string().contains("jetstream_domain"), "{error}");
        let error = Context::parse("[1]", Path::new("c")).unwrap_err();
        assert!(matches!(error, ContextError::Malformed { .. }), "{error}");
    }
}
