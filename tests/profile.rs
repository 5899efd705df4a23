//! `autopar profile` through the real binary: the file it writes loads as a
//! calibration, and a bad output path fails before any measuring.

use autopar_cost_models::Calibration;
use std::path::PathBuf;
use std::process::Command;

fn autopar(args: &[&str]) -> (i32, String, String) {
    autopar_with(args, &[])
}

fn autopar_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_autopar"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("autopar-profile-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn quick_cpu_profile_writes_a_loadable_calibration() {
    let path = scratch_dir("ok").join("cpu.json");
    let (code, out, err) = autopar(&[
        "profile",
        "--backend",
        "cpu",
        "-o",
        path.to_str().unwrap(),
        "--quick",
    ]);
    assert_eq!(code, 0, "{err}");
    let cal = Calibration::load(&path).unwrap();
    assert!(!cal.matmul.measured.is_empty());
    assert!(cal.memory.measured_bytes_per_s.is_some());
    assert!(cal.network.measured_intra_node_bytes_per_s.is_some());
    assert!(
        out.contains("matmul f32:") && out.contains("ring all-reduce:"),
        "{out}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn missing_output_folder_is_a_clean_error_and_writes_nothing() {
    let dir = scratch_dir("missing").join("no-such-folder");
    let path = dir.join("cpu.json");
    let (code, out, err) = autopar(&[
        "profile",
        "--backend",
        "cpu",
        "-o",
        path.to_str().unwrap(),
        "--quick",
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("no-such-folder") && err.contains("does not exist"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    assert!(!dir.exists());
}

#[test]
fn unknown_backend_is_a_usage_error() {
    let (code, _, err) = autopar(&["profile", "--backend", "tpu", "-o", "x.json"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("tpu") && err.contains("cpu") && err.contains("cuda"),
        "{err}"
    );
}

#[test]
fn cuda_without_a_gpu_fails_in_one_line_and_writes_nothing() {
    if autopar_runtime::cuda::probe(0).is_ok() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpu.json");
    // Alone, and as rank 0 of a launched job whose peer never comes: the
    // missing GPU is reported at once, before any wait for peers.
    let launched = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29999"),
        ("AUTOPAR_RENDEZVOUS_TIMEOUT", "60"),
    ];
    for env in [&[][..], &launched[..]] {
        let began = std::time::Instant::now();
        let (code, _, err) = autopar_with(
            &["profile", "--backend", "cuda", "-o", out.to_str().unwrap()],
            env,
        );
        assert_eq!(code, 2, "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("--backend cuda") && (err.contains("CUDA") || err.contains("GPU")),
            "{err}"
        );
        assert!(began.elapsed().as_secs() < 30, "waited for peers: {err}");
        assert!(!out.exists());
    }
}
