//! How much each thread slows down when several compute at once. The CPU
//! backend runs one rank per thread; on hosts whose logical cores share
//! physical cores, caches or memory bandwidth, two ranks do not each run at
//! the speed one rank measured alone.

use super::{eval, filled, Plan, ProfileError};
use autopar_cost_models::calibration::ThreadSlowdown;
use autopar_ir::{DType, GeluApprox, Op, Value};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The kernel mix each thread times: a product and a transcendental
/// element-wise op (the two kinds that dominate the backend's steps).
struct Mix {
    a: Value,
    b: Value,
    x: Value,
}

impl Mix {
    fn new(plan: &Plan) -> Mix {
        let d = plan.thread_mix_dim;
        Mix {
            a: filled(DType::F32, vec![d, d]),
            b: filled(DType::F32, vec![d, d]),
            x: filled(DType::F32, vec![4 * d * d]),
        }
    }

    fn run(&self) -> Result<(), ProfileError> {
        eval(&Op::MatMul, &[Some(&self.a), Some(&self.b)], "thread mix: MatMul")?;
        let gelu = Op::Gelu {
            approximate: GeluApprox::None,
        };
        eval(&gelu, &[Some(&self.x)], "thread mix: Gelu")
    }
}

/// Slowdown of each thread count from 1 to the host's logical cores: the
/// fastest of many short windows together over the fastest alone, taken
/// in turns. The host's own sharing (caches, memory bandwidth, hyper-threads)
/// slows every window alike, while other work on a shared host (builds,
/// other runs) only ever adds time, and a window short against the
/// scheduler's time slices often runs without it: the fastest windows leave
/// it out, so a profile measured on a busy host still describes the host,
/// as its fastest-sample rates do. (The median over five windows of 90 ms
/// read 1.45-2.9 for two threads on a two-core host running builds, where
/// short windows read 1.03-1.05, and a cached profile keeps what it read.)
pub(super) fn thread_slowdowns(plan: &Plan) -> Result<Vec<ThreadSlowdown>, ProfileError> {
    let cores = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(plan.max_threads);
    let mut out = vec![ThreadSlowdown {
        threads: 1,
        slowdown: 1.0,
    }];
    for threads in 2..=cores {
        let (mut alone, mut together) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..REPEATS {
            alone = alone.min(concurrent_time(plan, 1)?);
            together = together.min(concurrent_time(plan, threads)?);
        }
        out.push(ThreadSlowdown {
            threads,
            slowdown: super::four_digits((together / alone).max(1.0)),
        });
    }
    Ok(out)
}

/// Alternating windows alone and together per thread count.
const REPEATS: usize = 40;

/// Seconds per mix of each of `threads` threads running it together for
/// the same stretch of wall time (the median thread), so that every timed
/// call overlaps the others' work.
fn concurrent_time(plan: &Plan, threads: usize) -> Result<f64, ProfileError> {
    let barrier = Barrier::new(threads);
    let window = Duration::from_secs_f64(plan.min_sample_s);
    let mut times = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<f64, ProfileError> {
                    let mix = Mix::new(plan);
                    mix.run()?;
                    barrier.wait();
                    let start = Instant::now();
                    let mut calls = 0u32;
                    while start.elapsed() < window || calls == 0 {
                        mix.run()?;
                        calls += 1;
                    }
                    Ok(start.elapsed().as_secs_f64() / f64::from(calls))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect::<Result<Vec<f64>, _>>()
    })?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
