//! Helpers shared by the `cargo xtask schema ...` tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

/// What a command printed, stdout then stderr.
pub(crate) fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// This workspace's committed schemas.
pub(crate) fn committed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schemas")
}

/// Copies the tree `from` to `to`.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("read dir").map(|e| e.expect("entry")) {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).expect("copy");
        }
    }
}
