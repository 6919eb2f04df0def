//! Helpers shared by the CLI tests: run the `ficco` binary, read its output,
//! and assert the one-line error contract.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn ficco(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ficco"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run ficco")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 2, one line `error: ...` naming `want`, no panic, no
/// backtrace, no internal error.
pub fn assert_fails(args: &[&str], want: &str) -> Output {
    let o = ficco(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one error line expected:\n{err}");
    assert!(lines[0].contains(want), "{args:?}: {err}");
    assert!(!err.contains("Error:"), "{args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace") && !err.contains("internal error"),
        "{err}"
    );
    o
}

/// A path in a per-process temporary folder named after `group`.
pub fn tmp(group: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ficco-{group}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir.join(name)
}
