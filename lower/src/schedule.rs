//! Pipeline schedules as data: the order in which each pipeline stage runs
//! the forward and backward passes of its layer chunks over the micro-batches
//! of one step, for GPipe, 1F1B (PipeDream-flush) and Megatron-LM's
//! interleaved 1F1B.
//!
//! Keeping the schedule as a plain list per stage lets lowering hand it to
//! the rank programs unchanged, and lets it be checked (every task once, no
//! deadlock when stages block on their inputs) and measured (peak live
//! activations, to compare with the cost model's in-flight formula) without
//! running anything.
//!
//! Geometry: a plan has `pp` stages, each holding `chunks` model chunks
//! ("virtual stages"). Chunk `c` of stage `s` is virtual stage
//! `vs = c·pp + s` (Megatron-LM's interleaving), so a micro-batch's forward
//! visits `vs = 0, 1, …, pp·chunks − 1` and its backward the reverse.

use std::collections::HashSet;
use std::fmt;

use autopar_cost_models::Schedule;

/// Which pass a task runs; the two passes have opposite data flow through
/// the virtual stages, so dependencies depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    Forward,
    Backward,
}

/// One unit of pipeline work: a phase of one chunk for one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Task {
    pub phase: Phase,
    /// The stage's model chunk (0 unless the schedule is interleaved).
    pub chunk: usize,
    pub micro_batch: usize,
}

impl Task {
    fn forward(chunk: usize, micro_batch: usize) -> Task {
        Task {
            phase: Phase::Forward,
            chunk,
            micro_batch,
        }
    }

    fn backward(chunk: usize, micro_batch: usize) -> Task {
        Task {
            phase: Phase::Backward,
            chunk,
            micro_batch,
        }
    }
}

/// Short form for error messages: `F(chunk 1, mb 3)`.
impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let phase = match self.phase {
            Phase::Forward => 'F',
            Phase::Backward => 'B',
        };
        write!(f, "{phase}(chunk {}, mb {})", self.chunk, self.micro_batch)
    }
}

/// Why a schedule cannot be built, or why a set of stage orders cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("a pipeline needs at least one stage (pp = 0)")]
    NoStages,
    #[error("stage {stage} does not exist in a pipeline of {pp} stages")]
    StageOutOfRange { stage: usize, pp: usize },
    #[error("each stage needs at least one model chunk (chunks = 0)")]
    NoChunks,
    #[error("a step needs at least one micro-batch (micro_batches = 0)")]
    NoMicroBatches,
    #[error(
        "the {schedule} schedule runs one model chunk per stage, not {chunks}; use the interleaved schedule"
    )]
    ChunksNeedInterleaving { schedule: Schedule, chunks: usize },
    #[error(
        "the interleaved schedule needs the micro-batch count ({micro_batches}) to be a multiple of pp ({pp}), as in Megatron-LM"
    )]
    MicroBatchesNotMultipleOfStages { micro_batches: usize, pp: usize },
    #[error("expected orders for {expected} stages, got {got}")]
    StageCount { expected: usize, got: usize },
    #[error("stage {stage}: task {task} is outside {chunks} chunk(s) and {micro_batches} micro-batch(es)")]
    TaskOutOfRange {
        stage: usize,
        task: Task,
        chunks: usize,
        micro_batches: usize,
    },
    #[error("stage {stage}: task {task} appears more than once")]
    Duplicate { stage: usize, task: Task },
    #[error("stage {stage}: task {task} never runs")]
    Missing { stage: usize, task: Task },
    #[error("deadlock: {}", describe_stuck(.stuck))]
    Deadlock {
        /// Each stuck stage with the task it waits on.
        stuck: Vec<(usize, Task)>,
    },
}

fn describe_stuck(stuck: &[(usize, Task)]) -> String {
    stuck
        .iter()
        .map(|(stage, task)| format!("stage {stage} waits at {task}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rejects empty pipelines, chunk lists and steps, which every schedule
/// and check would otherwise have to special-case.
fn check_shape(pp: usize, chunks: usize, micro_batches: usize) -> Result<(), ScheduleError> {
    if pp == 0 {
        Err(ScheduleError::NoStages)
    } else if chunks == 0 {
        Err(ScheduleError::NoChunks)
    } else if micro_batches == 0 {
        Err(ScheduleError::NoMicroBatches)
    } else {
        Ok(())
    }
}

/// The order stage `stage` runs its tasks in.
///
/// - GPipe: all forwards, then all backwards, both in micro-batch order
///   (backward of micro-batch 0 first, as 1F1B does, so activations are
///   released first-in first-out).
/// - 1F1B: `min(pp − stage − 1, m)` warm-up forwards, then one forward and
///   one backward alternately, then the remaining backwards, which bounds
///   the stage's live activations by `pp − stage` micro-batches.
/// - Interleaved: Megatron-LM's `forward_backward_pipelining_with_interleaving`
///   over `m·chunks` chunk-steps (see [`interleaved`]). With one chunk it is
///   exactly 1F1B (Megatron-LM itself falls back to the non-interleaved
///   schedule then), so it accepts any micro-batch count in that case.
pub fn stage_order(
    schedule: Schedule,
    stage: usize,
    pp: usize,
    chunks: usize,
    micro_batches: usize,
) -> Result<Vec<Task>, ScheduleError> {
    check_shape(pp, chunks, micro_batches)?;
    if stage >= pp {
        return Err(ScheduleError::StageOutOfRange { stage, pp });
    }
    let m = micro_batches;
    match schedule {
        Schedule::Gpipe | Schedule::OneFOneB if chunks > 1 => {
            Err(ScheduleError::ChunksNeedInterleaving { schedule, chunks })
        }
        Schedule::Gpipe => {
            let forwards = (0..m).map(|k| Task::forward(0, k));
            Ok(forwards.chain((0..m).map(|k| Task::backward(0, k))).collect())
        }
        Schedule::OneFOneB => Ok(one_f_one_b(stage, pp, m)),
        Schedule::Interleaved if chunks == 1 => Ok(one_f_one_b(stage, pp, m)),
        Schedule::Interleaved if m % pp != 0 => {
            Err(ScheduleError::MicroBatchesNotMultipleOfStages { micro_batches: m, pp })
        }
        Schedule::Interleaved => Ok(interleaved(stage, pp, chunks, m)),
    }
}

/// PipeDream-flush / Megatron-LM's non-interleaved schedule: stage `s`
/// warms up with `pp − s − 1` forwards, the micro-batches still in the
/// later stages when its first backward can arrive.
fn one_f_one_b(stage: usize, pp: usize, m: usize) -> Vec<Task> {
    one_forward_one_backward(
        m,
        pp - stage - 1,
        |k| Task::forward(0, k),
        |k| Task::backward(0, k),
    )
}

/// Megatron-LM's interleaved 1F1B for `v = chunks > 1`, `m % pp == 0`.
///
/// Work is counted in chunk-steps: forward step `k` runs chunk
/// `(k / pp) % v` on micro-batch `(k / (pp·v))·pp + k % pp`, i.e. groups of
/// `pp` micro-batches go through chunk 0, then chunk 1, …; backward step `k`
/// runs chunk `v − 1 − (k / pp) % v` on the same micro-batch. Stage `s`
/// warms up with `2(pp − s − 1) + (v − 1)·pp` forward steps (capped at
/// `m·v`): enough that the last chunk's first backwards are ready when the
/// steady one-forward-one-backward phase starts.
/// The step → micro-batch mapping covers exactly `0..m` only when `pp`
/// divides `m`, hence [`ScheduleError::MicroBatchesNotMultipleOfStages`].
fn interleaved(stage: usize, pp: usize, v: usize, m: usize) -> Vec<Task> {
    let chunk = move |k: usize| (k / pp) % v;
    let micro_batch = move |k: usize| (k / (pp * v)) * pp + k % pp;
    one_forward_one_backward(
        m * v,
        2 * (pp - stage - 1) + (v - 1) * pp,
        |k| Task::forward(chunk(k), micro_batch(k)),
        |k| Task::backward(v - 1 - chunk(k), micro_batch(k)),
    )
}

/// The shape shared by 1F1B and its interleaved form: `warmup` forward
/// steps (at most `steps`), then forward step `warmup + i` followed by
/// backward step `i` until the forwards run out, then the remaining
/// backward steps.
fn one_forward_one_backward(
    steps: usize,
    warmup: usize,
    forward: impl Fn(usize) -> Task,
    backward: impl Fn(usize) -> Task,
) -> Vec<Task> {
    let warmup = warmup.min(steps);
    let steady = steps - warmup;
    let mut order = Vec::with_capacity(2 * steps);
    order.extend((0..warmup).map(&forward));
    for i in 0..steady {
        order.push(forward(warmup + i));
        order.push(backward(i));
    }
    order.extend((steady..steps).map(backward));
    order
}

/// Peak number of (chunk, micro-batch) forwards whose backward has not yet
/// run, over the order: the activations the stage must hold at once, in
/// units of one chunk's activations for one micro-batch. A backward whose
/// forward is not earlier in the order does not lower the count.
pub fn peak_in_flight(order: &[Task]) -> usize {
    let mut live = HashSet::new();
    let mut peak = 0;
    for task in order {
        let key = (task.chunk, task.micro_batch);
        match task.phase {
            Phase::Forward => {
                live.insert(key);
                peak = peak.max(live.len());
            }
            Phase::Backward => {
                live.remove(&key);
            }
        }
    }
    peak
}

/// Checks that all stages' orders together can run to completion when each
/// stage runs its list strictly in order and blocks until the task's
/// dependencies are done: `F(vs, k)` needs `F(vs − 1, k)`; `B(vs, k)` needs
/// `F(vs, k)` and `B(vs + 1, k)` (the last virtual stage's backward needs
/// only its own forward). Also checks that every stage runs each of its
/// `2·chunks·micro_batches` tasks exactly once. A deadlock is reported with
/// every stuck stage and the task it waits at.
pub fn check_runnable(
    orders: &[Vec<Task>],
    pp: usize,
    chunks: usize,
    micro_batches: usize,
) -> Result<(), ScheduleError> {
    check_shape(pp, chunks, micro_batches)?;
    if orders.len() != pp {
        return Err(ScheduleError::StageCount {
            expected: pp,
            got: orders.len(),
        });
    }
    for (stage, order) in orders.iter().enumerate() {
        check_complete(stage, order, chunks, micro_batches)?;
    }
    let mut done = Done::new(pp * chunks, micro_batches);
    let mut next = vec![0; pp];
    loop {
        let mut progressed = false;
        for (stage, order) in orders.iter().enumerate() {
            while let Some(task) = order.get(next[stage]) {
                let vs = task.chunk * pp + stage;
                if !done.ready(task, vs) {
                    break;
                }
                done.mark(task.phase, vs, task.micro_batch);
                next[stage] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    let stuck: Vec<(usize, Task)> = orders
        .iter()
        .enumerate()
        .filter_map(|(stage, order)| order.get(next[stage]).map(|task| (stage, *task)))
        .collect();
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(ScheduleError::Deadlock { stuck })
    }
}

/// Every task of the stage in range, none twice, none left out.
fn check_complete(
    stage: usize,
    order: &[Task],
    chunks: usize,
    micro_batches: usize,
) -> Result<(), ScheduleError> {
    let mut seen = HashSet::new();
    for &task in order {
        if task.chunk >= chunks || task.micro_batch >= micro_batches {
            return Err(ScheduleError::TaskOutOfRange {
                stage,
                task,
                chunks,
                micro_batches,
            });
        }
        if !seen.insert(task) {
            return Err(ScheduleError::Duplicate { stage, task });
        }
    }
    let all = (0..chunks)
        .flat_map(|c| (0..micro_batches).flat_map(move |k| [Task::forward(c, k), Task::backward(c, k)]));
    for task in all {
        if !seen.contains(&task) {
            return Err(ScheduleError::Missing { stage, task });
        }
    }
    Ok(())
}

/// Which (phase, virtual stage, micro-batch) passes have finished during
/// the simulation in [`check_runnable`].
struct Done {
    virtual_stages: usize,
    micro_batches: usize,
    flags: Vec<bool>,
}

impl Done {
    fn new(virtual_stages: usize, micro_batches: usize) -> Done {
        Done {
            virtual_stages,
            micro_batches,
            flags: vec![false; 2 * virtual_stages * micro_batches],
        }
    }

    fn index(&self, phase: Phase, vs: usize, micro_batch: usize) -> usize {
        let phase = match phase {
            Phase::Forward => 0,
            Phase::Backward => 1,
        };
        (phase * self.virtual_stages + vs) * self.micro_batches + micro_batch
    }

    fn is_done(&self, phase: Phase, vs: usize, micro_batch: usize) -> bool {
        self.flags[self.index(phase, vs, micro_batch)]
    }

    fn mark(&mut self, phase: Phase, vs: usize, micro_batch: usize) {
        let i = self.index(phase, vs, micro_batch);
        self.flags[i] = true;
    }

    /// Whether `task`, running on virtual stage `vs`, has its inputs.
    fn ready(&self, task: &Task, vs: usize) -> bool {
        let k = task.micro_batch;
        match task.phase {
            Phase::Forward => vs == 0 || self.is_done(Phase::Forward, vs - 1, k),
            Phase::Backward => {
                self.is_done(Phase::Forward, vs, k)
                    && (vs + 1 == self.virtual_stages || self.is_done(Phase::Backward, vs + 1, k))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_cost_models::pipeline::in_flight;

    /// Parses `"F0 F1 B0"` (chunk 0) or `"F0@1"` (micro-batch 0, chunk 1).
    fn order(text: &str) -> Vec<Task> {
        text.split_whitespace()
            .map(|token| {
                let (phase, rest) = token.split_at(1);
                let (mb, chunk) = rest.split_once('@').unwrap_or((rest, "0"));
                let (mb, chunk) = (mb.parse().unwrap(), chunk.parse().unwrap());
                match phase {
                    "F" => Task::forward(chunk, mb),
                    "B" => Task::backward(chunk, mb),
                    _ => panic!("bad token {token}"),
                }
            })
            .collect()
    }

    fn all_orders(schedule: Schedule, pp: usize, chunks: usize, m: usize) -> Vec<Vec<Task>> {
        (0..pp)
            .map(|s| stage_order(schedule, s, pp, chunks, m).unwrap())
            .collect()
    }

    /// Every (schedule, pp, chunks, m) the tests sweep: m = 1..=8 for the
    /// one-chunk schedules, multiples of pp up to 4·pp for interleaving.
    fn sweep() -> Vec<(Schedule, usize, usize, usize)> {
        let mut cases = Vec::new();
        for pp in 1..=4 {
            for m in 1..=8 {
                for schedule in [Schedule::Gpipe, Schedule::OneFOneB, Schedule::Interleaved] {
                    cases.push((schedule, pp, 1, m));
                }
            }
            for v in 2..=3 {
                for groups in 1..=4 {
                    cases.push((Schedule::Interleaved, pp, v, groups * pp));
                }
            }
        }
        cases
    }

    #[test]
    fn one_f_one_b_pp2_m4_matches_hand_written() {
        assert_eq!(
            stage_order(Schedule::OneFOneB, 0, 2, 1, 4).unwrap(),
            order("F0 F1 B0 F2 B1 F3 B2 B3")
        );
        assert_eq!(
            stage_order(Schedule::OneFOneB, 1, 2, 1, 4).unwrap(),
            order("F0 B0 F1 B1 F2 B2 F3 B3")
        );
    }

    #[test]
    fn gpipe_runs_all_forwards_then_all_backwards() {
        assert_eq!(
            stage_order(Schedule::Gpipe, 1, 3, 1, 3).unwrap(),
            order("F0 F1 F2 B0 B1 B2")
        );
    }

    #[test]
    fn interleaved_pp2_v2_m2_matches_hand_written() {
        // Stage 0 warms up 2·1 + 1·2 = 4 = m·v steps: everything.
        assert_eq!(
            stage_order(Schedule::Interleaved, 0, 2, 2, 2).unwrap(),
            order("F0@0 F1@0 F0@1 F1@1 B0@1 B1@1 B0@0 B1@0")
        );
        // Stage 1 warms up 0 + 1·2 = 2 steps, then alternates.
        assert_eq!(
            stage_order(Schedule::Interleaved, 1, 2, 2, 2).unwrap(),
            order("F0@0 F1@0 F0@1 B0@1 F1@1 B1@1 B0@0 B1@0")
        );
    }

    #[test]
    fn interleaved_with_one_chunk_is_one_f_one_b() {
        for pp in 1..=4 {
            for m in 1..=8 {
                assert_eq!(
                    all_orders(Schedule::Interleaved, pp, 1, m),
                    all_orders(Schedule::OneFOneB, pp, 1, m)
                );
            }
        }
    }

    #[test]
    fn every_schedule_is_complete_and_runnable() {
        for (schedule, pp, v, m) in sweep() {
            let orders = all_orders(schedule, pp, v, m);
            for order in &orders {
                assert_eq!(order.len(), 2 * v * m, "{schedule} pp={pp} v={v} m={m}");
            }
            check_runnable(&orders, pp, v, m)
                .unwrap_or_else(|e| panic!("{schedule} pp={pp} v={v} m={m}: {e}"));
        }
    }

    #[test]
    fn peaks_match_the_cost_model() {
        for (schedule, pp, v, m) in sweep() {
            for s in 0..pp {
                let peak = peak_in_flight(&stage_order(schedule, s, pp, v, m).unwrap());
                let case = format!("{schedule} pp={pp} v={v} m={m} stage={s}");
                match schedule {
                    Schedule::Gpipe => assert_eq!(peak, m, "{case}"),
                    Schedule::OneFOneB => {
                        assert!(peak <= pp - s, "{case}");
                        assert_eq!(peak, (pp - s).min(m), "{case}");
                    }
                    // With one chunk the schedule is 1F1B (checked above); the
                    // cost model's interleaved formula is Megatron's, for v > 1.
                    Schedule::Interleaved if v == 1 => {}
                    Schedule::Interleaved => {
                        let chunks = in_flight(schedule, s, pp, v, m) * v as f64;
                        assert_eq!(peak as f64, chunks, "{case}");
                    }
                }
            }
        }
    }

    #[test]
    fn peak_counts_forwards_not_yet_backwarded() {
        assert_eq!(peak_in_flight(&order("F0 F1 B0 F2 B1 B2")), 2);
        assert_eq!(peak_in_flight(&order("F0@0 F0@1 B0@1 B0@0")), 2);
        assert_eq!(peak_in_flight(&order("B0 F0")), 1);
        assert_eq!(peak_in_flight(&[]), 0);
    }

    #[test]
    fn bad_shapes_are_rejected() {
        use ScheduleError::*;
        let err = |schedule, stage, pp, chunks, m| stage_order(schedule, stage, pp, chunks, m).unwrap_err();
        assert_eq!(err(Schedule::OneFOneB, 0, 0, 1, 4), NoStages);
        assert_eq!(
            err(Schedule::OneFOneB, 2, 2, 1, 4),
            StageOutOfRange { stage: 2, pp: 2 }
        );
        assert_eq!(err(Schedule::Interleaved, 0, 2, 0, 4), NoChunks);
        assert_eq!(err(Schedule::Gpipe, 0, 2, 1, 0), NoMicroBatches);
        assert_eq!(
            err(Schedule::Gpipe, 0, 2, 2, 4),
            ChunksNeedInterleaving {
                schedule: Schedule::Gpipe,
                chunks: 2
            }
        );
        assert_eq!(
            err(Schedule::OneFOneB, 0, 2, 3, 4),
            ChunksNeedInterleaving {
                schedule: Schedule::OneFOneB,
                chunks: 3
            }
        );
        assert_eq!(
            err(Schedule::Interleaved, 0, 4, 2, 6),
            MicroBatchesNotMultipleOfStages {
                micro_batches: 6,
                pp: 4
            }
        );
        let message = err(Schedule::Interleaved, 0, 4, 2, 6).to_string();
        assert!(message.contains("(6)") && message.contains("(4)"), "{message}");
    }

    #[test]
    fn incomplete_orders_are_rejected() {
        use ScheduleError::*;
        let good = order("F0 F1 B0 B1");
        assert_eq!(
            check_runnable(std::slice::from_ref(&good), 2, 1, 2),
            Err(StageCount { expected: 2, got: 1 })
        );
        assert_eq!(
            check_runnable(&[order("F0 F1 B0 B0")], 1, 1, 2),
            Err(Duplicate {
                stage: 0,
                task: Task::backward(0, 0)
            })
        );
        assert_eq!(
            check_runnable(&[good.clone(), order("F0 F1 B0")], 2, 1, 2),
            Err(Missing {
                stage: 1,
                task: Task::backward(0, 1)
            })
        );
        assert_eq!(
            check_runnable(&[order("F0 F1 B0 B1 F2")], 1, 1, 2),
            Err(TaskOutOfRange {
                stage: 0,
                task: Task::forward(0, 2),
                chunks: 1,
                micro_batches: 2
            })
        );
        assert_eq!(check_runnable(&[good], 1, 1, 0), Err(NoMicroBatches));
    }

    #[test]
    fn deadlocks_name_the_stuck_stages() {
        // A backward before its own forward blocks the stage on itself.
        let err = check_runnable(&[order("B0 F0")], 1, 1, 1).unwrap_err();
        assert_eq!(
            err,
            ScheduleError::Deadlock {
                stuck: vec![(0, Task::backward(0, 0))]
            }
        );
        assert_eq!(err.to_string(), "deadlock: stage 0 waits at B(chunk 0, mb 0)");
        // Stage 0 waits for stage 1's B0, which stage 1 runs only after F1,
        // which needs stage 0's F1, which comes after B0.
        let err = check_runnable(&[order("F0 B0 F1 B1"), order("F0 F1 B0 B1")], 2, 1, 2).unwrap_err();
        assert_eq!(
            err,
            ScheduleError::Deadlock {
                stuck: vec![(0, Task::backward(0, 0)), (1, Task::forward(0, 1))]
            }
        );
    }
}
