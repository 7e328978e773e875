//! Loading in one pass: the file parsed, the environment layered over it, every key checked on its own (name and
//! type, with its full path), then — the wrong keys left at their defaults — every section's `problems()`, so
//! that one message lists every problem of a file and none derived from another.

use super::env::apply_env;
use super::{Config, ConfigErrors};
use std::collections::HashSet;
use std::path::Path;

impl Config {
    /// Loads the config: defaults, then the file at `path` (if any), then `CTXGATE_<SECTION>__<KEY>` variables.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigErrors> {
        Self::load_from(path, std::env::vars())
    }

    /// Like [`Config::load`], with the environment given explicitly (for tests).
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigErrors> {
        let mut table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    ConfigErrors(vec![format!(
                        "cannot read config file {}: {e}",
                        p.display()
                    )])
                })?;
                text.parse::<toml::Table>().map_err(|e| {
                    ConfigErrors(vec![format!("{}: {}", p.display(), e.to_string().trim())])
                })?
            }
            None => toml::Table::new(),
        };
        let mut errors = Vec::new();
        apply_env(&mut table, env, &mut errors);
        Self::from_table(table, errors)
    }

    /// Parses a config from TOML text (no environment overrides).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigErrors> {
        let table = text
            .parse::<toml::Table>()
            .map_err(|e| ConfigErrors(vec![e.to_string().trim().to_string()]))?;
        Self::from_table(table, Vec::new())
    }

    /// The config of a parsed file (environment applied), checked in one pass: every key's type and name, then —
    /// with the keys found wrong left at their defaults — every value and cross-field rule, so that one message
    /// lists every problem. `errors`: problems found before (the environment's).
    fn from_table(mut table: toml::Table, mut errors: Vec<String>) -> Result<Config, ConfigErrors> {
        let set = set_keys(&table);
        for (section, key) in check_each_key(&table, &mut errors) {
            remove_key(&mut table, &section, key.as_deref());
        }
        match toml::Value::Table(table).try_into::<Config>() {
            Ok(config) => {
                errors.extend(config.problems(&|k: &str| set.contains(k)));
                if errors.is_empty() {
                    return Ok(config);
                }
            }
            Err(e) => errors.push(e.message().to_string()),
        }
        Err(ConfigErrors(errors))
    }
}

/// The deserialization error of a config holding only `value` as `section`, if any.
fn fits(section: &str, value: toml::Value) -> Option<toml::de::Error> {
    let mut one = toml::Table::new();
    one.insert(section.to_string(), value);
    toml::Value::Table(one).try_into::<Config>().err()
}

/// A table of one entry.
fn single(key: &str, value: &toml::Value) -> toml::Value {
    let mut t = toml::Table::new();
    t.insert(key.to_string(), value.clone());
    toml::Value::Table(t)
}

/// Checks every key of `table` on its own (its name and type), pushing one problem per wrong key with its full
/// path (`models."gpt-4o".context_window` for a model's field). Returns the wrong keys — `(section, key)`,
/// `(section, None)` for a whole section — so that the rest can still be checked.
fn check_each_key(table: &toml::Table, errors: &mut Vec<String>) -> Vec<(String, Option<String>)> {
    let mut wrong = Vec::new();
    for (section, value) in table {
        let keys = match value {
            toml::Value::Table(keys) if !keys.is_empty() => keys,
            other => {
                if let Some(e) = fits(section, other.clone()) {
                    errors.push(format!("{section}: {}", e.message()));
                    wrong.push((section.clone(), None));
                }
                continue;
            }
        };
        for (key, v) in keys {
            let Some(e) = fits(section, single(key, v)) else {
                continue;
            };
            wrong.push((section.clone(), Some(key.clone())));
            if section == "models" || section == "upstreams" {
                check_entry_fields(section, key, v, &e, errors);
            } else {
                errors.push(format!("{section}.{key}: {}", e.message()));
            }
        }
    }
    wrong
}

/// A wrong entry of a map of tables (`[models."<key>"]`, `[upstreams.<key>]`): each wrong field named
/// (`models."gpt-4o".context_window: …`, `upstreams.local.kind: …`), or the entry itself when it is not a table
/// of fields (`e`: the entry's error).
fn check_entry_fields(
    section: &str,
    key: &str,
    entry: &toml::Value,
    e: &toml::de::Error,
    errors: &mut Vec<String>,
) {
    let path = match section {
        "models" => format!("models.\"{key}\""),
        _ => format!("{section}.{key}"),
    };
    let fields = match entry {
        toml::Value::Table(fields) if !fields.is_empty() => fields,
        _ => {
            errors.push(format!("{path}: {}", e.message()));
            return;
        }
    };
    for (field, fv) in fields {
        if let Some(e) = fits(section, single(key, &single(field, fv))) {
            errors.push(format!("{path}.{field}: {}", e.message()));
        }
    }
}

/// Removes `section.key` (or the whole section) from `table`.
fn remove_key(table: &mut toml::Table, section: &str, key: Option<&str>) {
    match key {
        None => {
            table.remove(section);
        }
        Some(k) => {
            if let Some(toml::Value::Table(keys)) = table.get_mut(section) {
                keys.remove(k);
            }
        }
    }
}

/// The `section.key` paths a parsed file (with the environment applied) sets.
fn set_keys(table: &toml::Table) -> HashSet<String> {
    let mut set = HashSet::new();
    for (section, value) in table {
        set.insert(section.clone());
        if let toml::Value::Table(keys) = value {
            set.extend(keys.keys().map(|k| format!("{section}.{k}")));
        }
    }
    set
}
