//! Config values richer than a number or a string: an amount of tokens given as a count or a fraction of the
//! window, and a selection of tools given as all, none or a list of names.

use serde::{Deserialize, Serialize};

/// An amount of tokens: a whole number of tokens (`2000`), or a fraction of the model's window (`0.05`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum TokenAmount {
    /// A number of tokens.
    Tokens(u64),
    /// A fraction of the context window, in [0, 1).
    Fraction(f64),
}

impl TokenAmount {
    /// The amount in tokens for a model whose window is `window` tokens.
    pub fn tokens(self, window: u64) -> u64 {
        match self {
            TokenAmount::Tokens(t) => t,
            TokenAmount::Fraction(f) => (f * window as f64) as u64,
        }
    }

    /// A problem with the value, if any (`key` names it in the message).
    pub fn problem(self, key: &str) -> Option<String> {
        match self {
            TokenAmount::Fraction(f) if !(0.0..1.0).contains(&f) => Some(format!(
                "{key}: {f} must be a whole number of tokens or a fraction of the window in [0, 1)"
            )),
            _ => None,
        }
    }
}

/// Which tools a setting applies to: `true` (every tool), `false` (none) or a list of tool names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ToolSelection {
    /// Every tool (`true`) or none (`false`).
    All(bool),
    /// Only the tools named.
    Only(Vec<String>),
}

impl ToolSelection {
    /// Whether the tool `name` is selected.
    pub fn includes(&self, name: &str) -> bool {
        match self {
            ToolSelection::All(all) => *all,
            ToolSelection::Only(names) => names.iter().any(|n| n == name),
        }
    }

    /// Whether no tool at all is selected.
    pub fn is_none(&self) -> bool {
        match self {
            ToolSelection::All(all) => !all,
            ToolSelection::Only(names) => names.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        a: TokenAmount,
        s: ToolSelection,
    }

    fn parse(src: &str) -> T {
        toml::from_str(src).unwrap_or_else(|e| panic!("{src}: {e}"))
    }

    #[test]
    fn amounts_are_tokens_or_fractions_of_the_window() {
        let t = parse("a = 2000\ns = true");
        assert_eq!(t.a, TokenAmount::Tokens(2000));
        assert_eq!(t.a.tokens(128_000), 2000);
        let f = parse("a = 0.05\ns = false");
        assert_eq!(f.a, TokenAmount::Fraction(0.05));
        assert_eq!(f.a.tokens(100_000), 5000);
        assert!(f.a.problem("k").is_none());
        assert!(TokenAmount::Fraction(1.5)
            .problem("context.clear_at_least")
            .is_some_and(|p| p.starts_with("context.clear_at_least")));
        assert!(TokenAmount::Fraction(-0.1).problem("k").is_some());
    }

    #[test]
    fn selections_are_all_none_or_named() {
        assert!(parse("a = 1\ns = true").s.includes("anything"));
        let none = parse("a = 1\ns = false").s;
        assert!(!none.includes("anything") && none.is_none());
        let some = parse("a = 1\ns = [\"write_file\", \"edit\"]").s;
        assert!(some.includes("edit") && !some.includes("read_file") && !some.is_none());
        assert!(toml::from_str::<T>("a = 1\ns = \"yes\"").is_err());
    }
}
