//! Splitting layers into pipeline stages and choosing each stage's
//! recomputation.
//!
//! Given a split, each stage independently takes the least recomputation
//! that fits the memory limit: stage times and memory do not depend on each
//! other, and the step time grows with every stage's time. Splits are
//! enumerated exhaustively when there are few (exact), and otherwise found
//! by a binary search on the slowest stage's time: each stage takes as many
//! layers as fit under that time and the memory limit, and surplus layers
//! leave the stages where they cost the most.

use autopar_cost_models::pipeline::Stage;
use autopar_cost_models::{EstimateError, Evaluator, Recompute, Schedule, StageSpec, TrainingConfig};

/// At most this many splits are enumerated exhaustively.
const EXHAUSTIVE_SPLITS: u64 = 64;

const POLICIES: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

/// What choosing stages found.
#[derive(Debug, Clone, PartialEq)]
pub enum StageChoice {
    /// The best split that fits, with each stage's policy.
    Fits(Vec<StageSpec>),
    /// Nothing fits; the lowest peak memory seen, in bytes.
    TooBig(f64),
}

fn stage(index: usize, pp: usize, layers: usize, recompute: Recompute) -> Stage {
    Stage {
        index,
        layers,
        first: index == 0,
        last: index + 1 == pp,
        recompute,
    }
}

/// The least recomputation under which stage `index` with `layers` layers
/// fits in `limit`; or the lowest memory it can reach.
fn fitting_policy(
    ev: &Evaluator,
    cfg: &TrainingConfig,
    index: usize,
    layers: usize,
    limit: f64,
) -> Result<Recompute, f64> {
    let mut lowest = f64::INFINITY;
    for policy in POLICIES {
        let memory = ev.stage_memory(cfg, &stage(index, cfg.pp, layers, policy)).total;
        if memory <= limit {
            return Ok(policy);
        }
        lowest = lowest.min(memory);
    }
    Err(lowest)
}

/// Chooses the stages of `cfg` (its `stages` field is ignored) for a model
/// of `layers` repeated layers under a per-GPU memory `limit`.
pub fn choose(
    ev: &Evaluator,
    cfg: &TrainingConfig,
    layers: usize,
    limit: f64,
) -> Result<StageChoice, EstimateError> {
    let pp = cfg.pp;
    if pp == 1 || cfg.schedule == Schedule::Interleaved {
        // One stage, or Megatron-LM's interleaving, which needs equal chunks.
        if layers % (pp * cfg.virtual_stages) != 0 && pp > 1 {
            return Ok(StageChoice::TooBig(f64::INFINITY));
        }
        return with_policies(ev, cfg, &vec![layers / pp; pp], limit);
    }
    if splits(layers, pp) <= EXHAUSTIVE_SPLITS {
        exhaustive(ev, cfg, layers, limit)
    } else {
        balanced(ev, cfg, layers, limit)
    }
}

/// Per-stage policies for a fixed split.
fn with_policies(
    ev: &Evaluator,
    cfg: &TrainingConfig,
    split: &[usize],
    limit: f64,
) -> Result<StageChoice, EstimateError> {
    let mut specs = Vec::with_capacity(split.len());
    let mut lowest: f64 = 0.0;
    let mut fits = true;
    for (s, &n) in split.iter().enumerate() {
        match fitting_policy(ev, cfg, s, n, limit) {
            Ok(recompute) => specs.push(StageSpec { layers: n, recompute }),
            Err(memory) => {
                fits = false;
                lowest = lowest.max(memory);
            }
        }
    }
    Ok(if fits {
        StageChoice::Fits(specs)
    } else {
        StageChoice::TooBig(lowest)
    })
}

/// Number of ways to give `layers` layers to `pp` stages, at least one each.
fn splits(layers: usize, pp: usize) -> u64 {
    if layers < pp {
        return 0;
    }
    // C(layers − 1, pp − 1), saturating.
    let (n, k) = ((layers - 1) as u64, (pp - 1) as u64);
    let k = k.min(n - k);
    let mut c: u64 = 1;
    for i in 0..k {
        c = c.saturating_mul(n - i) / (i + 1);
        if c > EXHAUSTIVE_SPLITS {
            return c;
        }
    }
    c
}

/// Every split, each with its best policies; the fastest step wins (ties:
/// the first in lexicographic order of layer counts).
fn exhaustive(
    ev: &Evaluator,
    cfg: &TrainingConfig,
    layers: usize,
    limit: f64,
) -> Result<StageChoice, EstimateError> {
    let pp = cfg.pp;
    let mut best: Option<(f64, Vec<StageSpec>)> = None;
    let mut lowest = f64::INFINITY;
    let mut split = vec![1usize; pp];
    split[pp - 1] = layers - (pp - 1);
    loop {
        match with_policies(ev, cfg, &split, limit)? {
            StageChoice::Fits(specs) => {
                let mut candidate = cfg.clone();
                candidate.stages = Some(specs.clone());
                let step = ev.step_seconds(&candidate)?;
                if best.as_ref().is_none_or(|(t, _)| step < *t) {
                    best = Some((step, specs));
                }
            }
            StageChoice::TooBig(m) => lowest = lowest.min(m),
        }
        if !next_split(&mut split) {
            break;
        }
    }
    Ok(match best {
        Some((_, specs)) => StageChoice::Fits(specs),
        None => StageChoice::TooBig(lowest),
    })
}

/// Advances `split` (positive parts, fixed sum) to the next composition in
/// lexicographic order; false after the last.
fn next_split(split: &mut [usize]) -> bool {
    let p = split.len();
    // The rightmost part but the last that can grow takes one from the tail.
    for i in (0..p - 1).rev() {
        let tail: usize = split[i + 1..].iter().sum();
        if tail > p - 1 - i {
            split[i] += 1;
            let rest = tail - 1;
            for x in split[i + 1..p - 1].iter_mut() {
                *x = 1;
            }
            split[p - 1] = rest - (p - 2 - i);
            return true;
        }
    }
    false
}

/// A stage's time and memory as lines in its layer count, for one policy:
/// exact at one and two layers, extrapolated beyond (the final split is
/// checked exactly).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Line {
    /// Seconds per micro-batch with one layer, and per extra layer.
    time_one: f64,
    time_per_layer: f64,
    /// Most layers that fit the memory limit (0: not even one).
    memory_cap: usize,
}

impl Line {
    /// Stage `s`'s line under `policy`, given its seconds with one and two
    /// layers `(t1, t2)`.
    fn of(
        ev: &Evaluator,
        cfg: &TrainingConfig,
        (s, policy): (usize, Recompute),
        (t1, t2): (f64, f64),
        layers: usize,
        limit: f64,
    ) -> Line {
        let at = |n| stage(s, cfg.pp, n, policy);
        let (m1, m2) = (
            ev.stage_memory(cfg, &at(1)).total,
            ev.stage_memory(cfg, &at(2)).total,
        );
        let per_layer = m2 - m1;
        let memory_cap = if m1 > limit {
            0
        } else if m2 > limit {
            1
        } else if per_layer <= 0.0 {
            layers
        } else {
            (2 + ((limit - m2) / per_layer).floor() as usize).min(layers)
        };
        Line {
            time_one: t1,
            time_per_layer: (t2 - t1).max(f64::MIN_POSITIVE),
            memory_cap,
        }
    }

    /// Most layers that fit under `t` seconds and the memory limit.
    fn capacity(&self, t: f64) -> usize {
        if t < self.time_one {
            return 0;
        }
        let by_time = 1 + ((t - self.time_one) / self.time_per_layer).floor() as usize;
        by_time.min(self.memory_cap)
    }

    fn time(&self, n: usize) -> f64 {
        self.time_one + (n.max(1) - 1) as f64 * self.time_per_layer
    }
}

/// Whether a stage is the first and the last, and its recomputation.
type StageClass = (bool, bool, Recompute);

/// Binary search on the slowest stage's time over line models of each
/// stage and policy, then an exact check of the split found.
fn balanced(
    ev: &Evaluator,
    cfg: &TrainingConfig,
    layers: usize,
    limit: f64,
) -> Result<StageChoice, EstimateError> {
    let pp = cfg.pp;
    // A stage's seconds depend on its layers, policy and whether it is the
    // first or the last (its memory also on how many micro-batches it keeps
    // in flight): the middle stages share one set of times.
    let mut times: Vec<(StageClass, (f64, f64))> = Vec::new();
    let mut lines = Vec::with_capacity(pp);
    for s in 0..pp {
        let mut per_policy = Vec::with_capacity(POLICIES.len());
        for policy in POLICIES {
            let at = |n| stage(s, pp, n, policy);
            let class = (at(1).first, at(1).last, policy);
            let t = match times.iter().find(|(c, _)| *c == class) {
                Some(&(_, t)) => t,
                None => {
                    let t = (ev.stage_seconds(cfg, &at(1))?, ev.stage_seconds(cfg, &at(2))?);
                    times.push((class, t));
                    t
                }
            };
            per_policy.push(Line::of(ev, cfg, (s, policy), t, layers, limit));
        }
        lines.push(per_policy);
    }
    let capacity = |t: f64, lines: &[Line]| lines.iter().map(|l| l.capacity(t)).max().unwrap_or(0);
    // Stages with the same lines (the middle ones where memory does not
    // bind) take the same capacity: the search asks each kind once.
    let mut kinds: Vec<(&[Line], usize)> = Vec::new();
    for l in &lines {
        match kinds.iter_mut().find(|(k, _)| *k == l.as_slice()) {
            Some((_, n)) => *n += 1,
            None => kinds.push((l, 1)),
        }
    }
    let fits_at = |t: f64| {
        let mut sum = 0;
        for &(k, n) in &kinds {
            match capacity(t, k) {
                0 => return false,
                c => sum += c * n,
            }
        }
        sum >= layers
    };
    let caps_at = |t: f64| fits_at(t).then(|| lines.iter().map(|l| capacity(t, l)).collect::<Vec<usize>>());
    let hi_time = (0..pp)
        .flat_map(|s| lines[s].iter().map(|l| l.time(layers)))
        .fold(0.0, f64::max);
    let Some(mut caps) = caps_at(hi_time) else {
        let even = stage(0, pp, layers / pp, Recompute::Full);
        return Ok(StageChoice::TooBig(ev.stage_memory(cfg, &even).total));
    };
    let (mut lo, mut hi) = (0.0, hi_time);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        match fits_at(mid) {
            true => hi = mid,
            false => lo = mid,
        }
    }
    if let Some(c) = caps_at(hi) {
        caps = c;
    }
    // Surplus layers leave the stages that would be slowest with them.
    let stage_time = |s: usize, n: usize| {
        lines[s]
            .iter()
            .filter(|l| l.memory_cap >= n)
            .map(|l| l.time(n))
            .fold(f64::INFINITY, f64::min)
    };
    let mut surplus = caps.iter().sum::<usize>() - layers;
    while surplus > 0 {
        let Some(s) = (0..pp)
            .filter(|&s| caps[s] > 1)
            .max_by(|&a, &b| stage_time(a, caps[a]).total_cmp(&stage_time(b, caps[b])))
        else {
            break;
        };
        caps[s] -= 1;
        surplus -= 1;
    }
    with_policies(ev, cfg, &caps, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compositions_in_order() {
        let mut split = vec![1, 1, 3];
        let mut all = vec![split.clone()];
        while next_split(&mut split) {
            all.push(split.clone());
        }
        assert_eq!(
            all,
            vec![
                vec![1, 1, 3],
                vec![1, 2, 2],
                vec![1, 3, 1],
                vec![2, 1, 2],
                vec![2, 2, 1],
                vec![3, 1, 1]
            ]
        );
        assert_eq!(splits(5, 3), 6);
        assert_eq!(splits(2, 3), 0);
        assert!(splits(128, 64) > EXHAUSTIVE_SPLITS);
    }
}
