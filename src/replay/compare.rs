//! `ctxgate replay --compare`: the same traces replayed once per row — a baseline sending everything (`off`), then
//! each strategy (`prune`, `hybrid` and `summarize`, summaries simulated for the last two) with the config as
//! loaded and with each group of `--with KEY=VALUE[,KEY=VALUE…]` settings applied onto it — and one table of the
//! figures a user picks settings by. A setting names any config key by its path (`context.target`,
//! `prune.keep_tool_results`, `models."gpt-4o*".context_window`); its value is read as a TOML value (a plain
//! string when it is not one), set onto the loaded config, which is then deserialised and validated again.
//! SHOWN and WHOLE are the working set kept in view (`working_set`), with its counts per trace and step in JSON.

use super::text::{percent, ratio};
use super::working_set::WorkingSet;
use super::{replay_trace_with, Counters, ReplayOptions, ReplayReport, ReplayTotals};
use crate::config::{Config, Strategy};
use serde::Serialize;
use serde_json::Value;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One `--with` group: settings applied together onto the loaded config.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// As given (the row's label).
    pub text: String,
    /// Each setting as a nested table (`{context = {target = 0.4}}`), with its text.
    settings: Vec<(String, toml::Table)>,
}

impl Settings {
    /// Parses `KEY=VALUE[,KEY=VALUE…]` (commas inside quotes, brackets or braces do not separate settings).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut settings = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            let (key, value) = part.split_once('=').ok_or_else(|| {
                format!("{part:?}: a setting is KEY=VALUE (e.g. context.target=0.4)")
            })?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return Err(format!("{part:?}: no key before `=`"));
            }
            let value = format!("v = {value}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(value.to_string()));
            let table = format!("{key} = {value}")
                .parse::<toml::Table>()
                .map_err(|e| {
                    format!(
                        "{part:?}: {key:?} is not a config key path: {}",
                        e.message()
                    )
                })?;
            settings.push((part.to_string(), table));
        }
        if settings.is_empty() {
            return Err(format!("{text:?}: no setting (KEY=VALUE)"));
        }
        Ok(Settings {
            text: text.trim().to_string(),
            settings,
        })
    }

    /// `cfg` with these settings: each set onto it by its path, the result deserialised and validated. `Err`
    /// names the setting that is an unknown key or a bad value, or what validation refused.
    pub fn apply(&self, cfg: &Config) -> Result<Config, String> {
        let base =
            toml::Value::try_from(cfg).map_err(|e| format!("cannot render the config: {e}"))?;
        let mut all = base.clone();
        for (text, setting) in &self.settings {
            // each on its own first, so that the error names the setting at fault
            let mut one = base.clone();
            merge(&mut one, setting);
            one.try_into::<Config>()
                .map_err(|e| format!("{text}: {}", e.message()))?;
            merge(&mut all, setting);
        }
        let config: Config = all
            .try_into()
            .map_err(|e| format!("{}: {}", self.text, e.message()))?;
        config
            .validate()
            .map_err(|e| format!("{}: {}", self.text, e.0.join("; ")))?;
        Ok(config)
    }
}

/// Sets every leaf of `setting` onto `into` (tables merge, anything else replaces).
fn merge(into: &mut toml::Value, setting: &toml::Table) {
    let toml::Value::Table(into) = into else {
        return;
    };
    for (k, v) in setting {
        match (into.get_mut(k), v) {
            (Some(existing @ toml::Value::Table(_)), toml::Value::Table(inner)) => {
                merge(existing, inner)
            }
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `text` split at the commas outside quotes, brackets and braces.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut quote, mut start) = (Vec::new(), 0i32, None, 0);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// One row to run: a strategy over a config.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its label: the strategy, and the settings when there are any.
    pub label: String,
    /// The strategy.
    pub strategy: Strategy,
    /// Summaries are simulated.
    pub summaries: bool,
    /// The `--with` settings (`None`: the config as loaded).
    pub with: Option<String>,
    /// The config it runs with.
    pub config: Config,
}

/// The rows for `cfg` and the `--with` groups: `off`, then `prune`, `hybrid` and `summarize` (summaries
/// simulated for the last two), each with `cfg` and then with each group. `Err` when a group does not apply.
pub fn rows(cfg: &Config, with: &[Settings]) -> Result<Vec<Row>, String> {
    let configs = with
        .iter()
        .map(|w| Ok((Some(w.text.clone()), w.apply(cfg)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let mut rows = vec![Row {
        label: "off".into(),
        strategy: Strategy::Off,
        summaries: false,
        with: None,
        config: cfg.clone(),
    }];
    for strategy in [Strategy::Prune, Strategy::Hybrid, Strategy::Summarize] {
        let summaries = strategy != Strategy::Prune;
        for (with, config) in std::iter::once((None, cfg.clone())).chain(configs.iter().cloned()) {
            let label = match &with {
                Some(w) => format!("{} {w}", strategy.as_str()),
                None => strategy.as_str().to_string(),
            };
            rows.push(Row {
                label,
                strategy,
                summaries,
                with,
                config,
            });
        }
    }
    Ok(rows)
}

/// The figures of one row over every trace.
#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    /// The row's label.
    pub label: String,
    /// The strategy.
    pub strategy: &'static str,
    /// The `--with` settings (`None`: the config as loaded).
    pub with: Option<String>,
    /// Summaries were simulated.
    pub summaries: bool,
    /// The totals over every step of every trace.
    pub totals: ReplayTotals,
    /// The working set kept in view, per trace and step.
    pub traces: Vec<TraceFacts>,
}

/// The working set of one trace's replay in a row (`working_set`): the facts of its answers and how many the
/// requests sent kept in view, over every step (a refused one shows none), and per step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceFacts {
    /// The trace's name.
    pub trace: String,
    /// Facts over every step.
    pub facts: usize,
    /// Of them, shown.
    pub shown: usize,
    /// Of them, with a source output sent whole.
    pub whole: usize,
    /// Steps with at least one fact.
    pub fact_steps: usize,
    /// Of them, those with every fact shown.
    pub fact_steps_shown: usize,
    /// Every step: the index of its answer and its working set.
    pub steps: Vec<StepFacts>,
}

/// One step's working set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepFacts {
    /// Index of the item answering the request.
    pub index: usize,
    /// Its facts, shown, whole and hidden.
    #[serde(flatten)]
    pub working_set: WorkingSet,
}

impl TraceFacts {
    /// The working set of `report` (the replay of the trace named `trace`).
    pub fn of(trace: &str, report: &ReplayReport) -> Self {
        let t = &report.totals;
        TraceFacts {
            trace: trace.to_string(),
            facts: t.facts,
            shown: t.facts_shown,
            whole: t.facts_whole,
            fact_steps: t.fact_steps,
            fact_steps_shown: t.fact_steps_shown,
            steps: report
                .steps
                .iter()
                .map(|s| StepFacts {
                    index: s.index,
                    working_set: s.working_set.clone(),
                })
                .collect(),
        }
    }
}

/// Replays every `(name, trace)` once per row with `opts` (its strategy and summaries set by the row), sharing
/// `counters` between all of them; `done` is called after each trace of each row. The replays run on every core
/// (each is independent and the counters count by content, so the figures do not depend on the order).
pub fn run(
    traces: &[(String, Value)],
    opts: &ReplayOptions,
    rows: &[Row],
    counters: &Counters,
    done: &(dyn Fn() + Sync),
) -> Result<Vec<CompareRow>, String> {
    let row_opts: Vec<ReplayOptions> = rows
        .iter()
        .map(|row| ReplayOptions {
            strategy: Some(row.strategy),
            summaries: opts.summaries || row.summaries,
            ..opts.clone()
        })
        .collect();
    let jobs = rows.len() * traces.len();
    let next = AtomicUsize::new(0);
    let work = || {
        let mut out = Vec::new();
        loop {
            let j = next.fetch_add(1, Ordering::Relaxed);
            if j >= jobs {
                return out;
            }
            let (r, t) = (j / traces.len(), j % traces.len());
            let (name, trace) = &traces[t];
            let report = replay_trace_with(trace, &row_opts[r], &rows[r].config, counters)
                .map_err(|e| format!("{}: {name}: {e}", rows[r].label));
            done();
            out.push((j, report));
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(jobs.max(1));
    let mut results: Vec<(usize, Result<ReplayReport, String>)> = if threads < 2 {
        work()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        })
    };
    if results.len() != jobs {
        return Err("a replay thread failed".into());
    }
    results.sort_by_key(|(j, _)| *j);
    let mut reports = results.into_iter().map(|(_, r)| r);
    let mut out = Vec::with_capacity(rows.len());
    for (row, opts) in rows.iter().zip(&row_opts) {
        let (mut steps, mut facts) = (Vec::new(), Vec::with_capacity(traces.len()));
        for ((name, _), report) in traces.iter().zip(reports.by_ref().take(traces.len())) {
            let report = report?;
            facts.push(TraceFacts::of(name, &report));
            steps.extend(report.steps);
        }
        out.push(CompareRow {
            label: row.label.clone(),
            strategy: row.strategy.as_str(),
            with: row.with.clone(),
            summaries: opts.summaries
                && matches!(row.strategy, Strategy::Hybrid | Strategy::Summarize),
            totals: ReplayTotals::of(&steps),
            traces: facts,
        });
    }
    Ok(out)
}

/// Writes the table: a line per row.
pub fn write_table(out: &mut impl Write, rows: &[CompareRow]) -> io::Result<()> {
    let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(0).max(8);
    writeln!(
        out,
        "{:<width$} {:>6} {:>9} {:>7} {:>8} {:>7} {:>7} {:>6} {:>7} {:>6} {:>6} {:>9} {:>5} {:>6} {:>6}",
        "ROW",
        "SAVED",
        "RATIO>THR",
        "VALID",
        "REJECTED",
        "OVERWIN",
        "STABLE",
        "CACHE",
        "PREDICT",
        "FOLDED",
        "TASK",
        "SUMMARIES",
        "ASKED",
        "SHOWN",
        "WHOLE"
    )?;
    for r in rows {
        let t = &r.totals;
        writeln!(
            out,
            "{:<width$} {:>5.1}% {:>9} {:>7} {:>8} {:>7} {:>7} {:>6} {:>7} {:>6} {:>6} {:>9} {:>5} {:>6} {:>6}",
            r.label,
            t.savings * 100.0,
            ratio(t.mean_ratio_above),
            percent(t.valid_share),
            t.rejected,
            t.over_window,
            percent(t.prefix_stable),
            ratio(t.cache_cost),
            ratio(t.predicted_cost),
            t.folded_steps,
            percent(t.task_whole_share),
            t.summary_calls,
            t.summaries_wanted,
            percent(t.shown_share),
            percent(t.whole_share),
        )?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_set_by_path_onto_the_loaded_config() {
        let mut cfg = Config::default();
        cfg.prune.keep_tool_results += 1;
        let w = Settings::parse("context.threshold=0.6, context.strategy=prune").unwrap();
        let c = w.apply(&cfg).unwrap();
        assert_eq!(c.context.threshold, 0.6);
        assert_eq!(c.context.strategy, Strategy::Prune);
        // everything else as loaded
        assert_eq!(c.prune, cfg.prune);
        let mut expected = cfg.clone();
        expected.context.threshold = 0.6;
        expected.context.strategy = Strategy::Prune;
        assert_eq!(c, expected);
        // nothing set: the loaded config itself (it round-trips)
        let same = Settings::parse("context.threshold=0.6").unwrap();
        let mut back = same.apply(&cfg).unwrap();
        back.context.threshold = cfg.context.threshold;
        assert_eq!(back, cfg);
    }

    #[test]
    fn commas_inside_values_do_not_split() {
        assert_eq!(
            split_top_level(r#"a.b=[1, 2],c.d="x,y", e.f={g = 1, h = 2}"#),
            [r#"a.b=[1, 2]"#, r#"c.d="x,y""#, " e.f={g = 1, h = 2}"]
        );
        let w = Settings::parse(r#"summary.model="a,b""#).unwrap();
        let c = w.apply(&Config::default()).unwrap();
        assert_eq!(c.summary.model.as_deref(), Some("a,b"));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_clear_errors() {
        let cfg = Config::default();
        let e = Settings::parse("context.threshold=0.6,context.nope=1")
            .unwrap()
            .apply(&cfg)
            .unwrap_err();
        assert!(
            e.starts_with("context.nope=1:") && e.contains("nope"),
            "{e}"
        );
        let e = Settings::parse("nosection.key=1")
            .unwrap()
            .apply(&cfg)
            .unwrap_err();
        assert!(e.contains("nosection"), "{e}");
        let e = Settings::parse("context.threshold=high")
            .unwrap()
            .apply(&cfg)
            .unwrap_err();
        assert!(e.starts_with("context.threshold=high:"), "{e}");
        // a value of the right type that validation refuses
        let e = Settings::parse("context.threshold=7")
            .unwrap()
            .apply(&cfg)
            .unwrap_err();
        assert!(e.contains("context.threshold"), "{e}");
        for bad in ["context.threshold", "=1", " , "] {
            assert!(Settings::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rows_are_the_baseline_then_each_strategy_with_each_group() {
        let cfg = Config::default();
        let with = [
            Settings::parse("context.threshold=0.6").unwrap(),
            Settings::parse("prune.keep_tool_results=1").unwrap(),
        ];
        let rows = rows(&cfg, &with).unwrap();
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "off",
                "prune",
                "prune context.threshold=0.6",
                "prune prune.keep_tool_results=1",
                "hybrid",
                "hybrid context.threshold=0.6",
                "hybrid prune.keep_tool_results=1",
                "summarize",
                "summarize context.threshold=0.6",
                "summarize prune.keep_tool_results=1",
            ]
        );
        assert_eq!(rows[2].config.context.threshold, 0.6);
        assert_eq!(rows[3].config.prune.keep_tool_results, 1);
        assert_eq!(rows[1].config, cfg);
        assert!(!rows[1].summaries && rows[4].summaries && rows[7].summaries);
        let bad = [Settings::parse("context.bogus=1").unwrap()];
        assert!(super::rows(&cfg, &bad).unwrap_err().contains("bogus"));
    }
}
