//! The example processes' settings from the environment: a value they cannot use is exit
//! code 2 with a message that names the variable, before anything connects.

use std::process::Command;

/// Runs the example relay with `vars` (and a broker address that nothing answers on).
fn relay_with(vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_relay"));
    command.env("KAFKA_BROKERS", "127.0.0.1:1").env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none");
    for var in
        ["OUTBOX_CLAIM_MODE", "OUTBOX_POLL_MS", "OUTBOX_BATCH_SIZE", "OUTBOX_CDC_SLOT", "OUTBOX_METRICS_ADDR"]
    {
        command.env_remove(var);
    }
    command.envs(vars.iter().copied());
    let output = command.output().expect("run the example relay");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn bad_relay_settings_are_exit_code_2_naming_the_variable() {
    for (var, value) in [
        ("OUTBOX_CLAIM_MODE", "hold_locks"),
        ("OUTBOX_CLAIM_MODE", "HOLD-LOCKS"),
        ("OUTBOX_CLAIM_MODE", ""),
        ("OUTBOX_POLL_MS", "1s"),
        ("OUTBOX_BATCH_SIZE", "99999999999"),
    ] {
        let (code, err) = relay_with(&[(var, value)]);
        assert_eq!(code, Some(2), "{var}={value:?}: {err}");
        assert!(err.contains(var), "{var}={value:?}: the message names it: {err}");
    }
}

/// Each documented mode passes the check and the relay goes on to the next setting (a bad
/// metrics address, refused before anything connects).
#[test]
fn each_claim_mode_the_relay_documents_is_accepted() {
    for mode in [None, Some("lease"), Some("hold-locks")] {
        let mut vars = vec![("OUTBOX_METRICS_ADDR", "nowhere")];
        vars.extend(mode.map(|m| ("OUTBOX_CLAIM_MODE", m)));
        let (code, err) = relay_with(&vars);
        assert_eq!(code, Some(2), "{mode:?}: {err}");
        assert!(err.contains("OUTBOX_METRICS_ADDR") && !err.contains("OUTBOX_CLAIM_MODE"), "{mode:?}: {err}");
    }
}

/// The consumer too: a setting the library refuses is exit code 2, naming it.
#[test]
fn the_consumer_refuses_a_bad_metrics_address_with_exit_code_2() {
    let output = Command::new(env!("CARGO_BIN_EXE_consumer"))
        .env("KAFKA_BROKERS", "127.0.0.1:1")
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("OUTBOX_METRICS_ADDR", "nowhere")
        .output()
        .expect("run the example consumer");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("OUTBOX_METRICS_ADDR"), "{err}");
}
