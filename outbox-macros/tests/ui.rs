//! Compile errors of `#[derive(OutboxEvent)]`: one case per message, each `.stderr`
//! reviewed by eye. Refresh with `TRYBUILD=overwrite cargo test -p outbox-macros --test ui`
//! and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*/*.rs");
}
