//! One process per GPU: the rendezvous of the ranks of a job and the
//! memory they share.
//!
//! | module | role |
//! |---|---|
//! | [`env`] | the launcher environment (`RANK`, `WORLD_SIZE`, ... as `torchrun` sets them) |
//! | [`store`] | a TCP key-value store hosted by rank 0, every wait bounded, dead ranks detected |
//! | [`Rendezvous`] | joins the job: store, hostnames (one node or several), barriers, broadcast, the NCCL id |
//! | [`nccl`] | the NCCL unique id through the store; one communicator rank per process |
//! | [`fdpass`] | file descriptors between the processes of one node (`SCM_RIGHTS` over a Unix socket) |
//! | [`shared`] | VMM device memory exported as a POSIX fd, imported and mapped by the node's other ranks |
//! | [`job`] | [`job::Job`]: a backend's rank of a job: shared arena and flags, its NCCL communicators, results exchanged |
//!
//! Design: nothing here waits without a bound. A rank that dies or never
//! arrives ends every other rank's next store wait with an error naming it
//! (the store notices the dead connection), and a rank 0 that dies ends the
//! others' waits with "store lost". Across nodes only the NCCL id crosses;
//! memory is shared only between the ranks of one node, which the hostnames
//! say.

pub mod env;
pub mod fdpass;
pub mod job;
pub(crate) mod nccl;
pub mod shared;
pub mod store;

pub use env::LaunchEnv;
pub use store::{StoreClient, StoreServer};

use std::time::Duration;

/// Default bound of every rendezvous wait (`FICCO_DIST_TIMEOUT_MS` overrides).
pub const DEFAULT_TIMEOUT: Duration =
    Duration::from_millis(ficco_core::settings::DEFAULT_DIST_TIMEOUT_MS);

pub use crate::error::DistError;

/// The bound of rendezvous waits: `FICCO_DIST_TIMEOUT_MS` or [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Duration {
    Duration::from_millis(ficco_core::settings::Settings::current().dist_timeout_ms)
}

/// This machine's host name (the node identity of the rendezvous).
pub fn hostname() -> Result<String, DistError> {
    let mut buf = [0u8; 256];
    // SAFETY: a writable buffer of the length given.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return Err(DistError::Io {
            what: "gethostname".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Publishes this rank's host and reads everybody's.
fn gather_hosts(
    store: &StoreClient,
    env: &LaunchEnv,
    host: &str,
) -> Result<Vec<String>, DistError> {
    store.set(&format!("host/{}", env.rank), host.as_bytes())?;
    (0..env.world_size)
        .map(|r| {
            store
                .get(&format!("host/{r}"))
                .map(|h| String::from_utf8_lossy(&h).into_owned())
        })
        .collect()
}

/// See [`Rendezvous::fail`].
fn fail(store: &StoreClient, e: DistError) -> DistError {
    let secondary = matches!(
        e,
        DistError::PeerLost { .. } | DistError::PeerFailed { .. } | DistError::StoreLost { .. }
    );
    if !secondary {
        store.abort(&e.to_string());
    }
    e
}

/// A rank that joined its job: the store connection (and, on rank 0, the
/// store itself) and every rank's host.
pub struct Rendezvous {
    pub env: LaunchEnv,
    store: StoreClient,
    /// Rank r's host name.
    hosts: Vec<String>,
    // Dropped last: the server outlives this rank's own client.
    _server: Option<StoreServer>,
}

impl Rendezvous {
    /// Joins the job described by `env`: rank 0 hosts the store at
    /// `MASTER_ADDR:MASTER_PORT` (on every interface of that port), every
    /// rank connects, publishes its host name, and waits for everybody's,
    /// each wait bounded by `timeout`.
    pub fn join(env: LaunchEnv, timeout: Duration) -> Result<Self, DistError> {
        Self::join_as(env, timeout, &hostname()?)
    }

    /// [`Self::join`] with a given host name (tests stand in for nodes).
    pub fn join_as(env: LaunchEnv, timeout: Duration, host: &str) -> Result<Self, DistError> {
        let server = if env.rank == 0 {
            Some(StoreServer::bind(&format!("0.0.0.0:{}", env.store_port))?)
        } else {
            None
        };
        let addr = format!("{}:{}", env.master_addr, env.store_port);
        let store = StoreClient::connect(&addr, env.rank, timeout)?;
        let hosts = match gather_hosts(&store, &env, host) {
            Ok(h) => h,
            Err(e) => return Err(fail(&store, e)),
        };
        let rv = Rendezvous {
            env,
            store,
            hosts,
            _server: server,
        };
        // Everybody has every host before anybody may fail on them: a rank
        // that errors out below then cannot be mistaken for a death by a
        // rank still reading hosts.
        rv.barrier("hosts")?;
        let (env, hosts) = (&rv.env, &rv.hosts);
        let me = &hosts[env.rank];
        let local = hosts.iter().filter(|h| *h == me).count();
        if local != env.local_world_size {
            return Err(rv.fail(DistError::Mismatch(format!(
                "LOCAL_WORLD_SIZE is {} but {local} ranks report host {me:?}",
                env.local_world_size
            ))));
        }
        Ok(rv)
    }

    /// Passes `e` on after telling every other rank (their waits end with
    /// [`DistError::PeerFailed`] and this reason), unless `e` is itself
    /// another rank's failure or the store's.
    pub fn fail(&self, e: DistError) -> DistError {
        fail(&self.store, e)
    }

    /// The store (for keys of the caller's own protocol).
    pub fn store(&self) -> &StoreClient {
        &self.store
    }

    /// Rank r's host name.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether every rank runs on this rank's host: copy-engine and fused
    /// schedules need it; NCCL schedules do not.
    pub fn single_node(&self) -> bool {
        self.hosts.iter().all(|h| *h == self.hosts[self.env.rank])
    }

    /// The global ranks on this rank's node, ascending.
    pub fn local_ranks(&self) -> Vec<usize> {
        let me = &self.hosts[self.env.rank];
        (0..self.hosts.len())
            .filter(|&r| self.hosts[r] == *me)
            .collect()
    }

    /// Waits until every rank reached the barrier `name` (each name once).
    pub fn barrier(&self, name: &str) -> Result<(), DistError> {
        self.barrier_inner(name).map_err(|e| self.fail(e))
    }

    fn barrier_inner(&self, name: &str) -> Result<(), DistError> {
        let key = format!("barrier/{name}");
        let n = self.store.add(&key, 1)?;
        if n == self.env.world_size as u64 {
            self.store.set(&format!("{key}/done"), &[])?;
        }
        self.store.get(&format!("{key}/done")).map(|_| ())
    }

    /// `root`'s bytes at every rank: `root` passes `Some`, the others `None`.
    pub fn broadcast(
        &self,
        name: &str,
        root: usize,
        value: Option<&[u8]>,
    ) -> Result<Vec<u8>, DistError> {
        let key = format!("bcast/{name}/{root}");
        if self.env.rank == root {
            let v = value.ok_or_else(|| {
                DistError::Mismatch(format!(
                    "broadcast {name}: the root rank {root} gave no value"
                ))
            })?;
            self.store.set(&key, v)?;
            return Ok(v.to_vec());
        }
        self.store.get(&key)
    }

    /// Every rank's bytes, by rank (each rank passes its own).
    pub fn all_gather(&self, name: &str, value: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        self.all_gather_inner(name, value).map_err(|e| self.fail(e))
    }

    fn all_gather_inner(&self, name: &str, value: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        self.store
            .set(&format!("gather/{name}/{}", self.env.rank), value)?;
        (0..self.env.world_size)
            .map(|r| self.store.get(&format!("gather/{name}/{r}")))
            .collect()
    }

    /// Leaves the job cleanly: a last barrier (so rank 0 keeps the store up
    /// until everybody is done with it), then goodbye.
    pub fn close(self) -> Result<(), DistError> {
        let r = self.barrier("close");
        self.store.bye();
        r
    }
}

/// Which GPUs the children of [`run_children`] see.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildGpus {
    /// Only the first GPU this process sees (`CUDA_VISIBLE_DEVICES`): for
    /// ranks that all run on GPU 0, whose driver then starts on one GPU,
    /// not on every GPU of the machine (on 4 GPUs each child otherwise pays
    /// for the other three, e.g. `info`'s contexts).
    First,
    /// Every GPU this process sees (ranks on GPUs of their own).
    All,
}

/// Runs this test binary again as the `world` ranks of a job on this
/// machine: each child runs only test `test` (exact name, `--include-ignored`
/// as GPU tests are ignored) with the launcher variables and `child_var=1`,
/// seeing the GPUs `gpus` says; children still running after `limit` are
/// killed. Returns the exit codes (`None`: killed or by a signal). Fails
/// when the binary has no test of that name.
#[cfg(test)]
pub(crate) fn run_children(
    test: &str,
    world: usize,
    child_var: &str,
    gpus: ChildGpus,
    limit: Duration,
) -> Vec<Option<i32>> {
    use std::process::{Command, Stdio};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let exe = std::env::current_exe().expect("test binary");
    // A child that matches no test exits 0 having run nothing: check the name
    // first (a module move once left a test passing without its ranks).
    let listed = Command::new(&exe)
        .args([test, "--exact", "--list"])
        .output()
        .expect("list the tests");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.lines().any(|l| l == format!("{test}: test")),
        "run_children: this binary has no test named '{test}':\n{listed}"
    );
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args([
                test,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(LaunchEnv::vars_for(r, world, "127.0.0.1", port))
            .env(child_var, "1")
            .env("FICCO_DIST_TIMEOUT_MS", "30000")
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
            if gpus == ChildGpus::First {
                let (var, first) = ficco_testkit::first_gpu_only();
                c.env(var, first);
            }
            c.spawn().expect("spawn a rank")
        })
        .collect();
    let t0 = std::time::Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; world];
    while codes.iter().any(|c| c.is_none()) && t0.elapsed() < limit {
        for (k, c) in kids.iter_mut().zip(codes.iter_mut()) {
            if c.is_none() {
                *c = k.try_wait().expect("try_wait").map(|s| s.code());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for k in kids.iter_mut() {
        let _ = k.kill();
        let _ = k.wait();
    }
    codes.into_iter().map(|c| c.flatten()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_children_runs_the_named_test_and_refuses_an_unknown_name() {
        const CHILD: &str = "FICCO_TEST_RUN_CHILDREN_CHILD";
        if std::env::var_os(CHILD).is_some() {
            return; // a child: its run is the point
        }
        let me = "runtime::tests::run_children_runs_the_named_test_and_refuses_an_unknown_name";
        let codes = run_children(me, 2, CHILD, ChildGpus::All, Duration::from_secs(30));
        assert_eq!(codes, vec![Some(0), Some(0)]);
        let unknown = std::panic::catch_unwind(|| {
            run_children(
                "runtime::tests::no_such_test",
                1,
                CHILD,
                ChildGpus::All,
                Duration::from_secs(5),
            )
        });
        assert!(
            unknown.is_err(),
            "an unknown name must fail, not run nothing"
        );
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    }

    fn env(rank: usize, world: usize, local_world: usize, port: u16) -> LaunchEnv {
        LaunchEnv {
            rank,
            world_size: world,
            local_rank: rank % local_world,
            local_world_size: local_world,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            store_port: port,
        }
    }

    /// Four ranks as threads: hosts, barrier, broadcast of a 128-byte id
    /// (the NCCL unique id's size) and an all-gather, exactly.
    #[test]
    fn four_threads_rendezvous_and_exchange_exactly() {
        let port = free_port();
        let id: Vec<u8> = (0..128u32).map(|i| (i * 7 + 3) as u8).collect();
        let handles: Vec<_> = (0..4)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let rv = Rendezvous::join_as(env(r, 4, 4, port), Duration::from_secs(10), "n0")
                        .expect("join");
                    assert!(rv.single_node());
                    assert_eq!(rv.local_ranks(), vec![0, 1, 2, 3]);
                    rv.barrier("b1").expect("barrier");
                    let got = rv
                        .broadcast("nccl-id", 0, (r == 0).then_some(&id[..]))
                        .expect("bcast");
                    assert_eq!(got, id);
                    let all = rv.all_gather("ranks", &[r as u8; 3]).expect("gather");
                    assert_eq!(all, (0..4).map(|q| vec![q as u8; 3]).collect::<Vec<_>>());
                    rv.close().expect("close");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    }

    /// Two "nodes" of two ranks: not single-node, local ranks per host.
    #[test]
    fn hostnames_split_the_job_into_nodes() {
        let port = free_port();
        let handles: Vec<_> = (0..4)
            .map(|r| {
                std::thread::spawn(move || {
                    let host = if r < 2 { "a" } else { "b" };
                    let rv = Rendezvous::join_as(env(r, 4, 2, port), Duration::from_secs(10), host)
                        .expect("join");
                    assert!(!rv.single_node());
                    let want = if r < 2 { vec![0, 1] } else { vec![2, 3] };
                    assert_eq!(rv.local_ranks(), want);
                    rv.close().expect("close");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    }

    /// A rank that never arrives: the others fail within the bound, naming it.
    #[test]
    fn a_missing_rank_times_out_naming_it() {
        let port = free_port();
        let t0 = std::time::Instant::now();
        let handles: Vec<_> = (0..2)
            .map(|r| {
                std::thread::spawn(move || {
                    Rendezvous::join_as(env(r, 3, 3, port), Duration::from_millis(500), "n0").err()
                })
            })
            .collect();
        for h in handles {
            // Its own timeout, or the other rank's (which gave up first).
            let e = h.join().expect("rank thread").expect("an error");
            assert!(
                matches!(&e, DistError::Timeout { key, .. } if key == "host/2")
                    || matches!(&e, DistError::PeerFailed { rank: 0 | 1, .. }),
                "{e:?}"
            );
            assert!(e.to_string().contains("rank 2 never arrived"), "{e}");
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// LOCAL_WORLD_SIZE that does not match the hosts is refused.
    #[test]
    fn a_local_world_size_that_contradicts_the_hosts_is_an_error() {
        let port = free_port();
        let handles: Vec<_> = (0..2)
            .map(|r| {
                std::thread::spawn(move || {
                    Rendezvous::join_as(env(r, 2, 1, port), Duration::from_secs(5), "same").err()
                })
            })
            .collect();
        for h in handles {
            let e = h.join().expect("rank thread").expect("an error");
            let text = e.to_string();
            assert!(
                matches!(e, DistError::Mismatch(_) | DistError::PeerFailed { .. }),
                "{e:?}"
            );
            assert!(text.contains("LOCAL_WORLD_SIZE is 1 but 2 ranks"), "{text}");
        }
    }
}
