//! How much each thread slows down when several compute at once. The CPU
//! backend runs one rank per thread; on hosts whose logical cores share
//! physical cores, caches or memory bandwidth, two ranks do not each run at
//! the speed one rank measured alone.

use super::{eval, filled, Plan, ProfileError};
use autopar_cost_models::calibration::ThreadSlowdown;
use autopar_ir::{DType, GeluApprox, Op, Value};
use std::sync::Barrier;
use std::time::Instant;

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
/// least time `threads` lined-up threads take to finish the same short run
/// of mixes each, over the least time one thread takes, in turns. The
/// host's own sharing (caches, memory bandwidth, hyper-threads) slows every
/// run alike, while other work on a shared host only ever adds time, and a
/// run short against the scheduler's time slices often goes without it:
/// the least leaves it out, so a profile measured on a busy host still
/// describes the host. Timing from the first thread's start to the last
/// one's end keeps a run whose threads did not overlap from looking fast.
/// (The median over five 90 ms windows read 1.45-2.9 for two threads on a
/// two-core host running builds and 1.16-1.31 on the idle host; the
/// fastest of short per-thread windows read 1.01-1.05, too little, as a
/// thread whose partner started late ran alone.)
///
/// Beyond the cores, up to twice as many threads (a CPU run of more ranks
/// than cores), each thread also waits for its turn: the slowdown is then
/// over the time share, `threads / cores` times the time alone, and what
/// is left is what taking turns costs (caches refilled after a switch, an
/// odd thread out).
pub(super) fn thread_slowdowns(plan: &Plan) -> Result<Vec<ThreadSlowdown>, ProfileError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = (2 * cores).min(plan.max_threads);
    let mut out = vec![ThreadSlowdown {
        threads: 1,
        slowdown: 1.0,
    }];
    if most < 2 {
        return Ok(out);
    }
    // Mixes per run: about `min_sample_s` of one thread's work.
    let mix = Mix::new(plan);
    mix.run()?;
    let start = Instant::now();
    mix.run()?;
    let calls = (plan.min_sample_s / start.elapsed().as_secs_f64().max(1e-9)).ceil() as usize;
    let calls = calls.max(1);
    for threads in 2..=most {
        let (mut alone, mut together) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..REPEATS {
            alone = alone.min(lined_up_run(plan, 1, calls)?);
            together = together.min(lined_up_run(plan, threads, calls)?);
        }
        let share = (threads as f64 / cores as f64).max(1.0);
        out.push(ThreadSlowdown {
            threads,
            slowdown: super::four_digits((together / (alone * share)).max(1.0)),
        });
    }
    Ok(out)
}

/// Runs alone and together per thread count, in turns.
const REPEATS: usize = 40;

/// Seconds from the first of `threads` threads, lined up at a barrier,
/// starting `calls` mixes each until the last of them finishes.
fn lined_up_run(plan: &Plan, threads: usize, calls: usize) -> Result<f64, ProfileError> {
    let barrier = Barrier::new(threads);
    let spans = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(Instant, Instant), ProfileError> {
                    let mix = Mix::new(plan);
                    mix.run()?;
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..calls {
                        mix.run()?;
                    }
                    Ok((start, Instant::now()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect::<Result<Vec<_>, _>>()
    })?;
    let first = spans.iter().map(|s| s.0).min();
    let last = spans.iter().map(|s| s.1).max();
    Ok(match (first, last) {
        (Some(first), Some(last)) => (last - first).as_secs_f64(),
        _ => 0.0,
    })
}
