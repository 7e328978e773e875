//! The `ctxgate` command line: `serve`, `check-config`, `mock-upstream`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ctxgate::config::{Config, LogFormat};
use std::io::Write;
use std::path::PathBuf;

/// ctxgate — a transparent OpenAI-compatible gateway that gives any AI agent a long memory.
///
/// Point your agent's base URL at it (OPENAI_BASE_URL=http://127.0.0.1:8787/v1) and change nothing else.
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
        /// Upstream base URL; overrides `[upstream] base_url`.
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// Log format; overrides `[server] log_format`.
        #[arg(long, value_enum, value_name = "FORMAT")]
        log_format: Option<LogFormat>,
    },
    /// Validate a config file and print the effective config, secrets masked.
    CheckConfig {
        /// Config file to check.
        path: PathBuf,
    },
    /// Run the in-repo mock OpenAI upstream (for trying ctxgate and for client tests; never calls a provider).
    MockUpstream {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:8788", value_name = "ADDR")]
        listen: String,
    },
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CTXGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            config,
            listen,
            upstream,
            log_format,
        } => {
            let mut cfg = Config::load(config.as_deref())?;
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            if let Some(u) = upstream {
                cfg.upstream.base_url = u;
            }
            if let Some(f) = log_format {
                cfg.server.log_format = f;
            }
            cfg.validate()?;
            init_logging(cfg.server.log_format);
            let addr = cfg.listen_addr()?;
            let upstream_url = cfg.upstream.base_url.clone();
            let state = ctxgate::app::AppState::new(cfg)?;
            let server = ctxgate::server::Server::bind(state, addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            tracing::info!(listen = %server.local_addr()?, upstream = %upstream_url, "ctxgate listening");
            server.run(ctxgate::server::shutdown_signal()).await?;
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
            write!(out, "{}", cfg.masked().to_toml())?;
            Ok(())
        }
        Command::MockUpstream { listen } => {
            init_logging(LogFormat::Text);
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
