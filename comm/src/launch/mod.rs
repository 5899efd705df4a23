//! Multi-process launches: where this process sits in the job.
//!
//! `autopar run` under the launchers people already use (torchrun, Slurm's
//! `srun`) reads its rank, world size and node-local rank (which picks the
//! GPU) from their variables; [`rendezvous`] then lets the processes find
//! each other through rank 0. Pure std, so it builds and is tested with or
//! without the `cuda` feature.

pub mod rendezvous;

/// torch's default rendezvous port, used when MASTER_ADDR comes without MASTER_PORT.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Which launcher started this process, to word errors and pick conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun, or anything else that sets RANK / WORLD_SIZE.
    Torchrun,
    /// Slurm's `srun` (SLURM_PROCID without RANK).
    Slurm,
    /// No launcher variables: one process, rank 0 of 1.
    Single,
}

/// Where this process sits in the job and how to reach rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    /// Rank among the processes on this node: picks the GPU ordinal.
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Host rank 0 listens on (it binds this address).
    pub master_addr: String,
    /// The port rank 0 serves a multi-process run's rendezvous on; see
    /// [`LaunchEnv::from_lookup`].
    pub master_port: u16,
    pub launcher: Launcher,
}

/// Why the launch environment is unusable.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{var} is not set: {why}")]
    Missing { var: &'static str, why: String },
    #[error("{var}='{value}' is invalid: expected {expected}")]
    BadValue {
        var: &'static str,
        value: String,
        expected: String,
    },
}

fn bad(var: &'static str, value: impl ToString, expected: impl Into<String>) -> LaunchError {
    let (value, expected) = (value.to_string(), expected.into());
    LaunchError::BadValue { var, value, expected }
}

fn missing(var: &'static str, why: impl Into<String>) -> LaunchError {
    LaunchError::Missing { var, why: why.into() }
}

/// A variable's value, trimmed; empty counts as unset (`export RANK=`).
type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

fn number(get: Get, var: &'static str) -> Result<Option<usize>, LaunchError> {
    get(var)
        .map(|v| v.parse().map_err(|_| bad(var, &v, "a non-negative integer")))
        .transpose()
}

fn require(get: Get, var: &'static str, why: &str) -> Result<usize, LaunchError> {
    number(get, var)?.ok_or_else(|| missing(var, why))
}

fn port(var: &'static str, value: &str) -> Result<u16, LaunchError> {
    match value.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(var, value, "a TCP port in 1..=65535")),
    }
}

/// A name and the value read from it, so checks can name both.
type Var = (&'static str, usize);

impl LaunchEnv {
    /// Reads the real process environment (non-UTF-8 values are shown lossily).
    pub fn from_env() -> Result<Self, LaunchError> {
        Self::from_lookup(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }

    /// One process, no launcher: what a plain `autopar run` gets.
    pub fn single() -> Self {
        LaunchEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".to_string(),
            master_port: DEFAULT_MASTER_PORT,
            launcher: Launcher::Single,
        }
    }

    /// Rank `rank` of `world_size` processes on this host, meeting on
    /// 127.0.0.1:`port` (tests, and single-host launches by hand).
    pub fn loopback(rank: usize, world_size: usize, port: u16) -> Self {
        LaunchEnv {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            master_addr: "127.0.0.1".to_string(),
            master_port: port,
            launcher: Launcher::Torchrun,
        }
    }

    /// "host:port" of rank 0's rendezvous, for messages.
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }

    /// Parses launcher variables from `lookup` (injectable for tests).
    ///
    /// RANK (or WORLD_SIZE) selects torchrun conventions; LOCAL_WORLD_SIZE
    /// defaults to WORLD_SIZE and LOCAL_RANK to RANK mod LOCAL_WORLD_SIZE, for
    /// hand-rolled single-node launchers. Otherwise SLURM_PROCID selects Slurm,
    /// with ranks per node from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE
    /// ("4", "4(x2),3"; uneven nodes are indexed by SLURM_NODEID). Neither:
    /// [`LaunchEnv::single`]. MASTER_ADDR is required when the world has more
    /// than one rank. The port is AUTOPAR_MASTER_PORT if set, else MASTER_PORT
    /// (default 29500), plus one when TORCHELASTIC_USE_AGENT_STORE=True,
    /// because then torchrun's agent already serves its store on MASTER_PORT.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchError> {
        let get = move |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let get: Get = &get;
        if get("RANK").is_some() || (get("SLURM_PROCID").is_none() && get("WORLD_SIZE").is_some()) {
            let why = "torchrun-style launches set RANK and WORLD_SIZE together";
            let rank = ("RANK", require(get, "RANK", why)?);
            let world = ("WORLD_SIZE", require(get, "WORLD_SIZE", why)?);
            let local_world = (
                "LOCAL_WORLD_SIZE",
                number(get, "LOCAL_WORLD_SIZE")?.unwrap_or(world.1),
            );
            let local_rank = (
                "LOCAL_RANK",
                number(get, "LOCAL_RANK")?.unwrap_or(rank.1 % local_world.1.max(1)),
            );
            Self::checked(get, Launcher::Torchrun, [rank, world, local_rank, local_world])
        } else if get("SLURM_PROCID").is_some() {
            let why = "srun sets it together with SLURM_PROCID";
            let rank = ("SLURM_PROCID", require(get, "SLURM_PROCID", why)?);
            let world = ("SLURM_NTASKS", require(get, "SLURM_NTASKS", why)?);
            let local_rank = ("SLURM_LOCALID", require(get, "SLURM_LOCALID", why)?);
            let local_world = slurm_tasks_on_this_node(get)?;
            Self::checked(get, Launcher::Slurm, [rank, world, local_rank, local_world])
        } else {
            Ok(Self::single())
        }
    }

    /// Cross-checks [rank, world, local rank, local world] and reads rank 0's address.
    fn checked(get: Get, launcher: Launcher, counts: [Var; 4]) -> Result<Self, LaunchError> {
        let [rank, world, local_rank, local_world] = counts;
        for (var, value) in [world, local_world] {
            if value == 0 {
                return Err(bad(var, value, "a positive integer"));
            }
        }
        if local_world.1 > world.1 {
            return Err(bad(
                local_world.0,
                local_world.1,
                format!("at most {}={}", world.0, world.1),
            ));
        }
        for ((var, value), (limit_var, limit)) in [(rank, world), (local_rank, local_world)] {
            if value >= limit {
                return Err(bad(var, value, format!("below {limit_var}={limit}")));
            }
        }
        let master_addr = match get("MASTER_ADDR") {
            Some(addr) => addr,
            None if world.1 == 1 => "127.0.0.1".to_string(),
            None => {
                let why = format!(
                    "{}={} ranks need rank 0's host (e.g. the first node's name)",
                    world.0, world.1
                );
                return Err(missing("MASTER_ADDR", why));
            }
        };
        let master_port = match get("AUTOPAR_MASTER_PORT") {
            Some(p) => port("AUTOPAR_MASTER_PORT", &p)?,
            None => {
                let base = get("MASTER_PORT").map_or(Ok(DEFAULT_MASTER_PORT), |p| port("MASTER_PORT", &p))?;
                let agent_store = get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True");
                if launcher == Launcher::Torchrun && agent_store {
                    base.checked_add(1).ok_or_else(|| {
                        bad("MASTER_PORT", base, "below 65535: torchrun's agent store holds it and autopar uses the next port (or set AUTOPAR_MASTER_PORT)")
                    })?
                } else {
                    base
                }
            }
        };
        Ok(LaunchEnv {
            rank: rank.1,
            world_size: world.1,
            local_rank: local_rank.1,
            local_world_size: local_world.1,
            master_addr,
            master_port,
            launcher,
        })
    }
}

/// Ranks on this node from Slurm's compressed per-node counts: "4", "4(x2)",
/// or uneven "4(x2),3", where SLURM_NODEID says which node this is.
fn slurm_tasks_on_this_node(get: Get) -> Result<Var, LaunchError> {
    let (var, spec) = ["SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
        .into_iter()
        .find_map(|var| get(var).map(|spec| (var, spec)))
        .ok_or_else(|| {
            missing(
                "SLURM_NTASKS_PER_NODE",
                "neither it nor SLURM_TASKS_PER_NODE gives ranks per node",
            )
        })?;
    let parse_run = |part: &str| -> Option<(usize, usize)> {
        match part.strip_suffix(')').and_then(|p| p.split_once("(x")) {
            Some((count, reps)) => Some((count.parse().ok()?, reps.parse().ok().filter(|&r| r > 0)?)),
            None => Some((part.parse().ok()?, 1)),
        }
    };
    let runs: Vec<(usize, usize)> = spec
        .split(',')
        .map(parse_run)
        .collect::<Option<_>>()
        .ok_or_else(|| bad(var, &spec, "per-node counts like '4', '4(x2)' or '4(x2),3'"))?;
    if runs.iter().all(|run| run.0 == runs[0].0) {
        return Ok((var, runs[0].0));
    }
    let node = require(
        get,
        "SLURM_NODEID",
        &format!("{var}='{spec}' differs between nodes"),
    )?;
    let mut first = 0usize;
    for (count, reps) in runs {
        first = first.saturating_add(reps);
        if node < first {
            return Ok((var, count));
        }
    }
    Err(bad(
        "SLURM_NODEID",
        node,
        format!("below the {first} nodes of {var}='{spec}'"),
    ))
}

/// A loopback port for tests whose ranks meet on it: free when returned,
/// never returned twice by one process, and below the kernel's ephemeral
/// range. A port from `bind(0)` is in that range, so any outgoing
/// connection on the host (another test's rank dialling its rank 0) may
/// take it before this test's rank 0 listens; this one it cannot.
pub fn loopback_test_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral = ephemeral_ports_start().max(LOWEST + 1);
    let span = ephemeral - LOWEST;
    // Processes start at different places so that concurrent test binaries
    // rarely probe the same ports.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = (LOWEST + offset) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("every loopback port from {LOWEST} to {ephemeral} is taken"),
    ))
}

/// The first port the kernel hands out for outgoing connections (Linux's
/// `ip_local_port_range`; the IANA range's start elsewhere).
fn ephemeral_ports_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .filter(|&p: &u32| p <= u32::from(u16::MAX))
        .unwrap_or(49_152)
}

#[cfg(test)]
pub(crate) fn free_port() -> u16 {
    loopback_test_port().expect("a free loopback port")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses "K=V K=V ..." (a later K wins; "K=" unsets it, as an empty value does).
    fn parse(spec: &str) -> Result<LaunchEnv, LaunchError> {
        let vars: Vec<(String, String)> = spec
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(move |k| {
            vars.iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        })
    }

    const TORCHRUN: &str =
        "RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=4 MASTER_ADDR=node0 MASTER_PORT=29400";
    const SLURM: &str =
        "SLURM_PROCID=6 SLURM_NTASKS=8 SLURM_LOCALID=2 SLURM_NTASKS_PER_NODE=4(x2) MASTER_ADDR=gpu001";

    /// [rank, world_size, local_rank, local_world_size] and rank 0's address.
    fn env([rank, world_size, local_rank, local_world_size]: [usize; 4], addr: &str, port: u16) -> LaunchEnv {
        let (master_addr, master_port, launcher) = (addr.to_string(), port, Launcher::Torchrun);
        LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
        }
    }

    #[test]
    fn torchrun_variables() {
        assert_eq!(parse(TORCHRUN).unwrap(), env([5, 8, 1, 4], "node0", 29400));
        // The agent store holds MASTER_PORT, so the next port; an explicit override wins.
        let agent = format!("{TORCHRUN} TORCHELASTIC_USE_AGENT_STORE=True");
        assert_eq!(parse(&agent).unwrap().master_port, 29401);
        let overridden = parse(&format!("{agent} AUTOPAR_MASTER_PORT=31000")).unwrap();
        assert_eq!(overridden.master_port, 31000);
        // Without LOCAL_*: one node holds the whole world; without MASTER_PORT: 29500.
        let bare = parse("RANK=3 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1").unwrap();
        assert_eq!(bare, env([3, 4, 3, 4], "10.0.0.1", DEFAULT_MASTER_PORT));
    }

    #[test]
    fn slurm_variables() {
        let expected = LaunchEnv {
            launcher: Launcher::Slurm,
            ..env([6, 8, 2, 4], "gpu001", DEFAULT_MASTER_PORT)
        };
        assert_eq!(parse(SLURM).unwrap(), expected);
        let plain_count = parse(&format!("{SLURM} SLURM_NTASKS_PER_NODE=4"));
        assert_eq!(plain_count.unwrap(), expected);
        // Uneven "4(x2),3": node 2 holds 3 ranks; SLURM_TASKS_PER_NODE is the fallback.
        let uneven = "SLURM_NTASKS_PER_NODE= SLURM_TASKS_PER_NODE=4(x2),3 SLURM_NTASKS=11 SLURM_NODEID=2";
        assert_eq!(parse(&format!("{SLURM} {uneven}")).unwrap().local_world_size, 3);
        // torchrun inside a Slurm allocation: RANK wins.
        let both = parse(&format!("{SLURM} {TORCHRUN}")).unwrap();
        assert_eq!(both.launcher, Launcher::Torchrun);
    }

    #[test]
    fn single_process() {
        assert_eq!(parse("").unwrap(), LaunchEnv::single());
        assert_eq!(parse("RANK=0 WORLD_SIZE=1").unwrap().master_addr, "127.0.0.1");
    }

    #[test]
    #[rustfmt::skip]
    fn bad_environments_name_the_variable_and_value() {
        let torchrun_cases = [
            ("RANK=abc", "RANK='abc' is invalid: expected a non-negative integer"),
            ("RANK=8", "RANK='8' is invalid: expected below WORLD_SIZE=8"),
            ("RANK=", "RANK is not set: torchrun-style launches set RANK"),
            ("WORLD_SIZE=0", "WORLD_SIZE='0' is invalid: expected a positive"),
            ("WORLD_SIZE=4x", "WORLD_SIZE='4x' is invalid"),
            ("MASTER_ADDR=", "MASTER_ADDR is not set: WORLD_SIZE=8 ranks need"),
            ("LOCAL_RANK=4", "LOCAL_RANK='4' is invalid: expected below LOCAL_WORLD_SIZE=4"),
            ("LOCAL_WORLD_SIZE=9", "LOCAL_WORLD_SIZE='9' is invalid: expected at most WORLD_SIZE=8"),
            ("MASTER_PORT=70000", "MASTER_PORT='70000' is invalid: expected a TCP port"),
            ("AUTOPAR_MASTER_PORT=0", "AUTOPAR_MASTER_PORT='0' is invalid"),
            ("MASTER_PORT=65535 TORCHELASTIC_USE_AGENT_STORE=True", "MASTER_PORT='65535' is invalid: expected below"),
        ];
        let slurm = "SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 MASTER_ADDR=h";
        let slurm_cases = [
            ("SLURM_NTASKS_PER_NODE=4(x)", "SLURM_NTASKS_PER_NODE='4(x)' is invalid: expected per-node"),
            ("", "SLURM_NTASKS_PER_NODE is not set: neither it nor SLURM_TASKS_PER_NODE"),
            ("SLURM_TASKS_PER_NODE=1,2", "SLURM_NODEID is not set: SLURM_TASKS_PER_NODE='1,2' differs"),
            ("SLURM_TASKS_PER_NODE=1,2 SLURM_NODEID=2", "SLURM_NODEID='2' is invalid: expected below the 2 nodes"),
            ("SLURM_TASKS_PER_NODE=2 SLURM_NTASKS=", "SLURM_NTASKS is not set: srun sets it"),
        ];
        let cases = torchrun_cases.map(|(extra, want)| (TORCHRUN, extra, want)).into_iter();
        for (base, extra, want) in cases.chain(slurm_cases.map(|(extra, want)| (slurm, extra, want))) {
            let message = parse(&format!("{base} {extra}")).expect_err(extra).to_string();
            assert!(message.starts_with(want), "{extra}: got {message}");
        }
    }

    #[test]
    fn test_ports_are_distinct_free_and_not_ephemeral() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for &port in &ports {
            assert!(u32::from(port) < ephemeral_ports_start(), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
        }
    }
}
