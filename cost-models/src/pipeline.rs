//! Pipeline geometry: which layers each stage holds, how many micro-batches'
//! activations a schedule keeps in flight, and how long a step of
//! micro-batches takes through the stages.

use crate::config::{Recompute, Schedule, StageSpec};

/// One pipeline stage's share of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    pub index: usize,
    /// Repeated layers on this stage (over all its chunks).
    pub layers: usize,
    /// Holds the part before the layers (embeddings).
    pub first: bool,
    /// Holds the part after the layers (final norm, head).
    pub last: bool,
    /// What its layers recompute.
    pub recompute: Recompute,
}

/// Splits `layers` into `pp · virtual` chunks as evenly as possible (earlier
/// chunks take the remainder) and gives stage `s` chunks `s, s + pp, ...`.
pub fn stages(layers: usize, pp: usize, virtual_stages: usize, recompute: Recompute) -> Vec<Stage> {
    let chunks = pp * virtual_stages;
    let chunk_layers = |c: usize| layers / chunks + usize::from(c < layers % chunks);
    let specs: Vec<StageSpec> = (0..pp)
        .map(|s| StageSpec {
            layers: (0..virtual_stages).map(|v| chunk_layers(s + v * pp)).sum(),
            recompute,
        })
        .collect();
    from_specs(&specs)
}

/// Stages with the given layer counts and recomputation, in order.
pub fn from_specs(specs: &[StageSpec]) -> Vec<Stage> {
    let pp = specs.len();
    specs
        .iter()
        .enumerate()
        .map(|(s, spec)| Stage {
            index: s,
            layers: spec.layers,
            first: s == 0,
            last: s + 1 == pp,
            recompute: spec.recompute,
        })
        .collect()
}

/// Micro-batches whose activations stage `s` holds at its peak, in units of
/// one micro-batch through all of the stage's layers. GPipe holds all `m`;
/// 1F1B holds `pp − s` (at most `m`); interleaved 1F1B holds
/// `2(pp − s − 1) + (v − 1)·pp + 1` chunks of `1/v` of the stage each
/// (Megatron-LM's warm-up count plus the one in progress).
pub fn in_flight(schedule: Schedule, s: usize, pp: usize, virtual_stages: usize, m: usize) -> f64 {
    match schedule {
        Schedule::Gpipe => m as f64,
        Schedule::OneFOneB => (pp - s).min(m) as f64,
        Schedule::Interleaved => {
            let v = virtual_stages;
            let chunks = (2 * (pp - s - 1) + (v - 1) * pp + 1).min(m * v);
            chunks as f64 / v as f64
        }
    }
}

/// Time of `m` micro-batches through stages that each take `stage_times[s]`
/// per micro-batch (forward plus backward): the slowest stage paces the
/// steady state, and filling and draining the pipe costs `(pp − 1)/v` mean
/// stage times (`v` = virtual stages; the classic `(p − 1)/m` bubble).
pub fn step_time(m: usize, virtual_stages: usize, stage_times: &[f64]) -> f64 {
    let pp = stage_times.len();
    if pp == 0 {
        return 0.0;
    }
    let slowest = stage_times.iter().copied().fold(0.0, f64::max);
    let mean = stage_times.iter().sum::<f64>() / pp as f64;
    m as f64 * slowest + (pp - 1) as f64 / virtual_stages as f64 * mean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_spread_over_chunks() {
        let s = stages(10, 4, 1, Recompute::None);
        assert_eq!(s.iter().map(|s| s.layers).collect::<Vec<_>>(), vec![3, 3, 2, 2]);
        assert!(s[0].first && !s[0].last && s[3].last);
        let s = stages(16, 2, 2, Recompute::None);
        assert_eq!(s.iter().map(|s| s.layers).collect::<Vec<_>>(), vec![8, 8]);
        let single = stages(5, 1, 1, Recompute::Full);
        assert!(single[0].first && single[0].last && single[0].layers == 5);
    }

    #[test]
    fn in_flight_matches_the_schedules() {
        assert_eq!(in_flight(Schedule::Gpipe, 0, 4, 1, 16), 16.0);
        assert_eq!(in_flight(Schedule::OneFOneB, 0, 4, 1, 16), 4.0);
        assert_eq!(in_flight(Schedule::OneFOneB, 3, 4, 1, 16), 1.0);
        assert_eq!(in_flight(Schedule::OneFOneB, 0, 4, 1, 2), 2.0);
        // Korthikanti et al.: the first stage of the interleaved schedule holds
        // (1 + (p − 1)/(p·v)) times what 1F1B's holds, here p = 4, v = 2.
        let ratio =
            in_flight(Schedule::Interleaved, 0, 4, 2, 64) / in_flight(Schedule::OneFOneB, 0, 4, 1, 64);
        assert!((ratio - (1.0 + 3.0 / 8.0)).abs() < 1e-12, "{ratio}");
    }

    #[test]
    fn bubble_is_p_minus_one_over_v_stage_times() {
        assert_eq!(step_time(8, 1, &[1.0; 4]), 8.0 + 3.0);
        assert_eq!(step_time(8, 2, &[1.0; 4]), 8.0 + 1.5);
        assert_eq!(step_time(8, 1, &[1.0]), 8.0);
        assert_eq!(step_time(2, 1, &[1.0, 3.0]), 6.0 + 2.0);
    }
}
