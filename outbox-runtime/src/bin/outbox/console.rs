//! `outbox console`: the operator console in the browser (`outbox_runtime::console`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use outbox_runtime::console::{
    redact_keys, Console, ConsoleConfig, DEFAULT_BIND, DEFAULT_COUNT_CAP, DEFAULT_PAYLOAD_LIMIT,
};
use outbox_runtime::sqlx::PgPool;
use outbox_runtime::{CancellationToken, Outbox};

use crate::{fail, Fail};

#[derive(Args)]
pub(crate) struct ConsoleArgs {
    /// Address to serve on. Any address but a loopback one needs a token.
    #[arg(long, default_value = DEFAULT_BIND)]
    bind: SocketAddr,
    /// The token every request must carry (at least 16 characters). Never printed.
    #[arg(
        long = "token",
        env = "OUTBOX_CONSOLE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        hide = true
    )]
    token: Option<String>,
    /// A file whose first line is the token (or set OUTBOX_CONSOLE_TOKEN).
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Make up a token and print the login URL once, on standard output.
    #[arg(long, conflicts_with_all = ["token", "token_file"])]
    generate_token: bool,
    /// Refuse every change (retry, discard): on the server, not just in the page.
    #[arg(long)]
    read_only: bool,
    /// Show payloads on event pages (hidden by default), cut at --payload-limit bytes.
    #[arg(long)]
    show_payloads: bool,
    /// The largest payload shown, in bytes.
    #[arg(long, default_value_t = DEFAULT_PAYLOAD_LIMIT, requires = "show_payloads")]
    payload_limit: usize,
    /// Hide the value of this key wherever it is in a payload (repeatable).
    #[arg(long = "redact", value_name = "KEY", requires = "show_payloads")]
    redact: Vec<String>,
    /// Also show this inbox table (its consumers, records, parked messages).
    #[arg(long, value_name = "TABLE")]
    inbox_table: Option<String>,
    /// Schema of the inbox table.
    #[arg(long, default_value = "public", requires = "inbox_table")]
    inbox_schema: String,
    /// Counts on the overview stop at this many rows per state.
    #[arg(long, default_value_t = DEFAULT_COUNT_CAP)]
    count_cap: u32,
    /// Who the audit records for actions taken here.
    #[arg(long, default_value = "console")]
    actor: String,
    /// Another Host name the console answers to (behind a proxy, or by a DNS name).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    hosts: Vec<String>,
    /// Kafka bootstrap servers: show each inbox consumer's lag (its group's committed
    /// offsets against the partitions' ends, read at most every 5 s). Without it, no lag.
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: Option<String>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9188): the console's
    /// failed background reads (outbox_console_read_errors_total). Metrics only: no token.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
}

pub(crate) async fn run(outbox: &Outbox, pool: PgPool, args: ConsoleArgs) -> Result<ExitCode, Fail> {
    crate::setup::init_logs();
    outbox.ops().check_migrated(&pool).await?;
    let token = match (&args.token_file, args.generate_token) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| fail(2, format!("--token-file {}: {e}", path.display())))?;
            Some(text.lines().next().unwrap_or("").trim().to_owned())
        }
        (None, true) => Some(outbox_runtime::console::generate_token()),
        (None, false) => args.token.clone(),
    };
    let mut config = ConsoleConfig::default()
        .bind(args.bind)
        .read_only(args.read_only)
        .show_payloads(args.show_payloads, args.payload_limit)
        .count_cap(args.count_cap)
        .actor(args.actor);
    if let Some(token) = token {
        config = config.token(token);
    }
    if !args.redact.is_empty() {
        config = config.redactor(redact_keys(args.redact));
    }
    if let Some(table) = &args.inbox_table {
        config = config.inbox(&args.inbox_schema, table);
    }
    for host in args.hosts {
        config = config.allow_host(host);
    }
    if let Some(brokers) = args.brokers {
        config = config.lag(outbox_runtime::inbox::LagReader::new(brokers));
    }
    // Refused (a wide bind without a token) before anything listens.
    Console::new(pool.clone(), outbox, config.clone())?;
    if let Some(addr) = args.metrics_addr {
        outbox_runtime::metrics::install_prometheus(addr)?;
        eprintln!("outbox: metrics on http://{addr}/metrics");
    }
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|e| fail(3, format!("the console cannot listen on {}: {e}", args.bind)))?;
    // The port it got, when asked for any (port 0).
    let bound = listener.local_addr().map_err(|e| fail(3, format!("the console's listener: {e}")))?;
    let console = Console::new(pool, outbox, config.bind(bound))?;
    // Once, to the operator: the login URL holds the token. Logs never carry it.
    println!("outbox console: {}", console.url());
    let stop = CancellationToken::new();
    outbox_runtime::signal::cancel_on_signal(stop.clone());
    console.serve(listener, stop).await?;
    Ok(ExitCode::SUCCESS)
}
