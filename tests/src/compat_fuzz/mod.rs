//! The compatibility checker against a second implementation: a seeded generator of JSON
//! Schema pairs (every dialect, every keyword of the validation vocabulary) and of values,
//! judged by the `jsonschema` crate. A pair the checker calls compatible (JSON Schema
//! semantics) must have no value the writer's schema accepts and the reader's refuses; one
//! is a counterexample, reported with the seed that makes it again.
//!
//! Pairs are a schema and a mutation of it (small edits, so that many are compatible and
//! the claim is tested), and unrelated schemas. Values come from sampling the writer's
//! schema, from mutating those samples, and from a pool of plain values; only values the
//! writer's validator accepts are kept. Every generated schema is also compared with
//! itself, which must be compatible in both semantics.
//!
//! The bounded run is `tests/tests/compat_soundness.rs`; `cargo xtask fuzz compat --pairs N
//! --seed S` runs it long.

use std::collections::BTreeMap;

use outbox_runtime::schema::{compare_with, Judge, Mode, Policy, SchemaDoc, Semantics};
use serde::Serialize;
use serde_json::{json, Value};

mod gen;
mod sample;

use self::gen::{collect_schema_nodes, Gen};

/// The line prefix of the run's verdict (JSON), as the xtask prints it.
pub const VERDICT_PREFIX: &str = "compat fuzz verdict: ";

/// What a run found.
#[derive(Debug, Default, Serialize)]
pub struct Verdict {
    /// The seed that repeats the run.
    pub seed: u64,
    /// Schema pairs generated.
    pub pairs: u64,
    /// Directions (writer, reader) judged, two per pair.
    pub judged: u64,
    /// Directions judged compatible.
    pub compatible: u64,
    /// Of those, directions whose two schemas are the same JSON (a mutation that changed nothing).
    pub compatible_identical: u64,
    /// Directions judged incompatible, by the first rule reported.
    pub incompatible_by_rule: BTreeMap<String, u64>,
    /// Values the writer accepted, checked against the reader of a compatible direction.
    pub instances: u64,
    /// Values checked in all, accepted by the writer or not.
    pub values_generated: u64,
    /// Pairs whose schema the `jsonschema` crate refused to compile (skipped).
    pub uncompilable: u64,
    /// Schemas compared with themselves.
    pub identities: u64,
    /// Compatible verdicts with a value the writer accepts and the reader refuses.
    pub counterexamples: Vec<Counterexample>,
    /// Schemas not compatible with themselves (the first few).
    pub identity_failures: Vec<Value>,
    /// Schemas not compatible with themselves annotated (JSON Schema semantics).
    pub annotated_identity_failures: u64,
    /// Pairs per dialect of the writer.
    pub by_dialect: BTreeMap<String, u64>,
}

impl Verdict {
    /// No counterexample and no identity failure.
    pub fn ok(&self) -> bool {
        self.counterexamples.is_empty() && self.identity_failures.is_empty()
    }
}

/// A value the writer accepts and the reader refuses, on a pair judged compatible.
#[derive(Debug, Serialize)]
pub struct Counterexample {
    /// Which pair of the run.
    pub pair: u64,
    /// The writer's schema.
    pub writer: Value,
    /// The reader's schema.
    pub reader: Value,
    /// The value.
    pub value: Value,
    /// Whether the validators asserted `format`.
    pub formats_asserted: bool,
}

const DIALECTS: [&str; 5] = [
    "http://json-schema.org/draft-04/schema#",
    "http://json-schema.org/draft-06/schema#",
    "http://json-schema.org/draft-07/schema#",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
];

const NAMES: [&str; 6] = ["a", "b", "c", "x-a", "x-b", "kind"];
const PATTERNS: [&str; 5] = ["^a", "b$", "^[a-c]*$", ".*", "^x-"];
const FORMATS: [&str; 4] = ["date", "uuid", "x-mine", "email"];
const STRINGS: [&str; 12] = [
    "",
    "a",
    "ab",
    "abc",
    "b",
    "x-a",
    "kind",
    "2020-01-02",
    "not a date",
    "0190a1f2-4c6e-7b1a-9d2e-3f4a5b6c7d8e",
    "a@b.c",
    "aaaaaaa",
];

/// Runs `pairs` pairs from `seed`.
pub fn run(pairs: u64, seed: u64) -> Verdict {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut verdict = Verdict { seed, ..Verdict::default() };
    for pair in 0..pairs {
        let d = rng.usize(..DIALECTS.len());
        let mut g = Gen { rng: &mut rng, d };
        let old = g.document();
        let new = if g.rng.u8(..4) == 0 {
            // Sometimes another dialect for the new version.
            g.d = g.rng.usize(..DIALECTS.len());
            g.document()
        } else {
            let mut new = old.clone();
            for _ in 0..=g.rng.usize(..3) {
                g.mutate_doc(&mut new);
            }
            new
        };
        verdict.pairs += 1;
        *verdict.by_dialect.entry(dialect_name(d).to_owned()).or_default() += 1;
        for s in [&old, &new] {
            identity(s, &mut verdict);
        }
        let formats = rng.bool();
        for (writer, reader) in [(&old, &new), (&new, &old)] {
            judge_direction(&mut rng, pair, writer, reader, formats, &mut verdict);
        }
    }
    verdict
}

fn dialect_name(d: usize) -> &'static str {
    ["draft-04", "draft-06", "draft-07", "2019-09", "2020-12"][d]
}

/// A schema against itself, and against itself with annotations added at every node
/// (the same schema, other JSON): both must be compatible.
fn identity(s: &Value, verdict: &mut Verdict) {
    let Ok(doc) = SchemaDoc::from_value("generated", s.clone()) else { return };
    verdict.identities += 1;
    for semantics in [Semantics::Serde, Semantics::JsonSchema] {
        let report = compare_with(&doc, &doc, Mode::Full, Judge::new(semantics, Policy::Strict));
        if !report.is_compatible() && verdict.identity_failures.len() < 5 {
            verdict.identity_failures.push(s.clone());
        }
    }
    let mut annotated = s.clone();
    let mut nodes = Vec::new();
    collect_schema_nodes(s, "", &mut nodes);
    for at in nodes {
        if let Some(Value::Object(o)) = annotated.pointer_mut(&at) {
            o.insert("description".to_owned(), json!("the same schema"));
        }
    }
    let Ok(other) = SchemaDoc::from_value("annotated", annotated.clone()) else { return };
    let report = compare_with(&doc, &other, Mode::Full, Judge::new(Semantics::JsonSchema, Policy::Strict));
    if !report.is_compatible() {
        verdict.annotated_identity_failures += 1;
        if verdict.identity_failures.len() < 5 {
            verdict.identity_failures.push(json!({ "schema": s, "annotated": annotated, "found": report.incompatibilities.iter().map(ToString::to_string).collect::<Vec<_>>() }));
        }
    }
}

/// The second implementation's validator for `schema`, in the dialect json-schema
/// semantics reads it in: its `$schema`, or draft-07 without one, as registries read it.
fn validator(schema: &Value, formats: bool) -> Result<jsonschema::Validator, String> {
    let mut options = jsonschema::options().should_validate_formats(formats);
    if schema.get("$schema").is_none() {
        options = options.with_draft(jsonschema::Draft::Draft7);
    }
    options.build(schema).map_err(|e| e.to_string())
}

fn judge_direction(
    rng: &mut fastrand::Rng,
    pair: u64,
    writer: &Value,
    reader: &Value,
    formats: bool,
    verdict: &mut Verdict,
) {
    let (Ok(w), Ok(r)) =
        (SchemaDoc::from_value("writer", writer.clone()), SchemaDoc::from_value("reader", reader.clone()))
    else {
        return;
    };
    let (wv, rv) = match (validator(writer, formats), validator(reader, formats)) {
        (Ok(wv), Ok(rv)) => (wv, rv),
        (Err(e), _) | (_, Err(e)) => {
            verdict.uncompilable += 1;
            if std::env::var_os("OUTBOX_COMPAT_SHOW_UNCOMPILABLE").is_some() {
                eprintln!("uncompilable: {e}: {writer} / {reader}");
            }
            return;
        }
    };
    verdict.judged += 1;
    // Backward: the new schema (reader) reads what the old one (writer) wrote.
    let report = compare_with(&w, &r, Mode::Backward, Judge::new(Semantics::JsonSchema, Policy::Strict));
    if let Some(first) = report.incompatibilities.first() {
        *verdict.incompatible_by_rule.entry(first.rule.name().to_owned()).or_default() += 1;
        return;
    }
    verdict.compatible += 1;
    if writer == reader {
        verdict.compatible_identical += 1;
    }
    let mut g = Gen { rng, d: 4 };
    let mut values: Vec<Value> = (0..24).map(|_| g.sample(writer, writer, 4)).collect();
    let mutated: Vec<Value> = values.iter().take(12).map(|v| g.mutate_value(v)).collect();
    values.extend(mutated);
    values.extend((0..6).map(|_| g.plain_value(2)));
    for value in values {
        verdict.values_generated += 1;
        if !wv.is_valid(&value) {
            continue;
        }
        verdict.instances += 1;
        if !rv.is_valid(&value)
            && verdict.counterexamples.len() < 10
            && verdict.counterexamples.last().is_none_or(|c| c.pair != pair)
        {
            verdict.counterexamples.push(Counterexample {
                pair,
                writer: writer.clone(),
                reader: reader.clone(),
                value,
                formats_asserted: formats,
            });
        }
    }
}
