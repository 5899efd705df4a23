//! NVRTC compilation of the kernel sources to machine code (CUBIN) for one
//! real architecture. NVRTC runs ptxas itself, so this needs no GPU and no
//! driver, only `libnvrtc` and the CUDA headers for `cuda_bf16.h`; CI uses it
//! to check that every kernel compiles without register spills.

use super::{kernels, CudaError, KernelReport};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

/// What to do when `libnvrtc` or the headers are missing.
const INSTALL_HINT: &str =
    "run scripts/install-nvrtc.sh and put the lib folder it prints on LD_LIBRARY_PATH \
     (or install the CUDA toolkit)";

/// An NVRTC call that failed, with NVRTC's message for its result code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {message}")]
pub struct NvrtcError {
    /// The call, or the program output it was reading ("CUBIN").
    pub call: &'static str,
    pub message: String,
}

/// Fails with [`CudaError::MissingLibrary`] unless `libnvrtc` can be loaded
/// (cudarc's loader panics on first use otherwise).
pub(crate) fn ensure_library() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library under cudarc's candidate names.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::MissingLibrary {
            library: "libnvrtc",
            hint: format!(
                "{INSTALL_HINT}; LD_LIBRARY_PATH is '{}'",
                env("LD_LIBRARY_PATH").unwrap_or_default()
            ),
        })
    }
}

/// NVRTC's (major, minor) version: part of the kernel cache key, since a
/// different compiler gives different machine code.
pub(crate) fn version() -> Result<(i32, i32), CudaError> {
    ensure_library()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded; both pointers are valid for writes.
    check(
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) },
        "nvrtcVersion",
    )?;
    Ok((major, minor))
}

/// Compiles every source in [`kernels::SOURCES`] for `arch` (in parallel)
/// and returns the report of every kernel.
pub(crate) fn compile_all(arch: &str) -> Result<Vec<KernelReport>, CudaError> {
    let names: Vec<&str> = kernels::SOURCES.iter().map(|(name, _)| *name).collect();
    Ok(compile_many(&names, arch)?
        .into_iter()
        .flat_map(|(_, reports)| reports)
        .collect())
}

/// Compiles the named sources for `arch`, one thread each; results in the
/// order of `names`.
pub(crate) fn compile_many(names: &[&str], arch: &str) -> Result<Vec<Compiled>, CudaError> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .iter()
            .map(|name| scope.spawn(|| compile(name, arch)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CudaError::Driver("an NVRTC compile thread panicked".into())))
            })
            .collect()
    })
}

/// One compiled source: its CUBIN and each kernel's registers and spills.
pub(crate) type Compiled = (Vec<u8>, Vec<KernelReport>);

/// Compiles source `source_name` for `arch` (e.g. `sm_90`).
pub(crate) fn compile(source_name: &str, arch: &str) -> Result<Compiled, CudaError> {
    ensure_library()?;
    let include = include_dir()?;
    let fail = |log: String| CudaError::Compile {
        source_name: source_name.to_string(),
        arch: arch.to_string(),
        log,
    };
    if !is_real_arch(arch) {
        return Err(fail(format!(
            "'{arch}' is not a real GPU architecture such as sm_80 or sm_90"
        )));
    }
    let text = kernels::full_source(source_name)
        .ok_or_else(|| fail(format!("no kernel source named '{source_name}'")))?;
    let c_text = CString::new(text).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let c_name = CString::new(format!("{source_name}.cu")).map_err(|_| fail("bad source name".into()))?;
    let options: Vec<CString> = options(arch, &include)
        .into_iter()
        .map(|o| CString::new(o).map_err(|_| fail("an option contains a NUL byte".into())))
        .collect::<Result<_, _>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();

    let nvrtc = |e: NvrtcError| fail(e.to_string());
    let program = Program::new(&c_text, &c_name).map_err(nvrtc)?;
    // SAFETY: `program` is live; the option pointers outlive the call.
    let compiled =
        unsafe { sys::nvrtcCompileProgram(program.0, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
    let log = program.log().map_err(nvrtc)?;
    check(compiled, "nvrtcCompileProgram").map_err(|e| fail(format!("{e}\n{log}")))?;
    let cubin = program.cubin().map_err(nvrtc)?;
    Ok((cubin, parse_ptxas(source_name, &log)))
}

/// NVRTC's options besides the architecture and the include path (part of
/// the kernel cache key).
pub(crate) const FLAGS: &[&str] = &["-std=c++17", "--ptxas-options=-v", "-default-device"];

/// NVRTC's options: real-architecture machine code, ptxas statistics.
fn options(arch: &str, include: &Path) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(FLAGS.iter().map(|f| f.to_string()));
    options.push(format!("--include-path={}", include.display()));
    options
}

/// `sm_` followed by digits and an optional feature letter (`sm_90a`).
fn is_real_arch(arch: &str) -> bool {
    let Some(rest) = arch.strip_prefix("sm_") else {
        return false;
    };
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) && rest.len() - digits.len() <= 1
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Program {
    fn new(text: &CStr, name: &CStr) -> Result<Self, NvrtcError> {
        let mut program = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers passed.
        let r = unsafe {
            sys::nvrtcCreateProgram(
                &mut program,
                text.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        check(r, "nvrtcCreateProgram")?;
        Ok(Program(program))
    }

    /// The compiler's log (errors, warnings, ptxas statistics).
    fn log(&self) -> Result<String, NvrtcError> {
        let bytes = self.read(
            sys::nvrtcGetProgramLogSize,
            sys::nvrtcGetProgramLog,
            "program log",
        )?;
        Ok(String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string())
    }

    fn cubin(&self) -> Result<Vec<u8>, NvrtcError> {
        self.read(sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN, "CUBIN")
    }

    /// Reads a size-then-bytes output of the program.
    fn read(
        &self,
        size: unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult,
        get: unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult,
        what: &'static str,
    ) -> Result<Vec<u8>, NvrtcError> {
        let mut n = 0usize;
        // SAFETY: live program, valid out pointer.
        check(unsafe { size(self.0, &mut n) }, what)?;
        let mut bytes = vec![0u8; n];
        // SAFETY: the buffer holds the `n` bytes NVRTC said it will write.
        check(unsafe { get(self.0, bytes.as_mut_ptr().cast()) }, what)?;
        Ok(bytes)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once. A failure
        // here would only leak the program.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

/// `Ok` for NVRTC_SUCCESS, else NVRTC's message for the code.
fn check(r: sys::nvrtcResult, call: &'static str) -> Result<(), NvrtcError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: returns a static string for any result code.
    let message = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(r)) };
    Err(NvrtcError {
        call,
        message: message.to_string_lossy().into_owned(),
    })
}

/// Each entry function's registers and spill bytes from ptxas's `-v` lines:
/// `Compiling entry function 'K' for 'sm_90'`, then
/// `Function properties for K` / `N bytes stack frame, S bytes spill stores,
/// L bytes spill loads`, then `Used R registers, ...`.
fn parse_ptxas(source: &str, log: &str) -> Vec<KernelReport> {
    let mut reports: Vec<KernelReport> = Vec::new();
    let mut properties_of: Option<String> = None;
    for line in log.lines() {
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            reports.push(KernelReport {
                source: source.to_string(),
                kernel: name.to_string(),
                registers: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
            });
            properties_of = None;
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            properties_of = Some(rest.trim().to_string());
        } else if line.contains("bytes spill stores") {
            let current = reports
                .last_mut()
                .filter(|r| properties_of.as_deref() == Some(&r.kernel));
            if let Some(report) = current {
                report.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
                report.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if let (Some(report), Some(registers)) = (reports.last_mut(), number_after(line, "Used ")) {
            if line.contains("registers") {
                report.registers = registers as u32;
            }
        }
    }
    reports
}

fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = line.split(prefix).nth(1)?;
    rest.split('\'').next()
}

/// The integer just before `marker` (`"12 bytes spill stores"` → 12).
fn number_before(line: &str, marker: &str) -> Option<u64> {
    let head = line.split(marker).next().filter(|h| h.len() < line.len())?;
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|s| !s.is_empty())?
        .parse()
        .ok()
}

/// The integer just after `marker` (`"Used 40 registers"` → 40).
fn number_after(line: &str, marker: &str) -> Option<u64> {
    let rest = line.split(marker).nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// The folder holding `cuda_bf16.h`: `AUTOPAR_CUDA_INCLUDE`, else
/// `$CUDA_HOME/include`, `/usr/local/cuda/include`, else the pip-wheel
/// layout next to a `libnvrtc` on `LD_LIBRARY_PATH`.
fn include_dir() -> Result<PathBuf, CudaError> {
    if let Some(dir) = env("AUTOPAR_CUDA_INCLUDE") {
        let dir = PathBuf::from(dir);
        return if has_bf16_header(&dir) {
            Ok(dir)
        } else {
            Err(CudaError::MissingLibrary {
                library: "cuda_bf16.h",
                hint: format!(
                    "AUTOPAR_CUDA_INCLUDE is {} but it has no cuda_bf16.h",
                    dir.display()
                ),
            })
        };
    }
    let candidates = include_candidates(env("CUDA_HOME"), env("LD_LIBRARY_PATH"));
    candidates
        .iter()
        .find(|d| has_bf16_header(d))
        .cloned()
        .ok_or_else(|| {
            let tried: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
            CudaError::MissingLibrary {
                library: "cuda_bf16.h",
                hint: format!(
                    "set AUTOPAR_CUDA_INCLUDE to the CUDA include folder; tried {}; {INSTALL_HINT}",
                    tried.join(", ")
                ),
            }
        })
}

fn has_bf16_header(dir: &Path) -> bool {
    dir.join("cuda_bf16.h").is_file()
}

/// Where the headers may be, in order of preference.
fn include_candidates(cuda_home: Option<String>, ld_library_path: Option<String>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = cuda_home
        .map(|h| Path::new(&h).join("include"))
        .into_iter()
        .collect();
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    for lib in ld_library_path
        .iter()
        .flat_map(|p| p.split(':'))
        .filter(|p| !p.is_empty())
    {
        // …/nvidia/cuda_nvrtc/lib → …/nvidia/cuda_runtime/include
        let lib = Path::new(lib);
        if lib.ends_with("cuda_nvrtc/lib") {
            if let Some(nvidia) = lib.parent().and_then(Path::parent) {
                dirs.push(nvidia.join("cuda_runtime/include"));
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'softmax_fwd_f32' for 'sm_90'
ptxas info    : Function properties for softmax_fwd_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 1 barriers, 384 bytes cmem[0]
ptxas info    : Compiling entry function 'flash_attn_bwd_f32' for 'sm_90'
ptxas info    : Function properties for flash_attn_bwd_f32
    24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 24 bytes cumulative stack size
";

    #[test]
    fn ptxas_lines_give_registers_and_spills_per_entry() {
        let reports = parse_ptxas("x", LOG);
        let summary: Vec<_> = reports
            .iter()
            .map(|r| {
                (
                    r.kernel.as_str(),
                    r.registers,
                    r.spill_store_bytes,
                    r.spill_load_bytes,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [("softmax_fwd_f32", 18, 0, 0), ("flash_attn_bwd_f32", 255, 20, 16)]
        );
        assert!(reports.iter().all(|r| r.source == "x"));
    }

    #[test]
    fn arch_names_must_be_real_architectures() {
        for good in ["sm_80", "sm_90", "sm_90a", "sm_120"] {
            assert!(is_real_arch(good), "{good}");
        }
        for bad in ["compute_90", "sm_", "sm_9x0", "90", "sm_90ab"] {
            assert!(!is_real_arch(bad), "{bad}");
        }
    }

    #[test]
    fn wheel_layout_next_to_libnvrtc_is_searched_after_cuda_home() {
        let dirs = include_candidates(
            Some("/opt/cuda".into()),
            Some("/x/lib::/w/nvidia/cuda_nvrtc/lib".into()),
        );
        assert_eq!(
            dirs,
            [
                PathBuf::from("/opt/cuda/include"),
                PathBuf::from("/usr/local/cuda/include"),
                PathBuf::from("/w/nvidia/cuda_runtime/include"),
            ]
        );
    }
}
