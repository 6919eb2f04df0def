//! The launcher environment: what `torchrun` (and `ficco explore --procs N`)
//! put in every rank's environment, parsed into a checked [`LaunchEnv`].

use super::auth::JobSecret;
use super::DistError;
use std::net::IpAddr;

/// The variables every rank needs, as `torchrun` sets them.
pub const VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// One rank's place in the job, checked for consistency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    pub world_size: usize,
    /// Rank on this node, `0..local_world_size`; also the GPU ordinal it drives.
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Where rank 0 hosts the store.
    pub master_addr: String,
    pub master_port: u16,
    /// The port of ficco's store on `master_addr`: `FICCO_STORE_PORT` if
    /// set; else `MASTER_PORT + 1` when torchrun's agent already serves its
    /// own store on `MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`);
    /// else `MASTER_PORT`.
    pub store_port: u16,
    /// The job secret, when the launcher gives one (`FICCO_JOB_SECRET`);
    /// else [`super::auth::SecretSource::for_env`] decides.
    pub secret: Option<JobSecret>,
    /// Where rank 0's store listens (`FICCO_STORE_BIND`); else 127.0.0.1
    /// on one node, the address `master_addr` resolves to on several.
    pub store_bind: Option<IpAddr>,
}

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, DistError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get` (tests pass a map; the process uses
    /// [`Self::from_env`]), so a missing or malformed one is named.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, DistError> {
        let text = |var: &'static str| -> Result<String, DistError> {
            match get(var) {
                Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
                _ => Err(DistError::MissingVar { var }),
            }
        };
        let num = |var: &'static str| -> Result<usize, DistError> {
            let v = text(var)?;
            v.parse::<usize>().map_err(|_| DistError::InvalidVar {
                var,
                value: v,
                why: "not a non-negative integer",
            })
        };
        let rank = num("RANK")?;
        let world_size = num("WORLD_SIZE")?;
        let local_rank = num("LOCAL_RANK")?;
        let local_world_size = num("LOCAL_WORLD_SIZE")?;
        let master_addr = text("MASTER_ADDR")?;
        let port_text = text("MASTER_PORT")?;
        let master_port = match port_text.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(DistError::InvalidVar {
                    var: "MASTER_PORT",
                    value: port_text,
                    why: "not a TCP port (1 to 65535)",
                })
            }
        };
        let agent_store = get("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| matches!(v.trim(), "True" | "true" | "1"));
        // Listed with ficco's other variables (ficco_core::settings); read
        // here, beside the MASTER_PORT it is derived from.
        let store_port = match get(ficco_core::settings::STORE_PORT).filter(|v| !v.trim().is_empty()) {
            Some(v) => match v.trim().parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => {
                    return Err(DistError::InvalidVar {
                        var: "FICCO_STORE_PORT",
                        value: v,
                        why: "not a TCP port (1 to 65535)",
                    })
                }
            },
            None if agent_store => master_port.checked_add(1).ok_or(DistError::InvalidVar {
                var: "MASTER_PORT",
                value: master_port.to_string(),
                why: "torchrun's agent store takes it and ficco's store needs the next port; set FICCO_STORE_PORT",
            })?,
            None => master_port,
        };
        let (secret, store_bind) = Self::security_from_lookup(&get)?;
        let bad = |var: &'static str, value: usize, why: &'static str| DistError::InvalidVar {
            var,
            value: value.to_string(),
            why,
        };
        if world_size == 0 {
            return Err(bad("WORLD_SIZE", world_size, "must be at least 1"));
        }
        if rank >= world_size {
            return Err(bad("RANK", rank, "must be below WORLD_SIZE"));
        }
        if local_world_size == 0 || local_world_size > world_size {
            return Err(bad(
                "LOCAL_WORLD_SIZE",
                local_world_size,
                "must be between 1 and WORLD_SIZE",
            ));
        }
        if local_rank >= local_world_size {
            return Err(bad(
                "LOCAL_RANK",
                local_rank,
                "must be below LOCAL_WORLD_SIZE",
            ));
        }
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            store_port,
            secret,
            store_bind,
        })
    }

    /// `FICCO_JOB_SECRET` and `FICCO_STORE_BIND` through `get` (the Python
    /// constructor reads them too), each checked; unset or empty is `None`.
    pub fn security_from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(Option<JobSecret>, Option<IpAddr>), DistError> {
        use ficco_core::settings::{JOB_SECRET, STORE_BIND};
        let set = |var: &str| get(var).filter(|v| !v.trim().is_empty());
        let secret = match set(JOB_SECRET) {
            Some(v) => Some(JobSecret::from_hex(&v).ok_or(DistError::InvalidVar {
                var: JOB_SECRET,
                // Never echo (part of) a secret into a log.
                value: format!("<{} characters>", v.trim().len()),
                why: "not 64 hex digits (e.g. `openssl rand -hex 32`)",
            })?),
            None => None,
        };
        let store_bind = match set(STORE_BIND) {
            Some(v) => Some(
                v.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| DistError::InvalidVar {
                        var: STORE_BIND,
                        value: v,
                        why: "not an IP address",
                    })?,
            ),
            None => None,
        };
        Ok((secret, store_bind))
    }

    /// Whether every rank of the job runs on this node.
    pub fn one_node(&self) -> bool {
        self.local_world_size == self.world_size
    }

    /// The variables of rank `rank` of a single-node job of `world` ranks
    /// whose store is at `addr:port` and whose secret is `secret` (what a
    /// launcher of child processes, such as the tests, gives each child;
    /// the launcher draws the secret once for all of them).
    pub fn vars_for(
        rank: usize,
        world: usize,
        addr: &str,
        port: u16,
        secret: &JobSecret,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", world.to_string()),
            ("MASTER_ADDR", addr.to_string()),
            ("MASTER_PORT", port.to_string()),
            // Explicit, so a torchrun variable inherited from the parent
            // cannot move the store.
            ("FICCO_STORE_PORT", port.to_string()),
            (ficco_core::settings::JOB_SECRET, secret.to_hex()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv, DistError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(|k| m.get(k).cloned())
    }

    const GOOD: [(&str, &str); 6] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
    ];

    fn with(var: &str, value: Option<&str>) -> Result<LaunchEnv, DistError> {
        let pairs: Vec<(&str, &str)> = GOOD
            .iter()
            .filter(|(k, _)| *k != var)
            .copied()
            .chain(value.map(|v| (var, v)))
            .collect();
        env(&pairs)
    }

    #[test]
    fn a_torchrun_environment_parses() {
        let e = env(&GOOD).expect("valid");
        assert_eq!(
            e,
            LaunchEnv {
                rank: 3,
                world_size: 8,
                local_rank: 3,
                local_world_size: 4,
                master_addr: "node0".into(),
                master_port: 29500,
                store_port: 29500,
                secret: None,
                store_bind: None,
            }
        );
    }

    #[test]
    fn the_store_port_avoids_torchruns_agent_store_or_follows_the_override() {
        let port = |extra: &[(&str, &str)]| {
            let mut pairs: Vec<(&str, &str)> = GOOD.to_vec();
            pairs.extend_from_slice(extra);
            env(&pairs).map(|e| e.store_port)
        };
        assert_eq!(port(&[]).expect("plain"), 29500);
        assert_eq!(
            port(&[("TORCHELASTIC_USE_AGENT_STORE", "True")]).expect("agent store"),
            29501
        );
        assert_eq!(
            port(&[("TORCHELASTIC_USE_AGENT_STORE", "False")]).expect("no agent store"),
            29500
        );
        assert_eq!(
            port(&[
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                ("FICCO_STORE_PORT", "4444")
            ])
            .expect("override"),
            4444
        );
        assert!(matches!(
            port(&[("FICCO_STORE_PORT", "0")]),
            Err(DistError::InvalidVar {
                var: "FICCO_STORE_PORT",
                ..
            })
        ));
    }

    #[test]
    fn the_secret_and_the_bind_address_are_checked_and_the_secret_never_echoed() {
        let hex = "ab".repeat(32);
        let e = with("FICCO_JOB_SECRET", Some(&hex)).expect("a secret");
        assert_eq!(e.secret, JobSecret::from_hex(&hex));
        let mut pairs: Vec<(&str, &str)> = GOOD.to_vec();
        pairs.push(("FICCO_STORE_BIND", "10.1.2.3"));
        assert_eq!(
            env(&pairs).expect("bind").store_bind,
            Some("10.1.2.3".parse().expect("ip"))
        );
        let short = "ab".repeat(31);
        match with("FICCO_JOB_SECRET", Some(&short)) {
            Err(
                e @ DistError::InvalidVar {
                    var: "FICCO_JOB_SECRET",
                    ..
                },
            ) => assert!(!e.to_string().contains(&short), "{e}"),
            other => panic!("{other:?}"),
        }
        pairs.pop();
        pairs.push(("FICCO_STORE_BIND", "node0"));
        assert!(matches!(
            env(&pairs),
            Err(DistError::InvalidVar {
                var: "FICCO_STORE_BIND",
                ..
            })
        ));
    }

    #[test]
    fn each_missing_variable_is_named() {
        for var in VARS {
            for value in [None, Some(""), Some("  ")] {
                match with(var, value) {
                    Err(DistError::MissingVar { var: v }) => assert_eq!(v, var),
                    other => panic!("{var}={value:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn malformed_and_inconsistent_values_are_rejected_with_the_variable() {
        let cases = [
            ("RANK", "-1"),
            ("RANK", "8"),
            ("RANK", "x"),
            ("WORLD_SIZE", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "4"),
            ("LOCAL_WORLD_SIZE", "0"),
            ("LOCAL_WORLD_SIZE", "9"),
            ("MASTER_PORT", "0"),
            ("MASTER_PORT", "65536"),
            ("MASTER_PORT", "http"),
        ];
        for (var, value) in cases {
            match with(var, Some(value)) {
                Err(DistError::InvalidVar {
                    var: v, value: got, ..
                }) => {
                    // WORLD_SIZE=2 makes RANK=3 the inconsistent one.
                    let expect = if (var, value) == ("WORLD_SIZE", "2") {
                        "RANK"
                    } else {
                        var
                    };
                    assert_eq!(v, expect, "{var}={value}");
                    if v == var {
                        assert_eq!(got, value);
                    }
                }
                other => panic!("{var}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn vars_for_round_trips() {
        let secret = JobSecret::generate().expect("random");
        let v = LaunchEnv::vars_for(1, 4, "127.0.0.1", 4000, &secret);
        let m: HashMap<&str, String> = v.into_iter().collect();
        let e = LaunchEnv::from_lookup(|k| m.get(k).cloned()).expect("valid");
        assert_eq!(e.secret, Some(secret));
        assert!(e.one_node());
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (1, 4, 1, 4)
        );
        assert_eq!((e.master_addr.as_str(), e.master_port), ("127.0.0.1", 4000));
        assert_eq!(e.store_port, 4000);
    }
}
