//! What a simulation found: the step time, where each rank's time went
//! (busy, waiting on which collective, idle in the pipeline), memory peaks,
//! the comparison with the analytic estimate term by term, and a terminal
//! timeline of the pipeline.

use super::compile::{Activity, Compiled};
use super::engine::Timeline;
use super::ranks::Representatives;
use autopar_cost_models::TimeBreakdown;
use autopar_exec::trace::TraceEvent;
use autopar_lower::Strategy;
use serde::Serialize;
use std::collections::BTreeMap;

/// One replayed rank.
#[derive(Debug, Clone, Serialize)]
pub struct RankReport {
    pub rank: usize,
    /// Pipeline stage.
    pub stage: usize,
    /// Ranks whose timeline this one stands for (itself included).
    pub represents: usize,
    /// Compute stream busy (forward, backward, recomputation, optimizer).
    pub busy_s: f64,
    /// Communication stream busy.
    pub communication_s: f64,
    /// Compute stream idle: waiting on collectives, other stages or the step's end.
    pub idle_s: f64,
    /// Idle waiting on other pipeline stages (fill, drain, transfers).
    pub bubble_s: f64,
    /// Compute-stream seconds per activity (busy, or waiting on it).
    pub seconds: BTreeMap<String, f64>,
    pub peak_memory_bytes: f64,
}

/// One term of the step time, analytic next to simulated.
#[derive(Debug, Clone, Serialize)]
pub struct Term {
    pub term: String,
    pub analytic_s: f64,
    pub simulated_s: f64,
}

/// One row of the pipeline timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    pub rank: usize,
    pub stage: usize,
    pub cells: Vec<Option<Activity>>,
}

/// A simulated training step.
#[derive(Debug, Clone, Serialize)]
pub struct Simulation {
    pub step_time_s: f64,
    /// Mean over ranks of the step's fraction spent idle in the pipeline.
    pub bubble_fraction: f64,
    pub world: usize,
    /// Ranks replayed; the others are symmetric to one of them.
    pub simulated_ranks: usize,
    pub per_rank: Vec<RankReport>,
    #[serde(skip)]
    pub timelines: Vec<Timeline>,
    #[serde(skip)]
    pub trace: Vec<TraceEvent>,
}

impl Simulation {
    pub(super) fn new(
        s: &Strategy,
        reps: &Representatives,
        programs: &[Compiled],
        timelines: Vec<Timeline>,
        trace: Vec<TraceEvent>,
    ) -> Simulation {
        let step = timelines.iter().map(|t| t.end_s).fold(0.0, f64::max);
        let per_rank: Vec<RankReport> = programs
            .iter()
            .zip(&timelines)
            .enumerate()
            .map(|(class, (p, t))| {
                let get = |a| t.seconds.get(&a).copied().unwrap_or(0.0);
                RankReport {
                    rank: p.rank,
                    stage: s.ranks[p.rank].pp,
                    represents: reps.members[class],
                    busy_s: t.busy_s,
                    communication_s: t.comm_busy_s,
                    idle_s: (step - t.busy_s).max(0.0),
                    bubble_s: get(Activity::Pipeline),
                    seconds: t
                        .seconds
                        .iter()
                        .map(|(&a, &v)| (a.name().to_string(), v))
                        .collect(),
                    peak_memory_bytes: t.peak_memory_bytes,
                }
            })
            .collect();
        let weight: usize = per_rank.iter().map(|r| r.represents).sum();
        let bubble_fraction = if step > 0.0 && weight > 0 {
            per_rank
                .iter()
                .map(|r| r.bubble_s / step * r.represents as f64)
                .sum::<f64>()
                / weight as f64
        } else {
            0.0
        };
        Simulation {
            step_time_s: step,
            bubble_fraction,
            world: s.world(),
            simulated_ranks: programs.len(),
            per_rank,
            timelines,
            trace,
        }
    }

    /// Whether ranks were folded into representatives.
    pub fn reduced(&self) -> bool {
        self.simulated_ranks < self.world
    }

    /// The rank that computes longest: the pipeline's slowest stage, whose
    /// time the analytic breakdown describes.
    fn slowest(&self) -> Option<usize> {
        (0..self.timelines.len()).max_by(|&a, &b| {
            let c = |i: usize| {
                let t = &self.timelines[i];
                [Activity::Forward, Activity::Backward, Activity::Recompute]
                    .iter()
                    .map(|a| t.seconds.get(a).copied().unwrap_or(0.0))
                    .sum::<f64>()
            };
            c(a).total_cmp(&c(b))
        })
    }

    /// The step's terms on the slowest stage, simulated next to `analytic`.
    /// The simulated terms add up to the simulated step time.
    pub fn terms(&self, analytic: &TimeBreakdown) -> Vec<Term> {
        let Some(i) = self.slowest() else {
            return Vec::new();
        };
        let t = &self.timelines[i];
        let get = |acts: &[Activity]| {
            acts.iter()
                .map(|a| t.seconds.get(a).copied().unwrap_or(0.0))
                .sum::<f64>()
        };
        let row = |term: &str, analytic_s: f64, simulated_s: f64| Term {
            term: term.into(),
            analytic_s,
            simulated_s,
        };
        vec![
            row(
                "compute",
                analytic.compute_s,
                get(&[Activity::Forward, Activity::Backward, Activity::Recompute]),
            ),
            row(
                "tensor-parallel comm",
                analytic.tp_comm_s,
                get(&[Activity::TensorComm]),
            ),
            row(
                "context-parallel comm",
                analytic.cp_comm_s,
                get(&[Activity::ContextComm]),
            ),
            row(
                "expert-parallel comm",
                analytic.ep_comm_s,
                get(&[Activity::ExpertComm]),
            ),
            row(
                "data-parallel comm",
                analytic.dp_comm_s,
                get(&[Activity::DataComm]),
            ),
            row(
                "pipeline bubble and p2p",
                analytic.bubble_s + analytic.p2p_s,
                get(&[Activity::Pipeline]),
            ),
            row(
                "optimizer and accumulation",
                analytic.optimizer_s,
                get(&[Activity::Optimizer, Activity::Other]),
            ),
        ]
    }

    /// The timeline's rows: one per replayed rank (at most `rows`, evenly
    /// picked), `width` cells over the step, each the activity the compute
    /// stream spent most of that time on (`None`: nothing ran). The terminal
    /// timeline and the plan report draw these.
    pub fn timeline_rows(&self, width: usize, rows: usize) -> Vec<TimelineRow> {
        self.timeline_rows_until(self.step_time_s, width, rows)
    }

    /// When the pipeline has filled: the latest first backward pass of any
    /// replayed rank (0 without a backward pass). Before it, the timeline
    /// shows the schedule's warm-up, which a whole step's cells are too
    /// coarse to draw.
    pub fn warmed_up_s(&self) -> f64 {
        self.timelines
            .iter()
            .filter_map(|t| {
                t.stretches
                    .iter()
                    .find(|s| s.2 == Activity::Backward)
                    .map(|s| s.0)
            })
            .fold(0.0, f64::max)
    }

    /// [`Simulation::timeline_rows`] over the step's first `until` seconds.
    pub fn timeline_rows_until(&self, until: f64, width: usize, rows: usize) -> Vec<TimelineRow> {
        let step = until.min(self.step_time_s);
        let n = self.timelines.len();
        if n == 0 || step <= 0.0 || width == 0 || rows == 0 {
            return Vec::new();
        }
        let picked: Vec<usize> = if n <= rows {
            (0..n).collect()
        } else {
            (0..rows).map(|k| k * (n - 1) / (rows - 1).max(1)).collect()
        };
        picked
            .into_iter()
            .map(|i| {
                let mut cells = vec![BTreeMap::<Activity, f64>::new(); width];
                for &(a, b, act) in self.timelines[i].stretches.iter().take_while(|s| s.0 < step) {
                    let first = ((a / step) * width as f64).floor() as usize;
                    let last = (((b / step) * width as f64).ceil() as usize).min(width);
                    for (c, cell) in cells.iter_mut().enumerate().take(last).skip(first) {
                        let lo = (c as f64 / width as f64 * step).max(a);
                        let hi = ((c + 1) as f64 / width as f64 * step).min(b);
                        if hi > lo {
                            *cell.entry(act).or_insert(0.0) += hi - lo;
                        }
                    }
                }
                TimelineRow {
                    rank: self.per_rank[i].rank,
                    stage: self.per_rank[i].stage,
                    cells: cells
                        .iter()
                        .map(|cell| cell.iter().max_by(|a, b| a.1.total_cmp(b.1)).map(|(&a, _)| a))
                        .collect(),
                }
            })
            .collect()
    }

    /// A terminal timeline: [`Simulation::timeline_rows`], one character a cell.
    pub fn timeline(&self, width: usize, rows: usize) -> String {
        let picked = self.timeline_rows(width, rows);
        if picked.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        for r in &picked {
            let line: String = r.cells.iter().map(|c| c.map_or(' ', Activity::symbol)).collect();
            out.push_str(&format!("rank {:>5} (stage {:>3}) |{line}|\n", r.rank, r.stage));
        }
        if picked.len() < self.timelines.len() {
            out.push_str(&format!(
                "({} of {} stages shown)\n",
                picked.len(),
                self.timelines.len()
            ));
        }
        out.push_str(
            "F forward  B backward  R recompute  O optimizer  t/c/e/d waiting on tensor/context/expert/data-parallel comm  . pipeline idle\n",
        );
        out
    }
}
