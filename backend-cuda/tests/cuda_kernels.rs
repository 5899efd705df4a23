//! Every CUDA kernel source compiles with NVRTC to machine code for the GPU
//! generations we target (A100 = sm_80, H100/H200 = sm_90), exports every
//! kernel the contract names, and spills no registers. NVRTC needs no GPU;
//! CI installs it with `scripts/install-nvrtc.sh` and sets
//! `AUTOPAR_REQUIRE_NVRTC=1` so that a missing library fails instead of
//! skipping.

use autopar_cuda::{compile_all, kernels, CudaError, KernelReport};
use std::collections::BTreeSet;
use std::time::Instant;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// The reports for `arch`, or `None` when this build or machine cannot
/// compile (after saying why, or failing when CI requires NVRTC).
fn compile_or_skip(arch: &str) -> Option<Vec<KernelReport>> {
    let started = Instant::now();
    match compile_all(arch) {
        Ok(reports) => {
            eprintln!("compile_all({arch}): {:.2} s", started.elapsed().as_secs_f64());
            Some(reports)
        }
        Err(CudaError::NotBuilt) => {
            eprintln!("skipped: built without the `cuda` feature");
            None
        }
        Err(e @ CudaError::MissingLibrary { .. }) => {
            let required = std::env::var("AUTOPAR_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
            assert!(!required, "AUTOPAR_REQUIRE_NVRTC=1 but NVRTC is not usable: {e}");
            eprintln!("skipped: libnvrtc not found (run scripts/install-nvrtc.sh)\n  {e}");
            None
        }
        Err(e) => panic!("compiling the kernels for {arch}: {e}"),
    }
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    for arch in ARCHS {
        let Some(reports) = compile_or_skip(arch) else {
            return;
        };
        for (source, _) in kernels::SOURCES {
            let got: BTreeSet<&str> = reports
                .iter()
                .filter(|r| r.source == *source)
                .map(|r| r.kernel.as_str())
                .collect();
            let want = kernels::kernel_names(source);
            let want: BTreeSet<&str> = want.iter().map(String::as_str).collect();
            let missing: Vec<_> = want.difference(&got).collect();
            let extra: Vec<_> = got.difference(&want).collect();
            assert!(
                missing.is_empty(),
                "{source}.cu for {arch} lacks kernels {missing:?}"
            );
            assert!(
                extra.is_empty(),
                "{source}.cu for {arch} exports kernels the contract lacks: {extra:?}"
            );
        }
        for r in &reports {
            assert!(
                r.spill_store_bytes == 0 && r.spill_load_bytes == 0,
                "{} ({}.cu) spills on {arch}: {} bytes stored, {} bytes loaded, {} registers",
                r.kernel,
                r.source,
                r.spill_store_bytes,
                r.spill_load_bytes,
                r.registers
            );
            assert!(
                r.registers > 0,
                "{} on {arch}: no register count parsed",
                r.kernel
            );
        }
        if std::env::var("AUTOPAR_KERNEL_REPORT").is_ok() {
            for r in &reports {
                println!(
                    "{arch} {:>12} {:<28} {:>3} registers",
                    r.source, r.kernel, r.registers
                );
            }
        }
    }
}

#[test]
fn a_bad_architecture_is_an_error_naming_it() {
    match compile_all("compute_90") {
        Err(CudaError::Compile { arch, log, .. }) => {
            assert_eq!(arch, "compute_90");
            assert!(log.contains("compute_90"), "{log}");
        }
        Err(CudaError::NotBuilt) => eprintln!("skipped: built without the `cuda` feature"),
        Err(CudaError::MissingLibrary { .. }) => eprintln!("skipped: libnvrtc not found"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}
