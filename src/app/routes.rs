//! Per-model upstreams: which upstream a model's conversation requests go to — the `[upstreams.<name>]` that
//! `[models."<pattern>"] upstream` names (patterns matched as the model table matches them), else `[upstream]` /
//! `[anthropic]` — with each upstream's request counters. Built with each config snapshot; a lookup is memoised per
//! model name for the snapshot's life, and a config without routes costs one emptiness check.

use crate::config::{Config, NamedUpstream};
use crate::context::long_context::strip_1m;
use crate::context::models::{glob_match, lookup_names, sort_globs, MAX_MODEL_LEN};
use crate::dialect::Dialect;
use crate::error::GatewayError;
use crate::metrics::{DialectLabel, Metrics, UpstreamCounts, UpstreamOutcome};
use crate::upstream::{Api, Target, Upstream};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// An upstream requests can be routed to, with its counters for the dialects it speaks.
#[derive(Debug)]
pub struct Routed {
    /// Where the request goes.
    pub target: Arc<Target>,
    /// Counters by dialect (at its `DialectLabel` index); `None` for the dialects its API does not speak.
    counts: Vec<Option<UpstreamCounts>>,
}

impl Routed {
    fn new(target: Arc<Target>, metrics: &Metrics) -> Routed {
        let counts = DialectLabel::ALL
            .iter()
            .map(|l| {
                let d = Dialect::ALL.into_iter().find(|d| d.label() == *l)?;
                (d.api() == target.api()).then(|| metrics.upstream_counts(target.name(), d))
            })
            .collect();
        Routed { target, counts }
    }

    /// Counts one request of `dialect` sent here.
    pub fn count(&self, dialect: Dialect, outcome: UpstreamOutcome) {
        let i = DialectLabel::from(dialect).idx();
        if let Some(Some(c)) = self.counts.get(i) {
            c.count(outcome);
        }
    }
}

/// The routes of one config snapshot.
pub struct Routes {
    /// `[upstream]` (`default`), `[anthropic]` and `[gemini]`.
    openai: Arc<Routed>,
    anthropic: Arc<Routed>,
    gemini: Arc<Routed>,
    /// Each `[upstreams.<name>]` as configured and built (a reload keeps an unchanged one, and its pool).
    named: HashMap<String, (NamedUpstream, Arc<Routed>)>,
    /// Routed model names (lowercased) and patterns, the most literal pattern first.
    exact: HashMap<String, Arc<Routed>>,
    globs: Vec<(String, Arc<Routed>)>,
    /// What a lookup found, by model name (emptied when it holds [`MEMO_MAX`] names).
    memo: Mutex<HashMap<Box<str>, Option<Arc<Routed>>>>,
}

/// Most model names a snapshot's memo remembers.
const MEMO_MAX: usize = 1024;

impl Routes {
    /// The routes of `config`: the defaults over `upstream`'s client, each named upstream built (or taken from
    /// `previous` when its settings did not change), and the models' routes.
    pub fn build(
        config: &Config,
        upstream: &Upstream,
        metrics: &Metrics,
        previous: Option<&Routes>,
    ) -> Result<Routes, GatewayError> {
        let mut named = HashMap::with_capacity(config.upstreams.len());
        for (name, cfg) in &config.upstreams {
            let kept = previous
                .and_then(|p| p.named.get(name))
                .filter(|(old, _)| old == cfg)
                .map(|(_, r)| r.clone());
            let routed = match kept {
                Some(r) => r,
                None => Arc::new(Routed::new(
                    Arc::new(Target::named(name, cfg, &config.upstream)?),
                    metrics,
                )),
            };
            named.insert(name.clone(), (cfg.clone(), routed));
        }
        let (mut exact, mut globs) = (HashMap::new(), Vec::new());
        for (pattern, entry) in &config.models {
            let Some(name) = &entry.upstream else {
                continue;
            };
            let Some((_, routed)) = named.get(name) else {
                return Err(GatewayError::Internal(format!(
                    "models.\"{pattern}\".upstream: no upstream named {name:?}"
                )));
            };
            let pattern = strip_1m(pattern).0.to_lowercase();
            if pattern.contains(['*', '?']) {
                globs.push((pattern, routed.clone()));
            } else {
                exact.insert(pattern, routed.clone());
            }
        }
        sort_globs(&mut globs);
        Ok(Routes {
            openai: Arc::new(Routed::new(upstream.target(Api::OpenAi).clone(), metrics)),
            anthropic: Arc::new(Routed::new(
                upstream.target(Api::Anthropic).clone(),
                metrics,
            )),
            gemini: Arc::new(Routed::new(upstream.target(Api::Gemini).clone(), metrics)),
            named,
            exact,
            globs,
            memo: Mutex::new(HashMap::new()),
        })
    }

    /// Where a `dialect` request for `model` goes: its route, else the default of its API. A model routed to an
    /// upstream of another API is refused (400, naming both): ctxgate does not translate between APIs.
    pub fn resolve(&self, model: &str, dialect: Dialect) -> Result<Arc<Routed>, GatewayError> {
        let api = dialect.api();
        match self.route(model) {
            Some(r) if r.target.api() == api => Ok(r),
            Some(r) => Err(GatewayError::BadRequest {
                message: format!(
                    "model {model:?} is routed to upstream {:?} ([upstreams.{}] kind = \"{}\"), which does not \
                     serve {} requests; ctxgate does not translate between APIs: send this model's requests in \
                     its upstream's API, or route the model to an upstream of kind \"{}\"",
                    r.target.name(),
                    r.target.name(),
                    kind(r.target.api()),
                    dialect.as_str(),
                    kind(api),
                ),
                param: Some("model"),
            }),
            None => Ok(match api {
                Api::OpenAi => self.openai.clone(),
                Api::Anthropic => self.anthropic.clone(),
                Api::Gemini => self.gemini.clone(),
            }),
        }
    }

    /// The routed upstream of `model`, if a `[models]` entry routes it: exact names before patterns, the most
    /// literal pattern first; case-insensitive, a provider prefix (`openai/…`) also tried without it, a `[1m]`
    /// suffix ignored — as the model table looks up windows.
    pub fn route(&self, model: &str) -> Option<Arc<Routed>> {
        if (self.exact.is_empty() && self.globs.is_empty()) || model.len() > MAX_MODEL_LEN {
            return None;
        }
        if let Some(found) = self.memo.lock().get(model) {
            return found.clone();
        }
        let found = self.look_up(model);
        let mut memo = self.memo.lock();
        if memo.len() >= MEMO_MAX {
            memo.clear();
        }
        memo.insert(model.into(), found.clone());
        found
    }

    /// [`Routes::route`] without the memo.
    fn look_up(&self, model: &str) -> Option<Arc<Routed>> {
        let full = strip_1m(model).0.to_lowercase();
        let names: &[&str] = &lookup_names(&full);
        names
            .iter()
            .find_map(|n| self.exact.get(*n))
            .or_else(|| {
                names.iter().find_map(|n| {
                    self.globs
                        .iter()
                        .find(|(p, _)| glob_match(p, n))
                        .map(|(_, r)| r)
                })
            })
            .cloned()
    }
}

/// The `kind` that speaks `api`.
fn kind(api: Api) -> &'static str {
    api.kind()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelEntry, UpstreamKind};

    fn config(routes: &[(&str, &str)]) -> Config {
        let mut c = Config::default();
        for (name, kind) in [
            ("local", UpstreamKind::Openai),
            ("claude", UpstreamKind::Anthropic),
        ] {
            c.upstreams.insert(
                name.into(),
                NamedUpstream {
                    base_url: format!("http://{name}.example/v1"),
                    kind,
                    ..NamedUpstream::default()
                },
            );
        }
        for (pattern, upstream) in routes {
            c.models.insert(
                pattern.to_string(),
                ModelEntry {
                    upstream: Some(upstream.to_string()),
                    ..ModelEntry::default()
                },
            );
        }
        c
    }

    fn routes(c: &Config, previous: Option<&Routes>) -> Routes {
        let up = Upstream::new(&c.upstream, &c.anthropic, &c.gemini).unwrap();
        let m = Metrics::new(Box::new(|_: &str| None)).unwrap();
        Routes::build(c, &up, &m, previous).unwrap()
    }

    fn name(r: &Routes, model: &str, dialect: Dialect) -> String {
        r.resolve(model, dialect).unwrap().target.name().to_string()
    }

    #[test]
    fn models_go_to_their_routes_in_the_model_tables_order_and_others_to_the_defaults() {
        let r = routes(
            &config(&[
                ("qwen*", "local"),
                ("qwen3-coder", "claude"),
                ("claude-*", "claude"),
                ("c*", "local"),
            ]),
            None,
        );
        assert_eq!(name(&r, "qwen2.5-7b", Dialect::Chat), "local");
        assert_eq!(name(&r, "Qwen2.5-7B", Dialect::Responses), "local");
        assert_eq!(name(&r, "vllm/qwen2.5", Dialect::Chat), "local");
        // an exact name before a pattern; the most literal pattern first
        assert_eq!(name(&r, "qwen3-coder", Dialect::Anthropic), "claude");
        assert_eq!(
            name(&r, "claude-sonnet-4-5[1m]", Dialect::Anthropic),
            "claude"
        );
        assert_eq!(name(&r, "codestral", Dialect::Chat), "local");
        // no route: the dialect's default
        assert_eq!(name(&r, "gpt-4o", Dialect::Chat), "default");
        assert_eq!(name(&r, "gpt-4o", Dialect::Responses), "default");
        assert_eq!(name(&r, "opus", Dialect::Anthropic), "anthropic");
        assert_eq!(
            name(&r, &"q".repeat(MAX_MODEL_LEN + 1), Dialect::Chat),
            "default"
        );
        // the memo answers the same
        assert_eq!(name(&r, "qwen2.5-7b", Dialect::Chat), "local");
    }

    #[test]
    fn a_model_routed_to_an_upstream_of_another_api_is_refused_naming_both() {
        let r = routes(&config(&[("claude-*", "claude"), ("qwen*", "local")]), None);
        for (model, dialect, upstream) in [
            ("claude-opus-4", Dialect::Chat, "claude"),
            ("claude-opus-4", Dialect::Responses, "claude"),
            ("qwen3", Dialect::Anthropic, "local"),
        ] {
            let e = r.resolve(model, dialect).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, GatewayError::BadRequest { .. }),
                "{model}: {msg}"
            );
            assert!(msg.contains(&format!("{model:?}")), "{msg}");
            assert!(msg.contains(&format!("{upstream:?}")), "{msg}");
        }
    }

    #[test]
    fn a_rebuild_keeps_an_unchanged_upstream_and_rebuilds_a_changed_one() {
        let c = config(&[("qwen*", "local"), ("claude-*", "claude")]);
        let first = routes(&c, None);
        let mut changed = c.clone();
        changed.upstreams.get_mut("claude").unwrap().base_url = "http://other.example".into();
        let second = routes(&changed, Some(&first));
        let same = |m: &str, d| {
            Arc::ptr_eq(
                &first.resolve(m, d).unwrap().target,
                &second.resolve(m, d).unwrap().target,
            )
        };
        assert!(same("qwen3", Dialect::Chat));
        assert!(!same("claude-x", Dialect::Anthropic));
    }
}
