//! The example relay process, built with the tests so they can run and kill it.

fn main() -> std::process::ExitCode {
    outbox_examples::relay_process::main_from_env()
}
