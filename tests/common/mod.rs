//! What the CLI tests share: the real `autopar` binary, scratch files, and
//! one check of a refused invocation, `(arguments, exit code, needles)`, so
//! that every bad-input case is a row of data checked the same way (one
//! `error:` line, no panic, each needle named).
//!
//! Every test file is a crate of its own that uses part of this module;
//! the rest would be reported as dead code in that crate.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The repository's `fixtures/` folder.
pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

/// The `autopar` binary, to be given arguments. CPU runs predict from
/// nominal figures, so that no test measures this host or writes a profile
/// into the home folder's cache (a test of the host profile sets
/// `AUTOPAR_NOMINAL_CPU=0` and its own `AUTOPAR_CACHE_DIR`).
pub fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_autopar"));
    command.env("AUTOPAR_NOMINAL_CPU", "1");
    command
}

/// `autopar args…`: exit code (-1 when killed by a signal), stdout, stderr.
pub fn autopar(args: &[&str]) -> (i32, String, String) {
    autopar_with(args, &[])
}

/// [`autopar`] with extra environment variables.
pub fn autopar_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = binary().args(args).envs(env.iter().copied()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A path named `name` in this test binary's scratch folder (one per
/// process, created on first use; the file itself is not).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "autopar-{}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A folder named `name` in the scratch folder, created.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `bytes` written to the scratch file `name`.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs `autopar args…` and asserts a clean failure: exit `code`, no panic,
/// one `error:` line on stderr containing every one of `needles`. Returns
/// stdout (what ran before the failure may have reported), for callers
/// that check it.
pub fn assert_error(args: &[&str], code: i32, needles: &[&str]) -> String {
    assert_error_with(args, &[], code, needles)
}

/// [`assert_error`] with extra environment variables.
pub fn assert_error_with(args: &[&str], env: &[(&str, &str)], code: i32, needles: &[&str]) -> String {
    let (got, out, err) = autopar_with(args, env);
    assert_eq!(got, code, "{args:?}:\n{out}{err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line expected:\n{err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
    }
    out
}

/// Runs `autopar args…` and asserts that the argument parser refused it:
/// exit 2, no panic, an `error:` first line, and every one of `needles` in
/// the message (which goes on with usage lines).
pub fn assert_usage_error(args: &[&str], needles: &[&str]) {
    let (code, _, err) = autopar(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
    }
}

/// A loopback port no other test of this process is using.
pub fn free_port() -> u16 {
    autopar_comm::launch::loopback_test_port().expect("a free loopback port")
}

/// `autopar args…` as rank `rank` of `world` processes meeting on loopback `port`.
pub fn launched(rank: usize, world: usize, port: u16, args: &[&str]) -> std::process::Child {
    binary()
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// `autopar run args… --json`, which must succeed; its report.
pub fn run_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, stdout, err) = autopar(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `autopar args…` as `world` processes of one launched job, each of which
/// must succeed; their outputs in rank order.
pub fn launch_all(world: usize, args: &[&str]) -> Vec<std::process::Output> {
    let port = free_port();
    let children: Vec<_> = (0..world).map(|rank| launched(rank, world, port, args)).collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (rank, out) in outputs.iter().enumerate() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "rank {rank}: {err}");
    }
    outputs
}

/// Megatron-LM's 1T-parameter GPT (Narayanan et al., SC'21).
pub const GPT_1T: &str = "gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048,dtype=bf16";

/// Plans [`GPT_1T`] on 3,072 A100s, as Megatron-LM ran it, into `out`:
/// tensor, sequence and interleaved pipeline parallelism, ZeRO-1.
pub fn plan_1t(out: &std::path::Path) {
    let (code, _, err) = autopar(&[
        "plan",
        GPT_1T,
        "--cluster",
        "dgx-a100-80g",
        "--gpus",
        "3072",
        "--global-batch",
        "3072",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
}
