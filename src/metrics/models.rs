//! Model labels through an allowlist: a request's model becomes the configured or shipped model-table entry it
//! matches (`gpt-4o*`), anything else `other`. Resolved once per model name and cached (bounded), with the
//! series of each label resolved once too, so recording costs one hash lookup.

use super::labels::{CacheMissCause, DialectLabel};
use parking_lot::{Mutex, RwLock};
use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec};
use std::collections::HashMap;
use std::sync::Arc;

/// Maps a model name to its allowlisted label (a model-table entry), or `None` for `other`.
pub type ModelResolver = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The label of models outside the allowlist.
pub const OTHER: &str = "other";

/// Model names remembered; beyond this, names are resolved on every use (still to a bounded label set).
const MAX_NAMES: usize = 1024;
/// Longer names are never looked up: they are `other`.
const MAX_NAME_LEN: usize = 256;

/// The per-model token counters of one label, one per dialect (indexed by `DialectLabel::idx`; `None` for `none`:
/// tokens are counted for conversations only).
pub(crate) struct ModelSeries {
    /// The label value.
    pub label: Arc<str>,
    pub client_prompt: Vec<Option<IntCounter>>,
    pub upstream_prompt: Vec<Option<IntCounter>>,
    pub upstream_cached: Vec<Option<IntCounter>>,
    pub completion: Vec<Option<IntCounter>>,
    pub saved: Vec<Option<IntCounter>>,
    pub spend_dollars: Vec<Option<Counter>>,
    pub saved_dollars: Vec<Option<Counter>>,
    /// Indexed by `DialectLabel::idx` × the causes + `CacheMissCause::idx`.
    pub cache_miss: Vec<Option<IntCounter>>,
}

/// The per-model counter families (labels `model`, `dialect`).
pub(crate) struct TokenFamilies {
    pub client_prompt: IntCounterVec,
    pub upstream_prompt: IntCounterVec,
    pub upstream_cached: IntCounterVec,
    pub completion: IntCounterVec,
    pub saved: IntCounterVec,
    pub spend_dollars: CounterVec,
    pub saved_dollars: CounterVec,
    pub cache_miss: IntCounterVec,
}

pub(crate) struct ModelLabels {
    resolve: ModelResolver,
    families: TokenFamilies,
    by_name: RwLock<HashMap<String, Arc<ModelSeries>>>,
    by_label: Mutex<HashMap<Arc<str>, Arc<ModelSeries>>>,
    other: Arc<ModelSeries>,
}

impl ModelLabels {
    pub fn new(resolve: ModelResolver, families: TokenFamilies) -> Self {
        let other = Arc::new(series(&families, Arc::from(OTHER)));
        let mut by_label = HashMap::new();
        by_label.insert(other.label.clone(), other.clone());
        ModelLabels {
            resolve,
            families,
            by_name: RwLock::new(HashMap::new()),
            by_label: Mutex::new(by_label),
            other,
        }
    }

    /// Runs `f` with the series of `model`'s label.
    pub fn with<T>(&self, model: &str, f: impl FnOnce(&ModelSeries) -> T) -> T {
        if let Some(s) = self.by_name.read().get(model) {
            return f(s);
        }
        let s = self.lookup(model);
        f(&s)
    }

    /// The label of `model`.
    pub fn label(&self, model: &str) -> Arc<str> {
        self.with(model, |s| s.label.clone())
    }

    fn lookup(&self, model: &str) -> Arc<ModelSeries> {
        if model.len() > MAX_NAME_LEN {
            return self.other.clone();
        }
        let series = match (self.resolve)(model) {
            None => self.other.clone(),
            Some(label) => {
                let mut by_label = self.by_label.lock();
                match by_label.get(label.as_str()) {
                    Some(s) => s.clone(),
                    None => {
                        let label: Arc<str> = Arc::from(label);
                        let s = Arc::new(series(&self.families, label.clone()));
                        by_label.insert(label, s.clone());
                        s
                    }
                }
            }
        };
        let mut by_name = self.by_name.write();
        if by_name.len() < MAX_NAMES {
            by_name.insert(model.to_owned(), series.clone());
        }
        series
    }
}

/// `family`'s series for model `label` in each dialect (`None` for the no-dialect label).
fn per_dialect<T: prometheus::core::MetricVecBuilder>(
    family: &prometheus::core::MetricVec<T>,
    label: &str,
) -> Vec<Option<T::M>> {
    DialectLabel::ALL
        .iter()
        .map(|d| {
            (*d != DialectLabel::NoDialect).then(|| family.with_label_values(&[label, d.as_str()]))
        })
        .collect()
}

fn series(f: &TokenFamilies, label: Arc<str>) -> ModelSeries {
    let ints = |family: &IntCounterVec| per_dialect(family, &label);
    let dollars = |family: &CounterVec| per_dialect(family, &label);
    ModelSeries {
        client_prompt: ints(&f.client_prompt),
        upstream_prompt: ints(&f.upstream_prompt),
        upstream_cached: ints(&f.upstream_cached),
        completion: ints(&f.completion),
        saved: ints(&f.saved),
        spend_dollars: dollars(&f.spend_dollars),
        saved_dollars: dollars(&f.saved_dollars),
        cache_miss: DialectLabel::ALL
            .iter()
            .flat_map(|d| {
                CacheMissCause::ALL.iter().map(|c| {
                    (*d != DialectLabel::NoDialect).then(|| {
                        f.cache_miss
                            .with_label_values(&[&*label, d.as_str(), c.as_str()])
                    })
                })
            })
            .collect(),
        label,
    }
}
