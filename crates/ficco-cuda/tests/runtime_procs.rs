//! The rendezvous across real processes (no GPU): this test binary starts
//! itself again as the ranks of a job (`FICCO_DIST_ROLE` says what a child
//! does; the test `rank_child` is the children's entry and does nothing in
//! a normal run). Checked: every rank exchanges bytes and file descriptors
//! exactly, and a rank that dies, rank 0 included, ends every other rank
//! with an error naming the cause within the bound, not a hang.

use ficco_cuda::runtime::{fdpass, DistError, LaunchEnv, Rendezvous};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "FICCO_DIST_ROLE";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// What a job of child ranks did.
struct Job {
    /// Each rank's exit code (None: killed after the limit, a hang).
    codes: Vec<Option<i32>>,
    /// How long the slowest took.
    took: Duration,
    /// Every rank's stderr, for the failure message (not printed otherwise:
    /// a passing test prints nothing).
    stderr: String,
}

/// Runs `world` ranks of `role` as child processes. Children still running
/// after `limit` are killed.
fn run_job(role: &str, world: usize, limit: Duration) -> Job {
    let port = free_port();
    let exe = std::env::current_exe().expect("test binary");
    let t0 = Instant::now();
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            Command::new(&exe)
                .args(["rank_child", "--exact", "--nocapture", "--test-threads=1"])
                .envs(LaunchEnv::vars_for(r, world, "127.0.0.1", port))
                .env(ROLE, role)
                .env("FICCO_DIST_TIMEOUT_MS", "5000")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; world];
    while codes.iter().any(|c| c.is_none()) && t0.elapsed() < limit {
        for (k, c) in kids.iter_mut().zip(codes.iter_mut()) {
            if c.is_none() {
                *c = k.try_wait().expect("try_wait").map(|s| s.code());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    let mut stderr = String::new();
    for (r, k) in kids.iter_mut().enumerate() {
        let _ = k.kill();
        let _ = k.wait();
        let mut text = String::new();
        if let Some(mut e) = k.stderr.take() {
            let _ = e.read_to_string(&mut text);
        }
        stderr.push_str(&format!("--- rank {r} stderr:\n{text}"));
    }
    Job {
        codes: codes.into_iter().map(|c| c.flatten()).collect(),
        took,
        stderr,
    }
}

/// Exit codes a child uses to say what it saw.
const OK: i32 = 0;
const DIED: i32 = 3;
const SAW_PEER_LOST: i32 = 10;
const SAW_STORE_LOST: i32 = 11;
const SAW_OTHER: i32 = 12;

fn verdict(e: &DistError, dead: usize) -> i32 {
    eprintln!("child saw: {e}");
    match e {
        DistError::PeerLost { rank, .. } if *rank == dead => SAW_PEER_LOST,
        DistError::StoreLost { .. } => SAW_STORE_LOST,
        _ => SAW_OTHER,
    }
}

#[test]
fn rank_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let env = LaunchEnv::from_env().expect("launcher env");
    let me = env.rank;
    let dead = if role == "rank0-dies" { 0 } else { 2 };
    let rv = match Rendezvous::join(env, ficco_cuda::runtime::timeout_from_env()) {
        Ok(rv) => rv,
        // Rank 0 may die while the others still finish joining.
        Err(e) if role == "rank0-dies" => std::process::exit(verdict(&e, dead)),
        Err(e) => panic!("join: {e}"),
    };
    std::process::exit(child_work(&role, me, dead, rv));
}

/// What rank `me` of role `role` does once joined; its exit code. Takes the
/// rendezvous by value so it is dropped (rank 0's store lingering for the
/// others) before the process exits.
fn child_work(role: &str, me: usize, dead: usize, rv: Rendezvous) -> i32 {
    match role {
        "exchange" => {
            let all = rv.all_gather("r", &[me as u8; 5]).expect("gather");
            assert_eq!(
                all,
                (0..all.len()).map(|q| vec![q as u8; 5]).collect::<Vec<_>>()
            );
            let mut f = tempfile(&format!("from rank {me}"));
            let fds = fdpass::exchange(&rv, "files", f.as_fd()).expect("fd exchange");
            for (q, fd) in fds.into_iter().enumerate() {
                match fd {
                    None => assert_eq!(q, me),
                    Some(fd) => {
                        // pread: the descriptors share the file's offset
                        // and other ranks read it concurrently.
                        let g = std::fs::File::from(fd);
                        let mut buf = [0u8; 256];
                        let n = g.read_at(&mut buf, 0).expect("read");
                        assert_eq!(&buf[..n], format!("from rank {q}").as_bytes());
                    }
                }
            }
            f.flush().expect("flush");
            rv.close().expect("close");
            OK
        }
        "rank2-dies" | "rank0-dies" => {
            if me == dead {
                // Dies without a goodbye, as a crash would.
                std::process::exit(DIED);
            }
            match rv.barrier("work") {
                Ok(()) => OK,
                Err(e) => verdict(&e, dead),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn tempfile(text: &str) -> std::fs::File {
    let path = std::env::temp_dir().join(format!(
        "ficco-dist-procs-{}-{:?}",
        std::process::id(),
        Instant::now()
    ));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("temp file");
    let _ = std::fs::remove_file(&path);
    f.write_all(text.as_bytes()).expect("write");
    f
}

#[test]
fn four_processes_exchange_bytes_and_descriptors_exactly() {
    let job = run_job("exchange", 4, Duration::from_secs(60));
    assert_eq!(job.codes, vec![Some(OK); 4], "{}", job.stderr);
}

#[test]
fn a_rank_that_dies_ends_every_other_rank_with_an_error_naming_it() {
    let job = run_job("rank2-dies", 4, Duration::from_secs(60));
    assert_eq!(
        job.codes,
        vec![
            Some(SAW_PEER_LOST),
            Some(SAW_PEER_LOST),
            Some(DIED),
            Some(SAW_PEER_LOST)
        ],
        "{}",
        job.stderr
    );
    // Detected on the connection's close, well inside the 5 s wait bound.
    assert!(job.took < Duration::from_secs(5), "{:?}", job.took);
}

#[test]
fn rank_zero_dying_ends_every_other_rank_with_store_lost() {
    let job = run_job("rank0-dies", 3, Duration::from_secs(60));
    assert_eq!(
        job.codes,
        vec![Some(DIED), Some(SAW_STORE_LOST), Some(SAW_STORE_LOST)],
        "{}",
        job.stderr
    );
    assert!(job.took < Duration::from_secs(5), "{:?}", job.took);
}
