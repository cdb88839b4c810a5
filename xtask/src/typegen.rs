//! `cargo xtask typegen [--schemas DIR] [--out FILE] [--check]`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use outbox_runtime::typegen::{write_or_check, Status};

#[derive(Args)]
pub(crate) struct TypegenArgs {
    /// The committed schemas [default: <workspace>/schemas].
    #[arg(long)]
    schemas: Option<PathBuf>,
    /// The generated Rust file [default: <workspace>/examples/src/consumer_types.rs].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only check: exit 1 when the file is stale.
    #[arg(long)]
    check: bool,
}

pub(crate) fn run(args: TypegenArgs) -> ExitCode {
    let root = crate::project_root();
    let schemas = args.schemas.unwrap_or_else(|| root.join("schemas"));
    let out = args.out.unwrap_or_else(|| root.join("examples/src/consumer_types.rs"));
    match write_or_check(&schemas, &out, args.check) {
        Ok(Status::UpToDate) => {
            println!("{} is up to date", out.display());
            ExitCode::SUCCESS
        }
        Ok(Status::Written) => {
            println!("wrote {}", out.display());
            ExitCode::SUCCESS
        }
        Ok(Status::Stale { hint }) => {
            eprintln!("error: {hint}");
            ExitCode::from(1)
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
