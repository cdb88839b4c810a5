//! The manual, `src/` (an mdBook: `mdbook build docs`). This crate holds no code: under
//! `cargo test` every Rust block of a chapter is a doctest of it, compiled (and run, where it
//! has a `main` of its own), so a chapter cannot show code that no longer builds. Lines
//! starting with `# ` are hidden by both rustdoc and mdBook: the imports and the function a
//! fragment lives in. Getting started is the exception: its blocks name the files of a
//! workspace that `tests/book.rs` writes outside this repository, builds and runs.

macro_rules! chapters {
    ($($name:ident = $file:literal),* $(,)?) => {
        $(
            #[cfg(doctest)]
            #[doc = include_str!($file)]
            mod $name {}
        )*
        /// The chapters whose blocks are doctests (`tests/book.rs` checks it is every one
        /// but getting-started.md).
        #[cfg(test)]
        pub(crate) const DOCTESTED: &[&str] = &[$($file),*];
    };
}

chapters! {
    readme = "../README.md",
    introduction = "src/introduction.md",
    contracts = "src/contracts.md",
    registries = "src/registries.md",
    publishing = "src/publishing.md",
    relay_cdc = "src/relay-cdc.md",
    consuming = "src/consuming.md",
    effects = "src/effects.md",
    foreign_producers = "src/foreign-producers.md",
    tracing = "src/tracing.md",
    testing = "src/testing.md",
    operating = "src/operating.md",
    console = "src/console.md",
    metrics_alerts = "src/metrics-alerts.md",
    partitions = "src/partitions.md",
    performance = "src/performance.md",
    design = "src/design.md",
    contributing = "src/contributing.md",
}

#[cfg(test)]
mod tests {
    /// Every chapter but getting-started.md (whose blocks are files of a workspace built by
    /// tests/book.rs) is a doctest module.
    #[test]
    fn every_chapter_with_rust_blocks_is_doctested() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut missing = Vec::new();
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).expect("docs/src") {
            let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
            if !name.ends_with(".md") || name == "SUMMARY.md" || name == "getting-started.md" {
                continue;
            }
            seen += 1;
            if !super::DOCTESTED.contains(&format!("src/{name}").as_str()) {
                missing.push(name);
            }
        }
        assert!(seen >= 10, "only {seen} chapters found in {dir}");
        assert!(missing.is_empty(), "chapters not in lib.rs's list: {missing:?}");
    }
}
