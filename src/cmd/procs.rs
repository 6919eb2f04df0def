//! One process per rank from the command line: `ficco explore --procs N`
//! starts the N ranks itself (children of this process with the launcher
//! variables `torchrun` would set), and a process started by `torchrun` (or
//! by `--procs`) finds its place in the job in the environment.

use anyhow::{bail, Context, Result};
use ficco_cuda::runtime::{JobSecret, LaunchEnv};
use std::ffi::OsString;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// This process's place in a job: `Some` when the launcher variables are
/// set (`RANK`, `WORLD_SIZE`, ... as torchrun sets them), with a clear
/// error when some are set and others missing or malformed.
pub fn job_env() -> Result<Option<LaunchEnv>> {
    if std::env::var_os("RANK").is_none() && std::env::var_os("WORLD_SIZE").is_none() {
        return Ok(None);
    }
    Ok(Some(LaunchEnv::from_env().context(
        "RANK or WORLD_SIZE is set, so this process is one rank of a job",
    )?))
}

/// This process's arguments without `--procs N` (or `--procs=N`).
fn child_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut out = vec![];
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == "--procs" {
            skip = true;
            continue;
        }
        if a.to_str().is_some_and(|s| s.starts_with("--procs=")) {
            continue;
        }
        out.push(a);
    }
    out
}

/// How long the other ranks may take to end after one failed before they
/// are killed: their rendezvous bound plus their watchdog's, and slack.
fn grace() -> Duration {
    ficco_cuda::runtime::timeout_from_env()
        + Duration::from_millis(ficco_cuda::RunOpts::default().watchdog_ms)
        + Duration::from_secs(10)
}

/// Runs this command again as `n` ranks of a job on this machine (store on
/// 127.0.0.1, a free port, and a job secret drawn here and passed in the
/// children's environment only): rank 0's output is the command's, the other
/// ranks print only errors. Fails naming the first rank that failed; ranks
/// still running `grace` after a failure are killed.
pub fn spawn(n: usize) -> Result<()> {
    if n == 0 {
        bail!("--procs must be at least 1");
    }
    let exe = std::env::current_exe().context("locating the ficco executable")?;
    let args = child_args(std::env::args_os().skip(1));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .context("finding a free port for the job's store")?;
    let secret = JobSecret::generate().context("drawing the job secret")?;
    let mut kids: Vec<Child> = vec![];
    for r in 0..n {
        let child = Command::new(&exe)
            .args(&args)
            .envs(LaunchEnv::vars_for(r, n, "127.0.0.1", port, &secret))
            .stdout(if r == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit())
            .spawn();
        match child {
            Ok(c) => kids.push(c),
            Err(e) => {
                for k in kids.iter_mut() {
                    let _ = k.kill();
                    let _ = k.wait();
                }
                return Err(e).with_context(|| format!("starting rank {r} of {n}"));
            }
        }
    }
    let mut codes: Vec<Option<std::process::ExitStatus>> = vec![None; n];
    let grace = grace();
    let mut failed_at: Option<Instant> = None;
    while codes.iter().any(Option::is_none) {
        for (k, c) in kids.iter_mut().zip(codes.iter_mut()) {
            if c.is_none() {
                *c = k.try_wait().context("waiting for a rank")?;
                if c.is_some_and(|s| !s.success()) && failed_at.is_none() {
                    failed_at = Some(Instant::now());
                }
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > grace) {
            for (k, c) in kids.iter_mut().zip(codes.iter()) {
                if c.is_none() {
                    let _ = k.kill();
                }
            }
            for (k, c) in kids.iter_mut().zip(codes.iter_mut()) {
                if c.is_none() {
                    *c = k.wait().ok();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bad: Vec<String> = codes
        .iter()
        .enumerate()
        .filter_map(|(r, c)| match c {
            Some(s) if s.success() => None,
            Some(s) => Some(format!(
                "rank {r} {}",
                s.code().map_or("was killed".to_string(), |c| format!(
                    "exited with status {c}"
                ))
            )),
            None => Some(format!("rank {r} did not end")),
        })
        .collect();
    if !bad.is_empty() {
        bail!("the job of {n} processes failed: {}", bad.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn procs_is_removed_from_the_child_arguments() {
        assert_eq!(
            child_args(os(&["explore", "--procs", "4", "--op", "ag-gemm"]).into_iter()),
            os(&["explore", "--op", "ag-gemm"])
        );
        assert_eq!(
            child_args(os(&["explore", "--procs=2", "--json"]).into_iter()),
            os(&["explore", "--json"])
        );
    }
}
