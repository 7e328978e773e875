//! Environment layering: `CTXGATE_<SECTION>__<KEY>=value` variables set over the file's keys.

/// Prefix of environment variables that override config keys.
pub const ENV_PREFIX: &str = "CTXGATE_";

/// Overlays `CTXGATE_<SECTION>__<KEY>=value` variables onto the table. Values are read as TOML values when they
/// parse as one (`8787`, `true`, `0.7`) and as plain strings otherwise.
pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
    errors: &mut Vec<String>,
) {
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        // Variables without `__` (CTXGATE_REQUIRE_EXTERNAL, …) are not config keys.
        let Some((section, key)) = rest.split_once("__") else {
            continue;
        };
        let section = section.to_ascii_lowercase();
        let key = key.to_ascii_lowercase();
        if section.is_empty() || key.is_empty() || key.contains("__") {
            errors.push(format!(
                "{name}: environment overrides take the form CTXGATE_<SECTION>__<KEY>"
            ));
            continue;
        }
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key, parsed);
            }
            _ => errors.push(format!("{name}: `{section}` is not a section")),
        }
    }
}
