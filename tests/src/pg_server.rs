//! PostgreSQL servers of the tests' own, for what the server at `DATABASE_URL` may not have
//! or must not be put through: `wal_level = logical` (PostgreSQL as Debian installs it runs
//! at `replica`), `replica` when that one streams, server-wide settings, restarts.
//!
//! A [`Cluster`] is started from the server binaries already on the machine, never a
//! download: `OUTBOX_PG_BINDIR`, else `pg_config --bindir`, else the newest
//! `/usr/lib/postgresql/*/bin`. It is `initdb` into a directory of its own under the
//! temporary directory, on a free port of 127.0.0.1, trust authentication, superuser
//! `postgres`. `initdb` refuses root, so as root the cluster runs as the `postgres` user
//! (through `runuser`). `OUTBOX_PG_DIR` puts the clusters elsewhere than the temporary
//! directory.
//!
//! A watchdog shell owns the cluster: it stops the server (immediate mode) and removes its
//! directory when its standard input closes, that is when the [`Cluster`] is dropped or the
//! process that started it exits, however it exits (a panic, an abort, SIGKILL). So
//! [`streaming`]'s cluster, shared by every test of a test binary, goes with the binary.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::Failure;

/// The watchdog: initdb, the settings, start, `ready` on stdout, then wait for stdin to
/// close, stop, remove. Arguments: directory, port, bindir, settings (postgresql.conf lines).
const WATCHDOG: &str = r#"
dir=$1; port=$2; bindir=$3; settings=$4
# The parent gone while starting: `ready` must not kill the shell before its cleanup.
trap '' PIPE
cleanup() { "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1; rm -rf "$dir"; }
if ! "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >"$dir/initdb.log" 2>&1; then
  cat "$dir/initdb.log" >&2; rm -rf "$dir"; exit 1
fi
# TCP only: a socket path is limited to 107 bytes, and the temporary directory may be long.
printf '%s\n' "port = $port" "listen_addresses = '127.0.0.1'" "unix_socket_directories = ''" "$settings" \
  >>"$dir/data/postgresql.conf"
if ! "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null 2>&1; then
  cat "$dir/server.log" >&2; cleanup; exit 1
fi
echo ready || { cleanup; exit 1; }
cat >/dev/null
cleanup
"#;

/// Room for the tests of a binary side by side: each has a slot and streams of its own, and
/// a pool of 5 connections or more.
const ROOM: [(&str, &str); 3] =
    [("max_replication_slots", "100"), ("max_wal_senders", "100"), ("max_connections", "300")];

/// Ports of the clusters this process runs, to tell their pools from the main server's.
static PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A throwaway PostgreSQL server: stopped and removed when dropped or when the process ends.
#[derive(Debug)]
pub struct Cluster {
    port: u16,
    dir: PathBuf,
    bindir: PathBuf,
    as_postgres: bool,
    // Closing it (drop, or the process's end) stops the server.
    stdin: Option<ChildStdin>,
    watchdog: Child,
}

impl Cluster {
    /// Starts a server with `settings` (postgresql.conf names and values) on top of the
    /// defaults; waits until it accepts connections.
    pub fn start(settings: &[(&str, &str)]) -> Result<Cluster, Failure> {
        let bindir = bindir()?;
        let as_postgres = is_root();
        let conf: Vec<String> = settings
            .iter()
            .map(|(name, value)| format!("{name} = '{}'", value.replace('\\', "\\\\").replace('\'', "''")))
            .collect();
        let mut last = String::new();
        // A port found free can be taken before the server binds it: a few tries.
        for _ in 0..3 {
            let port = free_port()?;
            static STARTED: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "outbox-pg-{}-{}-{port}",
                std::process::id(),
                STARTED.fetch_add(1, Ordering::Relaxed)
            );
            let dir = parent().join(&name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if as_postgres {
                run(Command::new("chown").arg("postgres:").arg(&dir))?;
            }
            // Beside the directory, which a failed start removes.
            let log_path = parent().join(format!("{name}.log"));
            let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
            let mut command = postgres_command(as_postgres, "sh");
            command
                .args(["-c", WATCHDOG, "outbox-pg"])
                .arg(&dir)
                .arg(port.to_string())
                .arg(&bindir)
                .arg(conf.join("\n"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log))
                // initdb and pg_ctl (PostgreSQL 15 and before) go back to the directory they
                // start in, which the postgres user may not enter (a checkout under /root).
                .current_dir(&dir)
                // Its own process group: a Ctrl-C to the tests reaches the server through
                // the watchdog's cleanup, not the watchdog's death.
                .process_group(0);
            let mut watchdog = command.spawn().map_err(|e| format!("the PostgreSQL watchdog (sh): {e}"))?;
            let mut ready = String::new();
            let stdout = watchdog.stdout.take().expect("piped");
            let _ = BufReader::new(stdout).read_line(&mut ready);
            if ready.trim() == "ready" {
                let _ = std::fs::remove_file(&log_path);
                PORTS.lock().expect("ports").push(port);
                let stdin = watchdog.stdin.take();
                return Ok(Cluster { port, dir, bindir, as_postgres, stdin, watchdog });
            }
            let _ = watchdog.wait();
            last = std::fs::read_to_string(&log_path).unwrap_or_default();
            let _ = std::fs::remove_file(&log_path);
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(format!(
            "a PostgreSQL server of the tests' own (from {}) did not start:\n{last}",
            bindir.display()
        )
        .into())
    }

    /// A server at `wal_level = logical` with room for the slots and streams of tests
    /// running side by side.
    pub fn streaming() -> Result<Cluster, Failure> {
        Cluster::start(&[("wal_level", "logical"), ROOM[0], ROOM[1], ROOM[2]])
    }

    /// Its URL without a database (for [`db::test_database`](crate::db::test_database)).
    pub fn server(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// The URL of `database` on it.
    pub fn url(&self, database: &str) -> String {
        format!("{}/{database}", self.server())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Restarts it in `mode` (`smart`, `fast` or `immediate`), waiting up to 60 s for it
    /// to stop and to start; says whether `pg_ctl` succeeded.
    pub fn restart(&self, mode: &str) -> bool {
        self.pg_ctl(&["restart", "-m", mode])
    }

    /// Starts it again after a stop that `pg_ctl` gave up on, once that stop has ended
    /// (within a minute); says whether it runs.
    pub fn start_again(&self) -> bool {
        (0..60).any(|_| {
            let started = self.pg_ctl(&["start"]);
            if !started {
                std::thread::sleep(Duration::from_secs(1));
            }
            started
        })
    }

    /// The server's log so far (for a failure's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn pg_ctl(&self, args: &[&str]) -> bool {
        let data = self.dir.join("data");
        let log = self.dir.join("server.log");
        postgres_command(self.as_postgres, self.bindir.join("pg_ctl"))
            .current_dir(&self.dir)
            .args(args)
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        PORTS.lock().expect("ports").retain(|&p| p != self.port);
        drop(self.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// The URL of a server that streams (`wal_level = logical`), without its database: the
/// server at `DATABASE_URL` when it streams, else a [`Cluster`] of this process's own at
/// `wal_level = logical`, started at the first call and shared by every later one.
pub fn streaming() -> Result<String, Failure> {
    static STREAMING: OnceLock<Result<String, String>> = OnceLock::new();
    STREAMING.get_or_init(|| with_wal_level("logical").map_err(|e| e.to_string())).clone().map_err(Into::into)
}

/// The URL of a server at `wal_level = level` (`replica` or `logical`), without its
/// database: the server at `DATABASE_URL` when it is at that level, else a new [`Cluster`]
/// that lives as long as the process. Each call that starts one starts another.
pub fn with_wal_level(level: &str) -> Result<String, Failure> {
    let main = crate::db::base_url();
    if wal_level(&main)? == level {
        return Ok(server_of(&main).to_owned());
    }
    let cluster = Cluster::start(&[("wal_level", level), ROOM[0], ROOM[1], ROOM[2]])?;
    let url = cluster.server();
    // Kept for the process's lifetime: its watchdog stops it when the process ends.
    std::mem::forget(cluster);
    Ok(url)
}

/// Whether the pool's server is one of this process's clusters, by its port on 127.0.0.1.
pub(crate) fn is_cluster_port(host: &str, port: u16) -> bool {
    host == "127.0.0.1" && PORTS.lock().expect("ports").contains(&port)
}

/// `url` without its database.
pub fn server_of(url: &str) -> &str {
    url.rsplit_once('/').map_or(url, |(server, _)| server)
}

/// The `wal_level` of the server at `url` (read on a thread of its own: callers may be
/// inside a runtime or not).
pub fn wal_level(url: &str) -> Result<String, Failure> {
    let url = url.to_owned();
    std::thread::spawn(move || -> Result<String, String> {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
            let level: String =
                sqlx::query_scalar("SHOW wal_level").fetch_one(&pool).await.map_err(|e| e.to_string())?;
            pool.close().await;
            Ok(level)
        })
    })
    .join()
    .map_err(|_| "reading wal_level panicked")?
    .map_err(Into::into)
}

/// Where clusters are made: `OUTBOX_PG_DIR`, else the temporary directory. Their WAL goes
/// there too (a test keeps 1.25 GB of it): point it at a disk, not a small tmpfs.
fn parent() -> PathBuf {
    std::env::var_os("OUTBOX_PG_DIR").map_or_else(std::env::temp_dir, PathBuf::from)
}

/// The server binaries' directory (`initdb`, `pg_ctl`).
fn bindir() -> Result<PathBuf, Failure> {
    if let Some(dir) = std::env::var_os("OUTBOX_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_initdb(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        "no PostgreSQL server binaries (initdb): set OUTBOX_PG_BINDIR, or put pg_config on the PATH".into()
    })
}

/// Whether this process runs as root (`initdb` refuses root).
fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `program`, as the `postgres` user when `as_postgres`.
fn postgres_command(as_postgres: bool, program: impl AsRef<std::ffi::OsStr>) -> Command {
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(command: &mut Command) -> Result<(), Failure> {
    let out = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let mut err = String::new();
        let _ = (&out.stderr[..]).read_to_string(&mut err);
        Err(format!("{command:?}: {err}").into())
    }
}

/// A port of 127.0.0.1 nobody listens at now.
fn free_port() -> Result<u16, Failure> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    Ok(listener.local_addr()?.port())
}
