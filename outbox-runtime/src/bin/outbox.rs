//! The `outbox` operator command line; see `outbox_runtime::cli`.

fn main() -> std::process::ExitCode {
    outbox_runtime::cli::main()
}
