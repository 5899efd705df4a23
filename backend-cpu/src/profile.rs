//! `autopar profile --backend cpu`: measures this host as the CPU backend
//! sees it, so the cost model (with the `cpu` cluster preset) can predict
//! CPU step times from measured rates instead of nominal ones.
//!
//! Every compute figure runs through [`Op::eval`], the path [`autopar_ir::interp::run`]
//! takes for each node, so kernel speed, input checks, type inference and
//! output allocation are all included, as they are in a real run:
//! - matmul FLOP/s over a grid of shapes from small to large (f32 and f64);
//! - streaming bandwidth of a large element-wise `Add` (bytes read and written);
//! - the fixed cost of one tiny op, the per-kernel overhead;
//! - a rate per other op and dtype, from the nodes of small zoo models'
//!   training graphs (see [`ops`]).
//!
//! Collective bandwidth comes from the runtime's own ring all-reduce
//! ([`autopar_comm::collective`]) between ranks that are threads of this process,
//! as a CPU run's ranks are.

use autopar_comm::collective::{fabric, Algorithm, Buffer, CommError};
use autopar_cost_models::calibration::{Calibration, MatmulSample, FORMAT};
use autopar_ir::{BinaryOp, DType, Data, Op, OpError, Value};
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod in_run;
mod ops;
mod threads;

pub use autopar_cost_models::measured::{gemm_shape, node_time, node_work, priced_as_matmul, NodeWork};

/// How thoroughly to measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileOptions {
    /// Tiny shapes and buffers, short samples: checks the machinery in well
    /// under a second (tests, smoke runs); the numbers are not meaningful.
    pub quick: bool,
}

/// Why a profile could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{what}: {source}")]
    Kernel { what: String, source: OpError },
    #[error("ring all-reduce: {0}")]
    Ring(#[from] CommError),
    #[error("profiled model {spec}: {message}")]
    Model { spec: String, message: String },
}

/// Sizes and timing budget of one profile.
struct Plan {
    /// `[m, n, k]` of each timed `[m, k] × [k, n]` product, per dtype.
    matmuls: Vec<(DType, [usize; 3])>,
    /// Elements of each operand of the streaming `Add`.
    stream_elements: usize,
    /// Elements of each rank's all-reduce buffer.
    ring_elements: usize,
    ring_ranks: usize,
    /// Zoo specs whose training graphs give the per-op rates.
    models: Vec<&'static str>,
    /// Rows per micro-batch of those graphs.
    micro_batch: usize,
    /// Runs of each graph per precision; each node keeps its least time.
    passes: usize,
    /// A timed sample repeats the measured call until it lasts this long.
    min_sample_s: f64,
    /// Timed samples per figure; the fastest is kept.
    samples: usize,
    /// Side of the square product in the concurrent-threads mix.
    thread_mix_dim: usize,
    /// Most threads run at once when measuring their slowdown.
    max_threads: usize,
}

impl Plan {
    fn new(options: &ProfileOptions) -> Plan {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // At least two ranks, so there is a ring; at most eight, so large
        // hosts do not spend minutes on it.
        let ring_ranks = cores.clamp(2, 8);
        if options.quick {
            let mut matmuls = grid(DType::F32, &[4, 16]);
            matmuls.push((DType::F32, [16, 8, 4]));
            matmuls.extend(cubes(DType::F64, &[4, 16]));
            return Plan {
                matmuls,
                stream_elements: 1 << 12,
                ring_elements: 1 << 12,
                ring_ranks,
                models: vec![
                    "gpt:layers=1,hidden=8,heads=2,vocab=16,seq=4",
                    "llama:layers=1,hidden=8,ffn=16,heads=2,kv_heads=1,vocab=16,seq=4",
                ],
                micro_batch: 2,
                passes: 1,
                min_sample_s: 1e-4,
                samples: 3,
                thread_mix_dim: 16,
                max_threads: 2,
            };
        }
        let mut matmuls = grid(DType::F32, &[32, 128, 512]);
        // Transformer-like GEMMs (hidden 768, 512 tokens, head dim 64):
        // MLP up and down projections, attention scores and values, and one
        // large square product for the top of the range.
        for shape in [
            [512, 3072, 768],
            [512, 768, 3072],
            [512, 512, 64],
            [512, 64, 512],
            [1024, 1024, 1024],
        ] {
            matmuls.push((DType::F32, shape));
        }
        // The same grid in f64, which the CPU backend also runs.
        matmuls.extend(grid(DType::F64, &[32, 128, 512]));
        matmuls.extend(cubes(DType::F64, &[1024]));
        Plan {
            matmuls,
            // 24 MiB per f32 operand, 72 MiB moved per Add: well past the
            // last-level cache of common hosts.
            stream_elements: 3 << 21,
            // 16 MiB per rank.
            ring_elements: 1 << 22,
            ring_ranks,
            // One model per family, about as large as the CPU backend
            // trains (activations of a few hundred KiB per tensor).
            models: vec![
                "gpt:layers=2,hidden=128,heads=4,vocab=512,seq=64",
                "llama:layers=2,hidden=128,ffn=352,heads=4,kv_heads=2,vocab=512,seq=64",
                "moe:layers=1,hidden=128,ffn=256,heads=4,kv_heads=2,experts=4,top_k=2,vocab=512,seq=64",
            ],
            micro_batch: 8,
            passes: 6,
            min_sample_s: 2e-3,
            samples: 9,
            // A 256² product and a 256 Ki-element Gelu: the backend's working sizes.
            thread_mix_dim: 256,
            max_threads: 16,
        }
    }
}

/// Every `[m, n, k]` with each dim from `dims`.
fn grid(dtype: DType, dims: &[usize]) -> Vec<(DType, [usize; 3])> {
    let mut shapes = Vec::new();
    for &m in dims {
        for &n in dims {
            for &k in dims {
                shapes.push((dtype, [m, n, k]));
            }
        }
    }
    shapes
}

/// `[d, d, d]` for each `d` in `dims`.
fn cubes(dtype: DType, dims: &[usize]) -> Vec<(DType, [usize; 3])> {
    dims.iter().map(|&d| (dtype, [d, d, d])).collect()
}

/// What the profiler measures, revised whenever that changes (a kernel
/// priced apart, a figure added, the CLI's allocator, which moves the
/// interpreter's overheads, or a kernel made faster: 4, the vectorized
/// exponentials and activations; 5, freed memory kept by the allocator;
/// 6, attention by blocks of rows and element-wise ops dispatched once),
/// so that cached host profiles are measured again.
pub const REVISION: u32 = 6;

/// Measures this host through the CPU backend's kernels and returns a
/// calibration with every measured field set (efficiency fractions keep
/// their defaults; the measured rates replace them for the `cpu` preset).
pub fn profile(options: &ProfileOptions) -> Result<Calibration, ProfileError> {
    let plan = Plan::new(options);
    let mut cal = Calibration {
        format: FORMAT.into(),
        about: about(&plan, options),
        ..Calibration::default()
    };
    for &(dtype, shape) in &plan.matmuls {
        cal.matmul.measured.push(matmul_sample(&plan, dtype, shape)?);
    }
    cal.memory.measured_bytes_per_s = Some(stream_rate(&plan)?);
    // The `cpu` preset's nodes are this host's cores over again (ranks
    // beyond its cores): between them runs the same in-process ring.
    let (rate, latency) = (ring_rate(&plan)?, ring_latency(&plan)?);
    cal.network.measured_intra_node_bytes_per_s = Some(rate);
    cal.network.measured_inter_node_bytes_per_s = Some(rate);
    cal.network.measured_intra_node_latency_s = Some(latency);
    cal.network.measured_inter_node_latency_s = Some(latency);
    cal.kernel_overhead_s = kernel_overhead(&plan)?;
    cal.ops = ops::op_rates(&plan, &cal)?;
    cal.threads = threads::thread_slowdowns(&plan)?;
    cal.interpreter = Some(in_run::interpreter_cost(&plan, &cal)?);
    Ok(cal)
}

/// `x` to four significant digits: more would be noise, and short decimals
/// survive a JSON round trip exactly.
fn four_digits(x: f64) -> f64 {
    format!("{x:.3e}").parse().unwrap_or(x)
}

/// Seconds per call of `f` in its fastest sample: one warm-up call, then
/// `plan.samples` samples, each repeating `f` often enough to last
/// `plan.min_sample_s` so that short calls are not lost in timer
/// resolution. The fastest, because other work on a shared host (builds,
/// other runs) only ever adds time; short samples make one that ran
/// undisturbed likely.
fn time_per_call(plan: &Plan, mut f: impl FnMut() -> Result<(), ProfileError>) -> Result<f64, ProfileError> {
    f()?;
    let mut timed = |calls: usize| -> Result<f64, ProfileError> {
        let start = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let mut calls = 1;
    let mut first = timed(calls)?;
    while first < plan.min_sample_s {
        calls *= 2;
        first = timed(calls)?;
    }
    let mut fastest = first;
    for _ in 1..plan.samples {
        fastest = fastest.min(timed(calls)?);
    }
    Ok(four_digits(fastest / calls as f64))
}

/// Evaluates `op` once through the interpreter's path and drops the result.
fn eval(op: &Op, args: &[Option<&Value>], what: &str) -> Result<(), ProfileError> {
    let out = op.eval(args).map_err(|source| ProfileError::Kernel {
        what: what.to_string(),
        source,
    })?;
    black_box(out);
    Ok(())
}

/// A `dtype` tensor of `shape` holding small, varied, normal numbers (no
/// zeros or denormals that some hardware treats specially).
fn filled(dtype: DType, shape: Vec<usize>) -> Value {
    let numel = shape.iter().product::<usize>();
    let x = |i: usize| 0.25 + (i % 7) as f64 * 0.125;
    let data = if dtype == DType::F64 {
        Data::F64((0..numel).map(x).collect())
    } else {
        Data::F32((0..numel).map(|i| x(i) as f32).collect())
    };
    Value { dtype, shape, data }
}

/// FLOP/s of one `[m, k] × [k, n]` `MatMul`.
fn matmul_sample(plan: &Plan, dtype: DType, [m, n, k]: [usize; 3]) -> Result<MatmulSample, ProfileError> {
    let a = filled(dtype, vec![m, k]);
    let b = filled(dtype, vec![k, n]);
    let what = format!("MatMul {dtype} [{m}, {k}] x [{k}, {n}]");
    let seconds = time_per_call(plan, || eval(&Op::MatMul, &[Some(&a), Some(&b)], &what))?;
    Ok(MatmulSample {
        m,
        n,
        k,
        dtype,
        flops_per_s: four_digits(2.0 * (m * n * k) as f64 / seconds),
    })
}

/// Bytes per second a large f32 `Add` reads and writes.
fn stream_rate(plan: &Plan) -> Result<f64, ProfileError> {
    let n = plan.stream_elements;
    let seconds = time_per_call(plan, binary_add(n))?;
    Ok(four_digits((3 * n * std::mem::size_of::<f32>()) as f64 / seconds))
}

/// Seconds one 1-element `Add` takes: the fixed cost of any op.
fn kernel_overhead(plan: &Plan) -> Result<f64, ProfileError> {
    time_per_call(plan, binary_add(1))
}

/// A call evaluating `Add` on two f32 vectors of `n` elements.
fn binary_add(n: usize) -> impl FnMut() -> Result<(), ProfileError> {
    let a = filled(DType::F32, vec![n]);
    let b = filled(DType::F32, vec![n]);
    let op = Op::Binary { func: BinaryOp::Add };
    let what = format!("Add f32 [{n}]");
    move || eval(&op, &[Some(&a), Some(&b)], &what)
}

/// Bytes each rank sends per second during a ring all-reduce (the
/// `bytes_sent / time` of the communication model: `2 (p - 1) / p` of the
/// buffer per rank), one thread per rank on an in-process fabric.
fn ring_rate(plan: &Plan) -> Result<f64, ProfileError> {
    let p = plan.ring_ranks;
    let seconds = ring_seconds(plan, plan.ring_elements, 1)?;
    let bytes = (plan.ring_elements * std::mem::size_of::<f32>()) as f64;
    Ok(four_digits(2.0 * (p - 1) as f64 / p as f64 * bytes / seconds))
}

/// All-reduces each ring thread runs back to back per latency sample: a
/// few, so that a sample is short against the scheduler's time slices.
const LATENCY_ROUNDS: usize = 20;
/// Ring samples per timed sample of the kernels' figures: a sample needs
/// every ring thread running at once, which a busy host grants less often.
const RING_SAMPLES_PER_SAMPLE: usize = 4;

/// Seconds per message of the runtime's ring between threads of this
/// process: all-reduces of one element per rank back to back, so that what
/// is left is the hand-off between ranks (a wake-up on a channel) that
/// every message of a collective pays; per all-reduce, the communication
/// model counts `2 (p - 1)` of them.
fn ring_latency(plan: &Plan) -> Result<f64, ProfileError> {
    let p = plan.ring_ranks;
    let seconds = ring_seconds(plan, p, LATENCY_ROUNDS)?;
    Ok(four_digits(seconds / (2 * (p - 1)) as f64))
}

/// Seconds per ring all-reduce of `elements` f32 per rank, one thread per
/// rank on an in-process fabric: each sample starts the threads, lines
/// them up and times `rounds` all-reduces back to back (the slowest
/// thread's time); the fastest of many short samples, as for every other
/// figure, since other work on a shared host only ever adds time.
fn ring_seconds(plan: &Plan, elements: usize, rounds: usize) -> Result<f64, ProfileError> {
    let p = plan.ring_ranks;
    let endpoints = fabric(p, Duration::from_secs(60));
    let group: Vec<usize> = (0..p).collect();
    let mut fastest = f64::INFINITY;
    for sample in 0..plan.samples * RING_SAMPLES_PER_SAMPLE {
        let barrier = std::sync::Barrier::new(p);
        let seconds = std::thread::scope(|s| {
            let ranks: Vec<_> = endpoints
                .iter()
                .map(|ep| {
                    let (group, barrier) = (&group, &barrier);
                    s.spawn(move || -> Result<f64, ProfileError> {
                        // Zeros stay zeros under repeated summing: no overflow.
                        let mut data = Buffer::F32(vec![0.0; elements]);
                        barrier.wait();
                        let start = Instant::now();
                        for round in 0..rounds {
                            let tag = format!("profile/{sample}/{round}");
                            ep.all_reduce(group, &mut data, Algorithm::Ring, &tag, "profiling")?;
                        }
                        Ok(start.elapsed().as_secs_f64())
                    })
                })
                .collect();
            // Join every rank before reporting, so none outlives the scope's work.
            let results: Vec<_> = ranks.into_iter().map(|h| h.join()).collect();
            results
                .into_iter()
                .try_fold(0.0f64, |slowest, r| -> Result<f64, ProfileError> {
                    match r {
                        Ok(seconds) => Ok(slowest.max(seconds?)),
                        Err(panic) => std::panic::resume_unwind(panic),
                    }
                })
        })?;
        fastest = fastest.min(seconds);
    }
    Ok(fastest / rounds as f64)
}

/// Which host, how it was measured, and when.
fn about(plan: &Plan, options: &ProfileOptions) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "autopar profile --backend cpu{}: {cpu}, {cores} logical cores (single-threaded kernels, \
         one rank per core); collectives from a {}-thread ring all-reduce; measured {} UTC",
        if options.quick { " --quick" } else { "" },
        plan.ring_ranks,
        utc_timestamp(now),
    )
}

/// The CPU's model name from `/proc/cpuinfo`, where there is one.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// `YYYY-MM-DD hh:mm:ss` for seconds since the Unix epoch (proleptic
/// Gregorian calendar, after Howard Hinnant's `civil_from_days`).
fn utc_timestamp(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_profile_is_a_valid_calibration_covering_the_plan() {
        let options = ProfileOptions { quick: true };
        let cal = profile(&options).unwrap();
        let text = serde_json::to_string_pretty(&cal).unwrap();
        assert_eq!(Calibration::from_json(&text, "profile").unwrap(), cal);

        let plan = Plan::new(&options);
        let measured: Vec<_> = cal
            .matmul
            .measured
            .iter()
            .map(|s| (s.dtype, [s.m, s.n, s.k]))
            .collect();
        assert_eq!(measured, plan.matmuls);
        assert!(measured.contains(&(DType::F64, [16, 16, 16])));
        let positive = |x: f64| x > 0.0 && x.is_finite();
        assert!(cal.matmul.measured.iter().all(|s| positive(s.flops_per_s)));
        assert!(cal.memory.measured_bytes_per_s.is_some_and(positive));
        assert!(cal.network.measured_intra_node_bytes_per_s.is_some_and(positive));
        assert!(cal.network.measured_intra_node_latency_s.is_some_and(positive));
        assert_eq!(
            cal.network.measured_inter_node_latency_s,
            cal.network.measured_intra_node_latency_s
        );
        assert!(positive(cal.kernel_overhead_s));
        // Op rates in both precisions, from the plan's graphs.
        for dtype in [DType::F32, DType::F64] {
            assert!(cal.ops.iter().any(|r| r.dtype == dtype), "no {dtype} op rates");
        }
        // GEMMs are the grid's, bar a broadcast bias.
        assert!(cal
            .ops
            .iter()
            .all(|r| !["MatMul", "Linear", "Gemm"].contains(&r.op.as_str())));
        assert!(cal.about.contains("logical cores"), "{}", cal.about);
        // Thread slowdowns from one thread up, and the interpreter's own cost.
        assert_eq!(
            cal.threads.first().map(|t| (t.threads, t.slowdown)),
            Some((1, 1.0))
        );
        assert!(cal.threads.iter().all(|t| t.slowdown >= 1.0));
        let interpreter = cal.interpreter.expect("interpreter cost");
        assert!(interpreter.node_factor >= 1.0 && interpreter.instruction_overhead_s >= 0.0);
        // Fractions are not measured here.
        assert_eq!(
            cal.memory.bandwidth_fraction,
            Calibration::default().memory.bandwidth_fraction
        );
    }

    #[test]
    fn grid_spans_every_combination() {
        let g = grid(DType::F32, &[1, 2]);
        assert_eq!(g.len(), 8);
        assert_eq!(g[0], (DType::F32, [1, 1, 1]));
        assert_eq!(g[5], (DType::F32, [2, 1, 2]));
    }

    #[test]
    fn four_significant_digits() {
        assert_eq!(four_digits(2_085_042_075.624_771), 2.085e9);
        assert_eq!(four_digits(1.194_351_5e-6), 1.194e-6);
    }

    #[test]
    fn utc_timestamps() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00:00");
        assert_eq!(utc_timestamp(951_782_400 + 3_723), "2000-02-29 01:02:03");
        assert_eq!(utc_timestamp(1_735_689_599), "2024-12-31 23:59:59");
    }
}
