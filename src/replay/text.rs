//! The replay as text: a line per step with the totals of a trace, and a table of several traces.

use super::{Outcome, ReplayReport, ReplayStep, ReplayTotals};
use std::io::{self, Write};

/// Writes one report as text: a line per step, then the totals.
pub fn write_text(out: &mut impl Write, name: &str, r: &ReplayReport) -> io::Result<()> {
    writeln!(
        out,
        "{name}: {} trace, model {} ({}), dialect {}, window {}, strategy {}{}, threshold {} tokens",
        r.format,
        r.model,
        r.encoding,
        r.dialect,
        r.window,
        r.strategy,
        if r.summaries {
            " with simulated summaries"
        } else {
            ""
        },
        r.threshold_tokens
    )?;
    for s in &r.steps {
        let what = match s.outcome {
            Outcome::Forward => "forwarded".to_string(),
            Outcome::Reject => String::new(),
            Outcome::Rewrite => describe(s),
        };
        let verdict = match (&s.problem, s.outcome) {
            (None, _) => "valid".to_string(),
            (Some(p), Outcome::Reject) => format!("REJECTED ({p})"),
            (Some(p), _) => format!("INVALID ({p})"),
        };
        let wanted = s
            .wanted_summary
            .map_or_else(String::new, |n| format!("  (summary of 1-{n} wanted)"));
        let flags = [
            (s.prefix_stable == Some(false), "  PREFIX CHANGED"),
            (s.task_whole == Some(false), "  TASK CUT"),
            (s.over_window, "  OVER WINDOW"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| *f)
        .collect::<String>();
        let ws = &s.working_set;
        let hidden = if ws.shown < ws.facts {
            format!("  HIDDEN {}/{} facts", ws.facts - ws.shown, ws.facts)
        } else {
            String::new()
        };
        writeln!(
            out,
            "  step {:>4}  client {:>7}  upstream {:>7}  {:>4.2}{}  cached {:>3.0}%  {what}  {verdict}{wanted}{flags}{hidden}",
            s.index,
            s.client_tokens,
            s.upstream_tokens,
            s.upstream_tokens as f64 / s.client_tokens.max(1) as f64,
            if s.above_threshold { "*" } else { " " },
            100.0 * s.wire_cached as f64 / s.wire_tokens.max(1) as f64,
        )?;
    }
    let t = &r.totals;
    writeln!(
        out,
        "  total: {} steps, {} above threshold (*), {} rewritten ({} summary-free), {} rejected, {} invalid, \
         {} over the window; tokens {} -> {} (saved {:.1}%); mean upstream/client above threshold: {}; \
         prefix-stable pairs {}/{} ({}); cache cost {}; task whole in {}/{} rewrites ({}); {} summary call(s); \
         facts shown {}/{} ({}), whole {} ({}), steps with every fact shown {}/{}",
        t.steps,
        t.above_threshold,
        t.rewritten,
        t.rewritten - t.summarized,
        t.rejected,
        t.invalid,
        t.over_window,
        t.client_tokens,
        t.upstream_tokens,
        t.savings * 100.0,
        ratio(t.mean_ratio_above),
        t.prefix_stable_pairs,
        t.prefix_pairs,
        percent(t.prefix_stable),
        ratio(t.cache_cost),
        t.task_whole,
        t.rewritten,
        percent(t.task_whole_share),
        t.summary_calls,
        t.facts_shown,
        t.facts,
        percent(t.shown_share),
        t.facts_whole,
        percent(t.whole_share),
        t.fact_steps_shown,
        t.fact_steps,
    )
}

/// What a rewrite did, in a few words.
fn describe(s: &ReplayStep) -> String {
    let parts: Vec<String> = [
        (s.cleared_results, "results cleared"),
        (s.pruned_loops, "loops pruned"),
        (s.dropped_loops, "loops dropped"),
        (s.dropped_messages, "messages dropped"),
        (s.pruned_calls, "calls recallable"),
        (s.summary_upto, "messages summarized"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    format!("rewritten [{}]: {}", s.stages.join("+"), parts.join(", "))
}

/// A ratio with three decimals, `-` when there is none.
pub(super) fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"))
}

/// A share as a percentage with one decimal, `-` when there is none.
pub(super) fn percent(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{:.1}%", r * 100.0))
}

/// Writes a table with one row per named report and an overall row (its ratio is the mean over every step above
/// the threshold, all files pooled).
pub fn write_summary(out: &mut impl Write, reports: &[(String, ReplayReport)]) -> io::Result<()> {
    let width = reports
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(0)
        .max(7);
    writeln!(
        out,
        "{:<width$} {:>5} {:>5} {:>5} {:>6} {:>7} {:>8} {:>7} {:>9} {:>9} {:>6} {:>9} {:>7} {:>6} {:>6}",
        "FILE",
        "STEPS",
        "ABOVE",
        "REWR",
        "NO-SUM",
        "INVALID",
        "REJECTED",
        "OVERWIN",
        "CLIENT",
        "UPSTREAM",
        "SAVED",
        "RATIO>THR",
        "STABLE",
        "CACHE",
        "TASK"
    )?;
    let overall = ReplayTotals::of(reports.iter().flat_map(|(_, r)| &r.steps));
    let rows = reports.iter().map(|(n, r)| (n.as_str(), &r.totals));
    for (name, t) in rows.chain([("overall", &overall)]) {
        writeln!(
            out,
            "{:<width$} {:>5} {:>5} {:>5} {:>6} {:>7} {:>8} {:>7} {:>9} {:>9} {:>5.1}% {:>9} {:>7} {:>6} {:>6}",
            name,
            t.steps,
            t.above_threshold,
            t.rewritten,
            t.rewritten - t.summarized,
            t.invalid,
            t.rejected,
            t.over_window,
            t.client_tokens,
            t.upstream_tokens,
            t.savings * 100.0,
            ratio(t.mean_ratio_above),
            percent(t.prefix_stable),
            ratio(t.cache_cost),
            percent(t.task_whole_share),
        )?;
    }
    Ok(())
}
