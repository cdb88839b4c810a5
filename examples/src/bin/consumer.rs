//! The example consumer process; see `outbox_examples::consumer_process` for its settings.

fn main() -> std::process::ExitCode {
    outbox_examples::consumer_process::main_from_env()
}
