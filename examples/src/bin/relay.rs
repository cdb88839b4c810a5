//! The example relay process; see `outbox_examples::relay_process` for its settings.

fn main() -> std::process::ExitCode {
    outbox_examples::relay_process::main_from_env()
}
