//! `autopar profile` through the real binary: the file it writes loads as a
//! calibration, and a bad output path fails before any measuring.

mod common;

use autopar_cost_models::Calibration;
use common::{assert_error, assert_usage_error, autopar, autopar_with, scratch_dir};

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
    let args = [
        "profile",
        "--backend",
        "cpu",
        "-o",
        path.to_str().unwrap(),
        "--quick",
    ];
    let out = assert_error(&args, 2, &["no-such-folder", "does not exist"]);
    assert!(out.is_empty(), "{out}");
    assert!(!dir.exists());
}

#[test]
fn unknown_backend_is_a_usage_error() {
    assert_usage_error(
        &["profile", "--backend", "tpu", "-o", "x.json"],
        &["tpu", "cpu", "cuda"],
    );
}

#[test]
fn cuda_without_a_gpu_fails_in_one_line_and_writes_nothing() {
    if autopar_cuda::probe(0).is_ok() {
        eprintln!("skipped cuda_without_a_gpu_fails_in_one_line_and_writes_nothing: this machine has a GPU");
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
