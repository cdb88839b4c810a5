//! The registry's diff over two loaded documents (CONFLUENT.md §4): a memo per pair of
//! nodes, a cycle assumed compatible until a re-pass says otherwise, and one function per
//! node kind. Every function returns differences at paths relative to the pair it
//! compares; the caller prefixes its own segment.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use self::values::{numbers, strings};
use super::load::{Crit, Graph, Id, Shape};
use super::{Difference, Kind, Unpredicted};

mod content;
mod values;

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Diff {
    kind: Kind,
    /// Segments below the pair compared.
    path: Vec<String>,
}

fn at(kind: Kind, segment: &str) -> Diff {
    Diff { kind, path: vec![segment.to_owned()] }
}

fn here(kind: Kind) -> Diff {
    Diff { kind, path: Vec::new() }
}

fn under(segment: &str, diffs: Vec<Diff>) -> impl Iterator<Item = Diff> + '_ {
    diffs.into_iter().map(move |mut d| {
        d.path.insert(0, segment.to_owned());
        d
    })
}

/// A pair compared: whether the graphs are swapped (inside a `not`), the original's
/// node, the update's node.
type Key = (bool, Id, Id);
type Memo = HashMap<Key, Vec<Diff>>;

/// How many re-passes a recursive pair may take to settle before the emulation gives up.
const MAX_PASSES: usize = 64;

pub(super) fn run(o: &Graph, u: &Graph, lenient: bool) -> Result<Vec<Difference>, Unpredicted> {
    let mut seed: Memo = HashMap::new();
    for _ in 0..MAX_PASSES {
        let mut pass = Pass {
            graphs: [o, u],
            flipped: false,
            lenient,
            memo: HashMap::new(),
            in_progress: HashSet::new(),
            seed: &seed,
            optimism: false,
            failed: None,
            depth: 0,
        };
        let found = pass.compare(Some(o.root), Some(u.root));
        if let Some(failed) = pass.failed {
            return Err(failed);
        }
        let incompatible: Memo =
            pass.memo.into_iter().filter(|(_, diffs)| !compatible(diffs, lenient)).collect();
        let settled = incompatible.len() == seed.len() && incompatible.keys().all(|k| seed.contains_key(k));
        if !pass.optimism || settled {
            return Ok(rendered(found));
        }
        seed = incompatible;
    }
    Err(Unpredicted(format!("a recursive schema did not settle in {MAX_PASSES} passes")))
}

fn rendered(found: Vec<Diff>) -> Vec<Difference> {
    found.into_iter().map(|d| Difference { kind: d.kind, path: format!("#/{}", d.path.join("/")) }).collect()
}

fn compatible(diffs: &[Diff], lenient: bool) -> bool {
    diffs.iter().all(|d| d.kind.compatible(lenient))
}

struct Pass<'g> {
    /// The original's graph and the update's, in that order unless `flipped`.
    graphs: [&'g Graph; 2],
    /// Inside a `not`, whose schemas the registry compares the other way round.
    flipped: bool,
    lenient: bool,
    memo: Memo,
    in_progress: HashSet<Key>,
    seed: &'g Memo,
    optimism: bool,
    failed: Option<Unpredicted>,
    /// How many comparisons are open on the stack (a chain of `$ref`s to other
    /// definitions nests without a cycle).
    depth: usize,
}

/// How deep comparisons may nest before the emulation declines the pair.
const MAX_DEPTH: usize = 1024;

impl<'g> Pass<'g> {
    /// The graph the original's nodes are in.
    fn o(&self) -> &'g Graph {
        self.graphs[usize::from(self.flipped)]
    }

    /// The graph the update's nodes are in.
    fn u(&self) -> &'g Graph {
        self.graphs[usize::from(!self.flipped)]
    }

    fn ok(&self, diffs: &[Diff]) -> bool {
        compatible(diffs, self.lenient)
    }

    fn compare(&mut self, o: Option<Id>, u: Option<Id>) -> Vec<Diff> {
        let (o, u) = match (o, u) {
            (None, None) => return Vec::new(),
            (None, Some(_)) => return vec![here(Kind::SchemaAdded)],
            (Some(_), None) => return vec![here(Kind::SchemaRemoved)],
            (Some(o), Some(u)) => (self.o().deref(o), self.u().deref(u)),
        };
        let key = (self.flipped, o, u);
        if let Some(known) = self.memo.get(&key) {
            return known.clone();
        }
        if self.in_progress.contains(&key) {
            return match self.seed.get(&key) {
                Some(known) => known.clone(),
                None => {
                    self.optimism = true;
                    Vec::new()
                }
            };
        }
        if self.depth >= MAX_DEPTH {
            let why = format!("schemas compared more than {MAX_DEPTH} levels deep");
            self.failed.get_or_insert(Unpredicted(why));
            return Vec::new();
        }
        self.depth += 1;
        self.in_progress.insert(key);
        let found = self.types(o, u);
        self.in_progress.remove(&key);
        self.depth -= 1;
        self.memo.insert(key, found.clone());
        found
    }

    fn types(&mut self, o: Id, u: Id) -> Vec<Diff> {
        let (on, un) = (self.o().node(o), self.u().node(u));
        match (&on.shape, &un.shape) {
            (Shape::Combined(..), Shape::Combined(..)) => {}
            (_, Shape::Combined(crit, members, _)) => {
                if members.len() == 1 {
                    let sub = self.compare(Some(o), Some(members[0]));
                    if self.ok(&sub) {
                        return sub;
                    }
                } else if *crit != Crit::AllOf {
                    for &m in members {
                        let mut sub = self.compare(Some(o), Some(m));
                        if self.ok(&sub) {
                            sub.push(here(Kind::SumTypeExtended));
                            return sub;
                        }
                    }
                }
            }
            (Shape::Combined(crit, members, _), _) => {
                if members.len() == 1 {
                    let sub = self.compare(Some(members[0]), Some(u));
                    if self.ok(&sub) {
                        return sub;
                    }
                } else if *crit == Crit::AllOf {
                    for &m in members {
                        let mut sub = self.compare(Some(m), Some(u));
                        if self.ok(&sub) {
                            sub.push(here(Kind::ProductTypeNarrowed));
                            return sub;
                        }
                    }
                }
            }
            _ => {}
        }
        if on.shape.class() != un.shape.class() {
            if matches!(on.shape, Shape::False) || un.shape.is_empty() {
                return Vec::new();
            }
            if on.common.connect_bytes && un.common.connect_bytes {
                return Vec::new();
            }
            return vec![here(Kind::TypeChanged)];
        }
        let mut out = Vec::new();
        let (oc, uc) = (&on.common, &un.common);
        if oc.id != uc.id {
            out.push(here(Kind::IdChanged));
        }
        if oc.title != uc.title {
            out.push(here(Kind::TitleChanged));
        }
        if oc.description != uc.description {
            out.push(here(Kind::DescriptionChanged));
        }
        // Java compares org.json values: two objects or arrays are never equal.
        let structured = |v: &Option<Value>| matches!(v, Some(Value::Object(_) | Value::Array(_)));
        if oc.default != uc.default || (structured(&oc.default) && structured(&uc.default)) {
            out.push(here(Kind::DefaultChanged));
        }
        match (&on.shape, &un.shape) {
            (Shape::String(a), Shape::String(b)) => strings(a, b, &mut out),
            (Shape::Number(a), Shape::Number(b)) => {
                numbers(a, b, &mut out);
            }
            (Shape::Const(a), Shape::Const(b)) if a != b => out.push(at(Kind::EnumArrayChanged, "const")),
            (Shape::Enum(a), Shape::Enum(b)) => {
                let (b_has_a, a_has_b) = (a.iter().all(|v| b.contains(v)), b.iter().all(|v| a.contains(v)));
                match (b_has_a, a_has_b) {
                    (true, true) => {}
                    (true, false) => out.push(at(Kind::EnumArrayExtended, "enum")),
                    (false, true) => out.push(at(Kind::EnumArrayNarrowed, "enum")),
                    (false, false) => out.push(at(Kind::EnumArrayChanged, "enum")),
                }
            }
            (Shape::Combined(oc, om, _), Shape::Combined(uc, um, _)) => {
                let (oc, om, uc, um) = (*oc, om.clone(), *uc, um.clone());
                self.combined(oc, &om, uc, &um, &mut out);
            }
            (Shape::Not(a), Shape::Not(b)) => {
                // The update's `not` is compared as the original, and the other way round.
                let (a, b) = (*a, *b);
                self.flipped = !self.flipped;
                let sub = self.compare(Some(b), Some(a));
                self.flipped = !self.flipped;
                let kind = if self.ok(&sub) { Kind::NotTypeNarrowed } else { Kind::NotTypeExtended };
                out.push(at(kind, "not"));
            }
            (Shape::Object(a), Shape::Object(b)) => {
                let (a, b) = (a.clone(), b.clone());
                self.objects(&a, &b, &mut out);
            }
            (Shape::Array(a), Shape::Array(b)) => {
                let (a, b) = (a.clone(), b.clone());
                self.arrays(&a, &b, &mut out);
            }
            _ => {}
        }
        out
    }

    fn combined(&mut self, oc: Crit, om: &[Id], uc: Crit, um: &[Id], out: &mut Vec<Diff>) {
        if oc != uc {
            let extended = uc == Crit::AnyOf
                || (om.len() == 1 && um.len() == 1)
                || (om.len() == 1 && uc == Crit::OneOf)
                || (um.len() == 1 && oc == Crit::AllOf);
            if !extended {
                out.push(here(Kind::CombinedTypeChanged));
                return;
            }
            out.push(here(Kind::CombinedTypeExtended));
        }
        let (os, us) = (dedupe(self.o(), om), dedupe(self.u(), um));
        if os.len() < us.len() {
            out.push(here(if uc == Crit::AllOf { Kind::ProductTypeExtended } else { Kind::SumTypeExtended }));
        }
        if os.len() > us.len() {
            out.push(here(if oc == Crit::AllOf { Kind::ProductTypeNarrowed } else { Kind::SumTypeNarrowed }));
        }
        // Compatible pairs, then a maximum matching of original members to update ones.
        let mut edges: Vec<Vec<(usize, Vec<Diff>)>> = Vec::new();
        for (i, &a) in os.iter().enumerate() {
            let segment = format!("{}/{i}", oc.name());
            let mut row = Vec::new();
            for (j, &b) in us.iter().enumerate() {
                let sub = self.compare(Some(a), Some(b));
                if self.ok(&sub) {
                    let sub: Vec<Diff> = segment.split('/').rev().fold(sub, |d, s| under(s, d).collect());
                    row.push((j, sub));
                }
            }
            edges.push(row);
        }
        let matched = matching(&edges, us.len());
        let size = matched.iter().filter(|m| m.is_some()).count();
        for (j, i) in matched.iter().enumerate() {
            if let Some(i) = i {
                let (_, diffs) = edges[*i].iter().find(|(b, _)| *b == j).expect("a matched edge");
                out.extend(diffs.iter().cloned());
            }
        }
        if size < os.len().min(us.len()) {
            out.push(here(Kind::CombinedTypeSubschemasChanged));
        }
    }
}

/// Members deduplicated by their canonical form, first occurrence kept.
fn dedupe(g: &Graph, members: &[Id]) -> Vec<Id> {
    let mut seen = HashSet::new();
    members.iter().copied().filter(|&m| seen.insert(g.canonical(m))).collect()
}

/// A maximum matching (augmenting paths): for each update member, the original matched.
fn matching(edges: &[Vec<(usize, Vec<Diff>)>], right: usize) -> Vec<Option<usize>> {
    fn augment(
        i: usize,
        edges: &[Vec<(usize, Vec<Diff>)>],
        seen: &mut [bool],
        owner: &mut [Option<usize>],
    ) -> bool {
        for &(j, _) in &edges[i] {
            if !seen[j] {
                seen[j] = true;
                if owner[j].is_none_or(|k| augment(k, edges, seen, owner)) {
                    owner[j] = Some(i);
                    return true;
                }
            }
        }
        false
    }
    let mut owner = vec![None; right];
    for i in 0..edges.len() {
        let mut seen = vec![false; right];
        augment(i, edges, &mut seen, &mut owner);
    }
    owner
}
