//! The one duration syntax of every duration key: a whole number and a unit, `ms`, `s`, `m`, `h` or `d`
//! (`"500ms"`, `"90s"`, `"30m"`, `"24h"`, `"7d"`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The syntax, as the reference and the error messages state it.
pub const SYNTAX: &str =
    "a whole number and a unit, ms, s, m, h or d (\"500ms\", \"90s\", \"30m\", \"24h\", \"7d\")";

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// A duration key's value: written as a whole number and a unit (`"90s"`, `"30m"`, `"7d"`, `"500ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationSpec(Duration);

impl DurationSpec {
    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> DurationSpec {
        DurationSpec(Duration::from_secs(secs))
    }

    /// A duration of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> DurationSpec {
        DurationSpec(Duration::from_millis(ms))
    }

    /// Parses the duration syntax ([`SYNTAX`]); the error says what is wrong, without the key.
    pub fn parse(s: &str) -> Result<DurationSpec, String> {
        let text = s.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = (&text[..split], text[split..].trim());
        if digits.is_empty() || !unit.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(format!("{s:?} is not a duration: write {SYNTAX}"));
        }
        if unit.is_empty() {
            return Err(no_unit(digits));
        }
        let Some(&(_, per)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(format!("{s:?}: the unit must be ms, s, m, h or d"));
        };
        digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(per))
            .map(DurationSpec::from_millis)
            .ok_or_else(|| format!("{s:?} is too long a duration"))
    }

    /// The duration.
    pub fn duration(self) -> Duration {
        self.0
    }

    /// The duration in whole seconds.
    pub fn secs(self) -> u64 {
        self.0.as_secs()
    }
}

/// The complaint about a number written without a unit (`3600`, `"3600"`).
fn no_unit(n: impl fmt::Display) -> String {
    format!("{n} has no unit: write \"{n}s\" for seconds; a duration is {SYNTAX}")
}

/// Written back in the largest unit that divides it (`1800s` as `"30m"`), so a value reads as it was written.
impl fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX);
        let (unit, per) = UNITS
            .iter()
            .find(|(_, per)| ms % per == 0 && ms > 0)
            .copied()
            .unwrap_or(("s", 1_000));
        write!(f, "{}{unit}", ms / per)
    }
}

impl schemars::JsonSchema for DurationSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": format!("a duration: {SYNTAX}")
        })
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Visitor)
    }
}

/// Reads a string in the duration syntax; a bare number is refused with the fix (its unit) named.
struct Visitor;

impl serde::de::Visitor<'_> for Visitor {
    type Value = DurationSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a duration: {SYNTAX}")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<DurationSpec, E> {
        DurationSpec::parse(s).map_err(E::custom)
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<DurationSpec, E> {
        Err(E::custom(no_unit(n)))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<DurationSpec, E> {
        Err(E::custom(no_unit(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Duration, String> {
        DurationSpec::parse(s).map(DurationSpec::duration)
    }

    #[test]
    fn every_unit_and_the_forms_in_use() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse(" 45 m "), Ok(Duration::from_secs(2700)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_bare_number_or_a_bad_unit_says_what_to_write() {
        let e = parse("3600").unwrap_err();
        assert!(e.starts_with("3600 has no unit: write \"3600s\""), "{e}");
        for bad in ["m", "soon", "-5s", "1.5h", "", "2h30m!"] {
            let e = parse(bad).unwrap_err();
            assert!(
                e.contains("is not a duration: write a whole number"),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            parse("5 weeks").unwrap_err(),
            "\"5 weeks\": the unit must be ms, s, m, h or d"
        );
        assert!(parse("99999999999999999999d")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn written_back_in_the_largest_whole_unit() {
        for (text, shown) in [
            ("1800s", "30m"),
            ("5m", "5m"),
            ("7d", "7d"),
            ("90s", "90s"),
            ("1500ms", "1500ms"),
            ("0ms", "0s"),
        ] {
            assert_eq!(
                DurationSpec::parse(text).unwrap().to_string(),
                shown,
                "{text}"
            );
        }
    }

    #[test]
    fn toml_values_in_the_syntax_and_bare_numbers_refused() {
        #[derive(Deserialize, Serialize)]
        struct T {
            d: DurationSpec,
        }
        let t: T = toml::from_str("d = \"24h\"").unwrap();
        assert_eq!(t.d.secs(), 86_400);
        assert_eq!(toml::to_string(&t).unwrap().trim(), "d = \"1d\"");
        let e = toml::from_str::<T>("d = 3600").err().unwrap();
        assert!(e.message().starts_with("3600 has no unit"), "{e}");
        let e = toml::from_str::<T>("d = true").err().unwrap();
        assert!(e.message().contains("expected a duration"), "{e}");
    }
}
