//! The example order service process; see `outbox_examples::service_process` for its settings.

fn main() -> std::process::ExitCode {
    outbox_examples::service_process::main_from_env()
}
