//! The rendezvous across real processes (no GPU): this test binary starts
//! itself again as the ranks of a job (`FICCO_DIST_ROLE` says what a child
//! does; the test `rank_child` is the children's entry and does nothing in
//! a normal run). Checked: every rank exchanges bytes and file descriptors
//! exactly, and a rank that dies, rank 0 included, ends every other rank
//! with an error naming the cause within the bound, not a hang; a foreign
//! process (`intruder_child`) that connects to the store and to the
//! descriptor sockets mid-job is refused, and the job completes.

use ficco_cuda::runtime::{fdpass, DistError, JobSecret, LaunchEnv, Rendezvous, StoreClient};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "FICCO_DIST_ROLE";
/// Set for the intruder child: the job's store port.
const INTRUDE_PORT: &str = "FICCO_TEST_INTRUDE_PORT";
/// A file the intruder makes once it attacked; rank 3 waits for it, so the
/// attack lands while the other ranks wait for rank 3 mid-exchange.
const INTRUDE_MARK: &str = "FICCO_TEST_INTRUDE_MARK";
/// The exchange the intruder attacks (its sockets' names contain it).
const INTRUDED: &str = "intruded-files";

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
    /// The intruder's pid, exit code and stderr, when there was one.
    intruder: Option<(u32, Option<i32>, String)>,
}

/// How a job's children are started.
#[derive(Default)]
struct JobOpts {
    /// Start an intruder beside the ranks (see `intruder_child`).
    intruder: bool,
    /// No FICCO_JOB_SECRET: the ranks fall back to a node secret file in
    /// this runtime directory.
    node_file_in: Option<std::path::PathBuf>,
}

/// Runs `world` ranks of `role` as child processes. Children still running
/// after `limit` are killed.
fn run_job(role: &str, world: usize, limit: Duration) -> Job {
    run_job_with(role, world, limit, JobOpts::default())
}

/// This test binary as a child running only `test`.
fn child(exe: &std::path::Path, test: &str) -> Command {
    let mut c = Command::new(exe);
    c.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn run_job_with(role: &str, world: usize, limit: Duration, opts: JobOpts) -> Job {
    let port = free_port();
    let exe = std::env::current_exe().expect("test binary");
    let secret = JobSecret::generate().expect("a job secret");
    let mark = std::env::temp_dir().join(format!("ficco-intruded-{port}-{}", std::process::id()));
    let _ = std::fs::remove_file(&mark);
    let t0 = Instant::now();
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            let mut c = child(&exe, "rank_child");
            c.envs(LaunchEnv::vars_for(r, world, "127.0.0.1", port, &secret))
                .env(ROLE, role)
                .env(INTRUDE_MARK, &mark)
                .env("FICCO_DIST_TIMEOUT_MS", "10000");
            if let Some(dir) = &opts.node_file_in {
                c.env_remove("FICCO_JOB_SECRET").env("XDG_RUNTIME_DIR", dir);
            }
            c.spawn().expect("spawn a rank")
        })
        .collect();
    let mut intruder = opts.intruder.then(|| {
        child(&exe, "intruder_child")
            .env(INTRUDE_PORT, port.to_string())
            .env(INTRUDE_MARK, &mark)
            .env_remove("FICCO_JOB_SECRET")
            .spawn()
            .expect("spawn the intruder")
    });
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
    let intruder = intruder.as_mut().map(|k| {
        let t1 = Instant::now();
        let mut code = None;
        while code.is_none() && t1.elapsed() < Duration::from_secs(20) {
            code = k.try_wait().expect("try_wait").map(|s| s.code());
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = k.kill();
        let _ = k.wait();
        let mut text = String::new();
        if let Some(mut e) = k.stderr.take() {
            let _ = e.read_to_string(&mut text);
        }
        (k.id(), code.flatten(), text)
    });
    let _ = std::fs::remove_file(&mark);
    Job {
        codes: codes.into_iter().map(|c| c.flatten()).collect(),
        took,
        stderr,
        intruder,
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
        "exchange" | "intruded" => {
            let all = rv.all_gather("r", &[me as u8; 5]).expect("gather");
            assert_eq!(
                all,
                (0..all.len()).map(|q| vec![q as u8; 5]).collect::<Vec<_>>()
            );
            let name = if role == "intruded" {
                // The others bind their sockets and wait for rank 3 at the
                // barrier while the intruder attacks, so its connections
                // are queued first.
                if me == 3 {
                    let mark = std::env::var_os(INTRUDE_MARK).expect("the mark's path");
                    let t = Instant::now();
                    while !std::path::Path::new(&mark).exists() && t.elapsed().as_secs() < 8 {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                INTRUDED
            } else {
                "files"
            };
            let mut f = ficco_testkit::unlinked_file(&format!("from rank {me}"));
            let fds = fdpass::exchange(&rv, name, f.as_fd()).expect("fd exchange");
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
            // The store still serves the job (an intruder's abort did not land).
            let again = rv.all_gather("after", &[me as u8]).expect("gather after");
            assert_eq!(again.len(), rv.env.world_size);
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

/// A foreign process (no job secret, not a rank): connects to the store
/// with a wrong secret and with an abort in place of a proof, and to every
/// descriptor socket of the intruded exchange, handing each a file of its
/// own under a rank's tag. Exits 0 once the store refused it both ways and
/// it reached three sockets; the ranks' logs say whether they refused it.
#[test]
fn intruder_child() {
    let Ok(port) = std::env::var(INTRUDE_PORT) else {
        return;
    };
    let addr = format!("127.0.0.1:{port}");
    let f = ficco_testkit::unlinked_file("from the intruder");
    let (attacked, held) = ficco_testkit::attack_descriptor_sockets(
        &format!(".{INTRUDED}."),
        3,
        4,
        Duration::from_secs(15),
        |c, tag| {
            let _ = fdpass::send_fd(c, tag, f.as_fd());
        },
    );
    eprintln!("intruder reached {attacked:?}");
    let wrong = JobSecret::generate().expect("random");
    let refused = matches!(
        StoreClient::connect(&addr, 1, Duration::from_secs(3), &wrong),
        Err(DistError::StoreAuth { .. })
    );
    // An abort frame in place of the answer to the challenge.
    let mut raw = std::net::TcpStream::connect(&addr).expect("reach the store");
    raw.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut hello = [0u8; 40];
    raw.read_exact(&mut hello).expect("the challenge");
    let mut frame = vec![5u8];
    frame.extend_from_slice(&4u32.to_le_bytes());
    frame.extend_from_slice(b"evil");
    frame.resize(64, 0);
    raw.write_all(&frame).expect("send");
    let mut rest = vec![];
    let closed = raw.read_to_end(&mut rest).is_ok_and(|n| n == 0);
    eprintln!("intruder: store refused {refused}, abort connection closed {closed}");
    let mark = std::env::var_os(INTRUDE_MARK).expect("the mark's path");
    std::fs::write(mark, b"attacked").expect("the mark");
    // Held open while the ranks accept (they check the pid the kernel
    // recorded at connect).
    std::thread::sleep(Duration::from_secs(2));
    drop(held);
    std::process::exit(if refused && closed && attacked.len() >= 3 {
        0
    } else {
        1
    });
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

/// A foreign process in the middle of a 4-rank job: the store refuses it
/// (its abort reaches nobody), each descriptor socket refuses its
/// connection by pid, and every rank still gets exactly its peers' files.
#[test]
fn a_foreign_process_is_refused_and_the_job_completes() {
    let job = run_job_with(
        "intruded",
        4,
        Duration::from_secs(60),
        JobOpts {
            intruder: true,
            ..JobOpts::default()
        },
    );
    let (pid, code, text) = job.intruder.expect("an intruder ran");
    let all = format!("{}\n--- intruder:\n{text}", job.stderr);
    assert_eq!(job.codes, vec![Some(OK); 4], "{all}");
    assert_eq!(code, Some(0), "{all}");
    let refused_fd = format!("a descriptor socket refused a connection: pid {pid} ");
    assert!(
        job.stderr.matches(&refused_fd).count() >= 3,
        "each of ranks 0 to 2 refuses the intruder: {all}"
    );
    assert!(
        job.stderr
            .contains("the rendezvous store refused a connection from 127.0.0.1:"),
        "{all}"
    );
}

/// Without FICCO_JOB_SECRET, a job on one node shares a secret through a
/// private file in the runtime directory, removed when the job ends.
#[test]
fn one_node_without_a_secret_uses_a_private_file() {
    let dir = std::env::temp_dir().join(format!("ficco-procs-rt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("runtime dir");
    let job = run_job_with(
        "exchange",
        3,
        Duration::from_secs(60),
        JobOpts {
            node_file_in: Some(dir.clone()),
            ..JobOpts::default()
        },
    );
    assert_eq!(job.codes, vec![Some(OK); 3], "{}", job.stderr);
    let left: Vec<_> = std::fs::read_dir(dir.join("ficco"))
        .expect("the secret directory")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
