//! The `ctxgate` command line: `serve`, `check-config`, `sessions`, `mock-upstream`, `replay`.

use anyhow::Context;

/// mimalloc: the gateway allocates and frees many small buffers per request across threads, where it is markedly
/// cheaper than glibc's allocator (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Parser, Subcommand};
use ctxgate::config::{Config, LogFormat, Strategy};
use ctxgate::dialect::Dialect;
use ctxgate::replay::compare::{self, Settings};
use ctxgate::replay::{Counters, ReplayOptions, ReplayReport, ReplayTotals};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

/// ctxgate — a transparent gateway that gives any AI agent a long memory.
///
/// It speaks OpenAI chat completions (/v1/chat/completions), Anthropic Messages (/v1/messages) and the OpenAI
/// Responses API (/v1/responses); every other /v1/* request passes through. Point your agent's base URL at it
/// (OPENAI_BASE_URL=http://127.0.0.1:8787/v1, ANTHROPIC_BASE_URL=http://127.0.0.1:8787) and change nothing else.
/// While it runs: the session inspector at http://127.0.0.1:8787/ui/, Prometheus metrics at /metrics.
/// Config keys can be overridden from the environment as CTXGATE_<SECTION>__<KEY>.
#[derive(Parser, Debug)]
#[command(name = "ctxgate", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway (embedded defaults when no config is given).
    Serve {
        /// Config file (TOML); see config/ctxgate.toml for every key.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// Listen address; overrides `[server] listen`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Upstream base URL; overrides `[upstream] base_url` (the OpenAI APIs).
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// Anthropic upstream base URL (`/v1/messages`); overrides `[anthropic] base_url`, e.g.
        /// `http://127.0.0.1:8788/v1` for `ctxgate mock-upstream`.
        #[arg(long, value_name = "URL")]
        anthropic_upstream: Option<String>,
        /// Gemini API base URL, without a version (`/v1beta/models/…`); overrides `[gemini] base_url`, e.g.
        /// `http://127.0.0.1:8788` for `ctxgate mock-upstream`.
        #[arg(long, value_name = "URL")]
        gemini_upstream: Option<String>,
        /// Log format; overrides `[server] log_format`.
        #[arg(long, value_enum, value_name = "FORMAT")]
        log_format: Option<LogFormat>,
    },
    /// Validate a config file and print the effective config, secrets masked.
    CheckConfig {
        /// Config file to check.
        path: PathBuf,
    },
    /// Inspect or delete stored sessions (reads the same store as the gateway).
    Sessions {
        #[command(subcommand)]
        action: SessionsAction,
        /// Config file naming the store.
        #[arg(long, value_name = "PATH", global = true)]
        config: Option<PathBuf>,
    },
    /// Print the configuration reference (Markdown, from the config structs' doc comments):
    /// `ctxgate config-reference > docs/configuration.md`.
    ConfigReference,
    /// Run the in-repo mock upstream: OpenAI, Anthropic and Gemini APIs (for trying ctxgate and for client tests;
    /// never calls a provider).
    MockUpstream {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:8788", value_name = "ADDR")]
        listen: String,
    },
    /// Replay recorded conversations (`../shared/traces/*.json`) through the context planner, offline: per turn
    /// the tokens the client sent and those that would go upstream, what was rewritten, whether the request
    /// stays valid, and what a provider's prompt cache would make of the requests sent. With `--compare`, one
    /// table of every strategy (and `--with` settings) over the same traces. Exits non-zero if any request would
    /// be invalid.
    Replay {
        /// Trace files: chat completions `{"id", "model", "tools", "messages": [...]}`, or an Anthropic Messages
        /// (`system`, `messages` of content blocks, `tools` with `input_schema`) or Responses (`instructions`,
        /// `input` items, `tools`) conversation; the format is detected.
        #[arg(required = true, value_name = "TRACE.json")]
        traces: Vec<PathBuf>,
        /// Context window in tokens (default: the model table's window for the trace's model).
        #[arg(long, value_name = "N")]
        window: Option<u64>,
        /// Strategy (default: `[context] strategy`, hybrid).
        #[arg(long, conflicts_with = "compare", value_parser = parse_strategy, value_name = "off|prune|summarize|hybrid")]
        strategy: Option<Strategy>,
        /// Model name for the tokenizer and the window (default: the first word of the trace's `model`).
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// Simulate summaries (strategies summarize and hybrid; on anyway when the config sets `summary.model`):
        /// every summary the planner asks for is taken as written, with `summary.max_tokens` tokens, by the next
        /// turn.
        #[arg(long)]
        summaries: bool,
        /// Config file for `[context]`, `[prune]`, `[recall]`, `[summary]` and `[models]`.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// Print the reports (or the `--compare` table) as JSON.
        #[arg(long)]
        json: bool,
        /// The client's dialect (default: the trace's own): a chat trace replays as `chat`, or as `anthropic`,
        /// `responses` or `gemini` (each request converted to the Anthropic Messages / Responses / Gemini request it
        /// stands for and planned as the gateway plans one); an Anthropic, Responses or Gemini trace only in its
        /// own dialect.
        #[arg(long, value_parser = parse_dialect, value_name = "chat|anthropic|responses|gemini")]
        dialect: Option<Dialect>,
        /// Replay the traces once per row and print one table: `off` (sending everything), then `prune`, `hybrid`
        /// and `summarize` (summaries simulated for both), each with the config as loaded and with each `--with`.
        #[arg(long)]
        compare: bool,
        /// With `--compare`: a row per strategy with these settings applied onto the loaded config, by config path
        /// (`--with context.target=0.4,prune.keep_tool_results=2`); repeat for more rows.
        #[arg(long = "with", requires = "compare", value_parser = parse_settings, value_name = "KEY=VALUE[,KEY=VALUE…]")]
        with: Vec<Settings>,
        /// Write every replayed request to this file as JSON Lines, one object per request: `trace` (the file),
        /// `index` (the step), `client` (the body the client sent) and `sent` (the body that would go upstream:
        /// the client's when forwarded, `null` when refused). For checking the bodies with another tool.
        #[arg(long, conflicts_with = "compare", value_name = "PATH")]
        requests: Option<PathBuf>,
    },
}

fn parse_dialect(s: &str) -> Result<Dialect, String> {
    Dialect::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Dialect::ALL.iter().map(|d| d.as_str()).collect();
        format!("unknown dialect {s:?} ({})", names.join(", "))
    })
}

fn parse_settings(s: &str) -> Result<Settings, String> {
    Settings::parse(s)
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s)
        .ok_or_else(|| format!("unknown strategy {s:?} (off, prune, summarize, hybrid)"))
}

#[derive(Subcommand, Debug)]
enum SessionsAction {
    /// Sessions by newest activity.
    List {
        /// How many to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// How many to skip.
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// One session with its full history, as JSON.
    Show {
        /// Session id (as in `x-ctxgate-session`).
        id: String,
    },
    /// Delete a session.
    Delete {
        /// Session id.
        id: String,
    },
    /// Write a session as JSON Lines (a header line, then its nodes, records and turns).
    Export {
        /// Session id.
        id: String,
        /// Write to this file instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Read a session written by `export` (or `GET /admin/sessions/{id}/export`) into the store.
    Import {
        /// The export file (`-`: standard input).
        file: PathBuf,
        /// Overwrite the session when it exists (else refused).
        #[arg(long)]
        replace: bool,
    },
    /// Copy every session (and the tenant secret) from one store to another, verified by counts; run it with the
    /// gateways stopped. Stores: `sqlite:PATH`, `redis://host:port/db` (or `rediss://…`; keys under the
    /// configured `store.redis_prefix`), or `config` (the store of --config, e.g. a Redis Cluster).
    Migrate {
        /// The store to copy from.
        #[arg(long, value_name = "STORE")]
        from: String,
        /// The store to copy into (empty, or holding the same tenant secret).
        #[arg(long, value_name = "STORE")]
        to: String,
    },
}

async fn sessions_cmd(config: Option<PathBuf>, action: SessionsAction) -> anyhow::Result<()> {
    let cfg = Config::load(config.as_deref())?;
    if let SessionsAction::Migrate { from, to } = &action {
        use ctxgate::session::migrate;
        let from = migrate::store_spec(from, &cfg.store).map_err(anyhow::Error::msg)?;
        let to = migrate::store_spec(to, &cfg.store).map_err(anyhow::Error::msg)?;
        if from.backend == ctxgate::config::StoreBackend::Sqlite && !from.path.exists() {
            anyhow::bail!("no store at {}", from.path.display());
        }
        let done = migrate::migrate(&from, &to)
            .await
            .map_err(anyhow::Error::msg)?;
        writeln!(
            std::io::stdout().lock(),
            "migrated {} session(s): {} message(s), {} record(s), {} turn(s); verified",
            done.sessions,
            done.nodes,
            done.records,
            done.turns
        )?;
        return Ok(());
    }
    if cfg.store.backend == ctxgate::config::StoreBackend::Memory {
        anyhow::bail!("store.backend is \"memory\": nothing is persisted for this command to read");
    }
    let creates = matches!(action, SessionsAction::Import { .. });
    if cfg.store.backend == ctxgate::config::StoreBackend::Sqlite
        && !creates
        && !cfg.store.path.exists()
    {
        anyhow::bail!("no store at {} (store.path)", cfg.store.path.display());
    }
    // Commands that write lock a SQLite file (refused while a gateway holds it); those that read do not.
    let writes = matches!(
        action,
        SessionsAction::Delete { .. } | SessionsAction::Import { .. }
    );
    let store = if writes {
        ctxgate::store::open(&cfg.store)?
    } else {
        ctxgate::store::open_reader(&cfg.store)?
    };
    let sessions = ctxgate::session::Sessions::new(store, cfg.store.cache_max_bytes)
        .with_neutral_history(ctxgate::dialect::Dialect::history_as_neutral);
    let mut out = std::io::stdout().lock();
    match action {
        SessionsAction::List { limit, offset } => {
            let (list, total) = sessions.list(limit, offset).await?;
            writeln!(
                out,
                "{:<48} {:>8} {:>9} {:>20}",
                "ID", "MESSAGES", "~TOKENS", "LAST ACTIVE (unix)"
            )?;
            for m in &list {
                writeln!(
                    out,
                    "{:<48} {:>8} {:>9} {:>20}",
                    m.id, m.message_count, m.token_estimate, m.last_active
                )?;
            }
            writeln!(out, "{} of {total} session(s)", list.len())?;
        }
        SessionsAction::Show { id } => match sessions.view(&id).await? {
            Some(v) => writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?,
            None => anyhow::bail!("no session {id:?}"),
        },
        SessionsAction::Delete { id } => {
            if sessions.delete(&id).await? {
                writeln!(out, "deleted {id}")?;
            } else {
                anyhow::bail!("no session {id:?}");
            }
        }
        SessionsAction::Export { id, out: file } => {
            let Some(body) = ctxgate::session::export::export_session(&sessions, &id).await? else {
                anyhow::bail!("no session {id:?}");
            };
            match file {
                Some(f) => std::fs::write(&f, body)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", f.display()))?,
                None => out.write_all(&body)?,
            }
        }
        SessionsAction::Import { file, replace } => {
            use std::io::Read;
            let mut body = Vec::new();
            if file.as_os_str() == "-" {
                std::io::stdin().read_to_end(&mut body)?;
            } else {
                body = std::fs::read(&file)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            }
            use ctxgate::session::export;
            let parsed = export::parse(&body)?;
            let done = export::import(&sessions, parsed, replace).await?;
            writeln!(
                out,
                "imported {}: {} message(s), {} record(s), {} turn(s)",
                done.id, done.nodes, done.records, done.turns
            )?;
        }
        SessionsAction::Migrate { .. } => {}
    }
    Ok(())
}

/// One file's replay, as printed by `replay --json`.
#[derive(Serialize)]
struct FileReport<'a> {
    file: String,
    #[serde(flatten)]
    report: &'a ReplayReport,
}

/// A progress bar on stderr (drawn only on a terminal), so stdout stays the report.
fn progress_bar(len: u64) -> indicatif::ProgressBar {
    let progress = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len}  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress
}

/// Each trace file read as JSON, named by its stem.
fn read_traces(traces: &[PathBuf]) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    traces
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let trace = serde_json::from_str(&text)
                .with_context(|| format!("{}: not JSON", path.display()))?;
            let name = path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            Ok((name, trace))
        })
        .collect()
}

fn replay_cmd(
    traces: &[PathBuf],
    opts: &ReplayOptions,
    config: Option<PathBuf>,
    json: bool,
    requests: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let cfg = Config::load(config.as_deref())?;
    let files = read_traces(traces)?;
    let mut reports = Vec::with_capacity(files.len());
    let counters = Counters::default();
    let progress = progress_bar(files.len() as u64);
    let mut lines = Vec::new();
    for (name, trace) in &files {
        progress.set_message(name.clone());
        let report = if requests.is_some() {
            let (report, sent) =
                ctxgate::replay::replay_requests_with(trace, opts, &cfg, &counters)
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            for r in sent {
                lines.extend(request_line(name, &r)?);
                lines.push(b'\n');
            }
            report
        } else {
            ctxgate::replay::replay_trace_with(trace, opts, &cfg, &counters)
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?
        };
        reports.push((name.clone(), report));
        progress.inc(1);
    }
    progress.finish_and_clear();
    if let Some(path) = requests {
        std::fs::write(path, &lines).with_context(|| format!("writing {}", path.display()))?;
    }
    let overall = ReplayTotals::of(reports.iter().flat_map(|(_, r)| &r.steps));
    let mut out = std::io::stdout().lock();
    if json {
        let files: Vec<FileReport> = reports
            .iter()
            .zip(traces)
            .map(|((_, report), path)| FileReport {
                file: path.display().to_string(),
                report,
            })
            .collect();
        let doc = serde_json::json!({"files": files, "overall": overall});
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        for (name, report) in &reports {
            ctxgate::replay::write_text(&mut out, name, report)?;
        }
        if reports.len() > 1 {
            writeln!(out)?;
            ctxgate::replay::write_summary(&mut out, &reports)?;
        }
    }
    if overall.invalid > 0 {
        anyhow::bail!("{} request(s) would be sent invalid", overall.invalid);
    }
    Ok(())
}

/// One line of `replay --requests`: the trace, the step and both bodies.
fn request_line(trace: &str, r: &ctxgate::replay::ReplayedRequest) -> anyhow::Result<Vec<u8>> {
    let client: serde_json::Value = serde_json::from_slice(&r.client_body)?;
    let sent: serde_json::Value = match &r.upstream_body {
        Some(b) => serde_json::from_slice(b)?,
        None => serde_json::Value::Null,
    };
    let line =
        serde_json::json!({"trace": trace, "index": r.index, "client": client, "sent": sent});
    Ok(serde_json::to_vec(&line)?)
}

/// `replay --compare`: every row over every trace, one table.
fn compare_cmd(
    traces: &[PathBuf],
    opts: &ReplayOptions,
    config: Option<PathBuf>,
    with: &[Settings],
    json: bool,
) -> anyhow::Result<()> {
    let cfg = Config::load(config.as_deref())?;
    let rows = compare::rows(&cfg, with).map_err(|e| anyhow::anyhow!("--with {e}"))?;
    let files = read_traces(traces)?;
    let counters = Counters::default();
    let progress = progress_bar((rows.len() * files.len()) as u64);
    progress.set_message(format!("{} rows", rows.len()));
    let results = compare::run(&files, opts, &rows, &counters, &|| progress.inc(1))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    progress.finish_and_clear();
    let mut out = std::io::stdout().lock();
    if json {
        let files: Vec<String> = traces.iter().map(|p| p.display().to_string()).collect();
        let doc = serde_json::json!({"files": files, "rows": results});
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        compare::write_table(&mut out, &results)?;
    }
    let invalid: usize = results.iter().map(|r| r.totals.invalid).sum();
    if invalid > 0 {
        anyhow::bail!("{invalid} request(s) would be sent invalid");
    }
    Ok(())
}

/// Logs go to stderr through a writer thread that writes them in batches (see [`ctxgate::logging`]), so a request
/// never waits on the terminal or pipe, and every line is kept: when the output falls behind, logging waits rather
/// than drops. Colours only on a terminal (and not with `NO_COLOR`): a log file or collector gets plain text. The
/// guard writes what is left when dropped, at exit.
fn init_logging(format: LogFormat) -> anyhow::Result<ctxgate::logging::LogGuard> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CTXGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = ctxgate::logging::sink(std::io::stderr(), "ctxgate-log")
        .context("cannot start the log writer thread")?;
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_timer(ctxgate::logging::Clock)
        .with_writer(writer);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text if colour => builder.init(),
        // The same lines as the default field formatter's without colours, written at a fraction of its cost.
        LogFormat::Text => builder.fmt_fields(ctxgate::logging::PlainFields).init(),
    }
    Ok(guard)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = ctxgate::alloc::hook(&mut tokio::runtime::Builder::new_multi_thread())
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    ctxgate::alloc::start(rt.handle().clone())
        .context("cannot start the allocator's housekeeping thread")?;
    rt.block_on(run(cli))
}

/// Builds the tokenizer's tables on a thread of its own (`ctxgate-tokenizer`), so that the first conversation large
/// enough to be counted does not wait for them (requests that need one meanwhile wait for it as they would have);
/// the tiktoken tables they are read from are then handed back to the system. A table that fails to load is
/// logged (its counts are then estimated from bytes); a thread that cannot start is logged too, and counting
/// builds the tables on first use.
fn load_tokenizer_in_background() {
    let spawned = std::thread::Builder::new()
        .name("ctxgate-tokenizer".into())
        .spawn(|| {
            let started = std::time::Instant::now();
            let loaded = ctxgate::context::tokens::load_tables();
            ctxgate::alloc::collect();
            if loaded.contains(&false) {
                tracing::warn!(
                    ?loaded,
                    "tokens: an encoding's tables failed to load; its counts are estimated from bytes"
                );
            } else {
                tracing::debug!(
                    ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "tokens: encodings loaded"
                );
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "tokens: cannot load the encodings ahead; they load on first use");
    }
}

/// Reloads the config on every SIGHUP; a refused file is logged (every problem) and changes nothing.
async fn reload_on_sighup(state: std::sync::Arc<ctxgate::app::AppState>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("config: cannot listen for SIGHUP; reload with POST /admin/config/reload");
        return;
    };
    while hup.recv().await.is_some() {
        tracing::info!("config: SIGHUP received, reloading");
        let _ = state.reload_config().await;
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            upstream,
            anthropic_upstream,
            gemini_upstream,
            log_format,
        } => {
            let mut cfg = Config::load(config.as_deref())?;
            let loaded = cfg.clone();
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            if let Some(u) = upstream {
                cfg.upstream.base_url = u;
            }
            if let Some(u) = anthropic_upstream {
                cfg.anthropic.base_url = u;
            }
            if let Some(u) = gemini_upstream {
                cfg.gemini.base_url = u;
            }
            if let Some(f) = log_format {
                cfg.server.log_format = f;
            }
            let warnings = cfg.warnings();
            cfg.validate()?;
            let _log = init_logging(cfg.server.log_format)?;
            let addr = cfg.listen_addr()?;
            let upstream_url = cfg.upstream.base_url.clone();
            let anthropic_url = cfg.anthropic.base_url.clone();
            let gemini_url = cfg.gemini.base_url.clone();
            let state = ctxgate::app::AppState::new(cfg)?;
            load_tokenizer_in_background();
            state.reload.set(config.clone(), loaded);
            // SIGHUP reloads the config's reloadable sections (see ctxgate::reload).
            tokio::spawn(reload_on_sighup(state.clone()));
            let server = ctxgate::server::Server::bind(state, addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            for w in warnings {
                tracing::warn!("config: {w}");
            }
            let bound = server.local_addr()?;
            tracing::info!(
                listen = %bound,
                upstream = %upstream_url,
                anthropic_upstream = %anthropic_url,
                gemini_upstream = %gemini_url,
                "ctxgate listening"
            );
            tracing::info!("inspector: http://{bound}/ui/");
            match server.metrics_addr() {
                Some(m) => {
                    tracing::info!("metrics: http://{bound}/metrics (and http://{m}/metrics)")
                }
                None => tracing::info!("metrics: http://{bound}/metrics"),
            }
            // The first SIGTERM/SIGINT starts the shutdown (grace, then drain) and `run` returns once it is done;
            // a second one exits at once, giving up what is still being drained.
            let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
            let run = server.run(async move {
                ctxgate::server::shutdown_signal().await;
                let _ = first_tx.send(());
            });
            let second = async move {
                if first_rx.await.is_ok() {
                    ctxgate::server::shutdown_signal().await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                r = run => r?,
                () = second => {
                    tracing::warn!("second shutdown signal: exiting without finishing the drain");
                    anyhow::bail!("interrupted during shutdown");
                }
            }
            tracing::info!("ctxgate stopped");
            Ok(())
        }
        Command::CheckConfig { path } => {
            let cfg = Config::load(Some(&path))?;
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "# {}: valid. Effective configuration (secrets masked):",
                path.display()
            )?;
            for w in cfg.warnings() {
                writeln!(out, "# warning: {w}")?;
            }
            write!(out, "{}", cfg.masked().to_toml())?;
            Ok(())
        }
        Command::Sessions { action, config } => sessions_cmd(config, action).await,
        Command::Replay {
            traces,
            window,
            strategy,
            model,
            summaries,
            config,
            json,
            dialect,
            compare,
            with,
            requests,
        } => {
            let opts = ReplayOptions {
                window,
                strategy,
                model,
                summaries,
                dialect,
            };
            if compare {
                compare_cmd(&traces, &opts, config, &with, json)
            } else {
                replay_cmd(&traces, &opts, config, json, requests.as_deref())
            }
        }
        Command::ConfigReference => {
            let mut out = std::io::stdout().lock();
            out.write_all(ctxgate::config::reference::render().as_bytes())?;
            Ok(())
        }
        Command::MockUpstream { listen } => {
            let _log = init_logging(LogFormat::Text)?;
            let addr = listen
                .parse()
                .with_context(|| format!("bad address {listen}"))?;
            let mock = ctxgate::mock::MockUpstream::start_on(addr).await?;
            tracing::info!(base_url = %mock.base_url(), "mock upstream listening");
            ctxgate::server::shutdown_signal().await;
            Ok(())
        }
    }
}
