//! `outbox broker`: a development Kafka broker in this process (librdkafka's mock
//! cluster, no install), for relay and consumer processes started by hand.
//!
//! Not for production and not for transactions: it keeps at most 5 MB per partition in
//! memory and forgets everything when it stops.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use outbox_runtime::rdkafka::mocking::MockCluster;

#[derive(Args)]
pub(crate) struct BrokerArgs {
    /// A topic to create, as NAME or NAME:PARTITIONS (default partitions: 6). Repeatable;
    /// other topics are created when a client's metadata request allows it (librdkafka's
    /// producer does by default): for a missing-topic drill, run the relay with
    /// --kafka-setting allow.auto.create.topics=false.
    #[arg(long = "topic", value_name = "NAME[:PARTITIONS]")]
    topics: Vec<String>,
    /// Number of brokers in the cluster.
    #[arg(long, default_value_t = 1)]
    brokers: i32,
    /// Also write the bootstrap address to this file (for scripts).
    #[arg(long, value_name = "PATH")]
    addr_file: Option<PathBuf>,
    /// The outbox's global flags, which a broker has no use for: an argument of the same
    /// id here keeps clap from copying the global one into this command, so that `outbox
    /// broker --help` lists only the broker's own flags. Accepted and ignored.
    #[command(flatten)]
    unused: Unused,
}

/// See [`BrokerArgs::unused`].
#[derive(Args)]
struct Unused {
    #[arg(long, hide = true)]
    database_url: Option<String>,
    #[arg(long, hide = true)]
    schema: Option<String>,
    #[arg(long, hide = true)]
    table: Option<String>,
    #[arg(long, hide = true)]
    capacity_rows: Option<u64>,
    #[arg(long, hide = true)]
    capacity_bytes: Option<u64>,
}

fn parse_topic(spec: &str) -> Result<(&str, i32), String> {
    let (name, partitions) = match spec.split_once(':') {
        Some((name, n)) => {
            (name, n.parse::<i32>().map_err(|_| format!("--topic {spec:?}: partitions must be a number"))?)
        }
        None => (spec, 6),
    };
    if name.is_empty() || partitions < 1 {
        return Err(format!("--topic {spec:?}: expected NAME or NAME:PARTITIONS with at least 1 partition"));
    }
    Ok((name, partitions))
}

pub(crate) async fn run(args: BrokerArgs) -> ExitCode {
    let topics: Vec<(&str, i32)> = match args.topics.iter().map(|t| parse_topic(t)).collect() {
        Ok(topics) => topics,
        Err(message) => {
            eprintln!("outbox: {message}");
            return ExitCode::from(2);
        }
    };
    // A file left by an earlier run would hand a waiting script a dead address.
    if let Some(path) = &args.addr_file {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                eprintln!("outbox: {}: cannot remove the old address: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    let cluster = match MockCluster::new(args.brokers) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("outbox: cannot start the mock cluster: {e}");
            return ExitCode::from(3);
        }
    };
    for (name, partitions) in &topics {
        if let Err(e) = cluster.create_topic(name, *partitions, 1) {
            eprintln!("outbox: cannot create topic {name}: {e}");
            return ExitCode::from(3);
        }
    }
    let bootstrap = cluster.bootstrap_servers();
    // Listening for SIGTERM before anyone can learn the address: a script that stops the
    // broker as soon as it has read it gets a clean stop.
    #[cfg(unix)]
    let (mut term, mut interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(term), Ok(interrupt)) => (term, interrupt),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("outbox: cannot listen for SIGTERM and SIGINT: {e}");
                return ExitCode::from(3);
            }
        }
    };
    if let Some(path) = &args.addr_file {
        // Written whole or not at all: a reader never sees half an address.
        let partial = path.with_file_name(format!(
            ".{}.partial",
            path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        if let Err(e) = std::fs::write(&partial, &bootstrap).and_then(|()| std::fs::rename(&partial, path)) {
            let _ = std::fs::remove_file(&partial);
            eprintln!("outbox: {}: cannot write: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    let listed: Vec<String> = topics.iter().map(|(n, p)| format!("{n} ({p} partitions)")).collect();
    println!("dev broker (librdkafka mock cluster, in memory, for development only) at {bootstrap}");
    if listed.is_empty() {
        println!("topics: none yet; a topic is created on first use (unless the client sets allow.auto.create.topics=false)");
    } else {
        println!("topics: {}", listed.join(", "));
    }
    println!("export KAFKA_BROKERS={bootstrap}");
    println!("stop with Ctrl-C");
    #[cfg(unix)]
    tokio::select! {
        _ = term.recv() => {}
        _ = interrupt.recv() => {}
    }
    #[cfg(not(unix))]
    outbox_runtime::signal::shutdown_signal().await;
    drop(cluster);
    // The address is gone with the broker: a script waiting for the file must not find it.
    if let Some(path) = &args.addr_file {
        let _ = std::fs::remove_file(path);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::parse_topic;

    #[test]
    fn topic_specs_are_checked() {
        assert_eq!(parse_topic("orders"), Ok(("orders", 6)));
        assert_eq!(parse_topic("orders:3"), Ok(("orders", 3)));
        assert!(parse_topic("orders:x").unwrap_err().contains("partitions must be a number"));
        assert!(parse_topic(":3").is_err());
        assert!(parse_topic("orders:0").is_err());
    }
}
