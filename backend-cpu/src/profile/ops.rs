//! Per-op rates of the CPU backend, measured on the nodes of real training
//! graphs (forward, loss and autodiff backward of small zoo models).
//!
//! Element-wise chains, normalisations and their primitive gradients run at
//! very different speeds per byte (an `Erf` costs far more than an `Add`), so
//! one streaming bandwidth cannot price them. Instead every node of each
//! profiled graph is timed in place during ordinary interpreter runs
//! ([`autopar_ir::interp::run_with`]), on the values the run gives it (real token
//! indices, shapes, routing), with the caches as warm as a real run leaves
//! them. GEMMs are left to the matmul grid, except for the bias some of
//! them broadcast first, whose time over the grid's is fitted here.
//!
//! Rates are fitted per kernel ([`NodeWork::kernel`]), dtype and size (a
//! factor-of-two band of bytes, as speed per byte drops where tensors
//! outgrow a cache), so that `Σ overhead + Σ work / rate` equals the
//! measured total of the band's nodes: the nodes that take the time weigh
//! the most, and the profiled graphs' per-op sums are reproduced. The work
//! is the nodes' bytes or their FLOPs, whichever predicts the single nodes
//! better.

use super::{four_digits, Plan, ProfileError};
use autopar_cost_models::calibration::OpRate;
use autopar_cost_models::measured::{gemm_seconds, gemm_shape, node_work, priced_as_matmul, NodeWork};
use autopar_cost_models::Calibration;
use autopar_exec::train::{initialize, Data};
use autopar_import::ModelSpec;
use autopar_ir::interp::{run_with, Precision, RunError};
use autopar_ir::{DType, NodeIndex, Value};
use autopar_lower::{training_graph, Objective, TrainingGraph};
use std::collections::BTreeMap;
use std::time::Instant;

/// One timed node: its work and the seconds its rate has to explain.
struct Instance {
    work: NodeWork,
    seconds: f64,
}

/// Rates of the kernels in the plan's training graphs, run in both
/// precisions. `cal` holds the per-op overhead, taken off every node, and
/// the matmul grid, whose GEMM time is taken off the nodes that also
/// broadcast a bias.
pub(super) fn op_rates(plan: &Plan, cal: &Calibration) -> Result<Vec<OpRate>, ProfileError> {
    let mut instances = Vec::new();
    for spec in &plan.models {
        let model = ModelGraph::new(spec, plan.micro_batch)?;
        for precision in [Precision::F32, Precision::F64] {
            instances.extend(model.time_nodes(precision, plan.passes, cal)?);
        }
    }
    Ok(fit(&instances, cal.kernel_overhead_s))
}

/// A profiled model's training graph, with weights and feeds.
struct ModelGraph {
    spec: String,
    training: TrainingGraph,
    feeds: BTreeMap<String, Value>,
}

impl ModelGraph {
    fn new(spec: &str, micro_batch: usize) -> Result<ModelGraph, ProfileError> {
        let model_error = |message: String| ProfileError::Model {
            spec: spec.into(),
            message,
        };
        let parsed: ModelSpec = spec.parse().map_err(|e| model_error(format!("{e}")))?;
        let seq = match &parsed {
            ModelSpec::Gpt(c) => c.seq,
            ModelSpec::Llama(c) => c.seq,
            ModelSpec::Bert(c) => c.seq,
        };
        let model = parsed.build().map_err(|e| model_error(format!("{e}")))?;
        let mut training = training_graph(&model, micro_batch, seq, micro_batch, Objective::Lm)
            .map_err(|e| model_error(format!("{e}")))?;
        initialize(&mut training.graph, 0).map_err(|e| model_error(format!("{e}")))?;
        let feeds = feeds(&training).map_err(model_error)?;
        Ok(ModelGraph {
            spec: spec.into(),
            training,
            feeds,
        })
    }

    /// The nodes a rate is fitted to, each with its least time over
    /// `passes` runs (other work on the host only ever adds time); GEMMs
    /// only where they broadcast a bias, with the grid's time taken off.
    fn time_nodes(
        &self,
        precision: Precision,
        passes: usize,
        cal: &Calibration,
    ) -> Result<Vec<Instance>, ProfileError> {
        let graph = &self.training.graph;
        let mut seconds: BTreeMap<NodeIndex, f64> = BTreeMap::new();
        for _ in 0..passes {
            run_with(graph, &self.feeds, precision, |idx, op, args| {
                let start = Instant::now();
                let out = op.eval(args);
                let t = start.elapsed().as_secs_f64();
                seconds.entry(idx).and_modify(|s| *s = s.min(t)).or_insert(t);
                out
            })
            .map_err(|e: RunError| ProfileError::Model {
                spec: self.spec.clone(),
                message: e.to_string(),
            })?;
        }
        let mut instances = Vec::new();
        for (idx, seconds) in seconds {
            let work = node_work(graph, idx, precision);
            let seconds = match gemm_shape(graph, idx) {
                // The grid was measured: its samples give every rate.
                Some(shape) if work.kernel.ends_with("(bias)") => {
                    seconds - gemm_seconds(cal, 0.0, work.dtype, work.flops, shape)
                }
                _ if priced_as_matmul(&graph.node(idx).op) => continue,
                _ => seconds,
            };
            instances.push(Instance { work, seconds });
        }
        Ok(instances)
    }
}

/// Values for the training graph's data inputs, as a run feeds the first
/// micro-batch of its first step from synthetic data.
fn feeds(t: &TrainingGraph) -> Result<BTreeMap<String, Value>, String> {
    let g = &t.graph;
    let data = Data::open(&t.task, None, None, 0).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for (name, feed) in &t.feeds {
        let tensor = g
            .tensors()
            .find(|(_, x)| x.name == *name)
            .map(|(_, x)| x)
            .ok_or_else(|| format!("feed '{name}' is not a tensor of the training graph"))?;
        let shape = tensor
            .ty
            .shape
            .resolve(&g.bindings)
            .ok_or_else(|| format!("feed '{name}' has unbound dims {}", tensor.ty.shape))?;
        let value = data
            .batch(
                &t.task,
                *feed,
                name,
                tensor.ty.dtype,
                &shape,
                (0, t.micro_batch),
                0,
            )
            .map_err(|e| format!("feed '{name}': {e}"))?;
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// Rates per kernel, dtype and size band (bytes within a factor of √2 of a
/// power of two), tagged with their nodes' geometric mean size. The work
/// measure is chosen per kernel and dtype over all sizes and models (where
/// shapes differ most): bytes or, where the nodes have any, FLOPs, whichever
/// single rate predicts the nodes with less total error. Each band then gets
/// `rate = Σ work / Σ (seconds - overhead)`; a band whose time is all
/// overhead gets no rate.
fn fit(instances: &[Instance], overhead: f64) -> Vec<OpRate> {
    let mut kernels: BTreeMap<(String, DType), Vec<&Instance>> = BTreeMap::new();
    for i in instances {
        kernels
            .entry((i.work.kernel.clone(), i.work.dtype))
            .or_default()
            .push(i);
    }
    let mut rates = Vec::new();
    for ((op, dtype), nodes) in kernels {
        let by_bytes = |w: &NodeWork| w.bytes;
        let by_flops = |w: &NodeWork| w.flops;
        let error = |work: fn(&NodeWork) -> f64| {
            rate(&nodes, overhead, work).map(|r| {
                nodes
                    .iter()
                    .map(|i| (overhead + work(&i.work) / r - i.seconds).abs())
                    .sum::<f64>()
            })
        };
        let use_flops = match (error(by_bytes), error(by_flops)) {
            (Some(b), Some(f)) => f < b,
            (b, _) => b.is_none(),
        };
        let work = if use_flops { by_flops } else { by_bytes };
        let mut bands: BTreeMap<i32, Vec<&Instance>> = BTreeMap::new();
        for &i in &nodes {
            bands
                .entry(i.work.bytes.max(1.0).log2().round() as i32)
                .or_default()
                .push(i);
        }
        for band in bands.values() {
            let Some(r) = rate(band, overhead, work) else {
                continue;
            };
            let log_size = band.iter().map(|i| i.work.bytes.max(1.0).ln()).sum::<f64>() / band.len() as f64;
            let r = Some(four_digits(r));
            rates.push(OpRate {
                op: op.clone(),
                dtype,
                at_bytes: Some(four_digits(log_size.exp())),
                bytes_per_s: if use_flops { None } else { r },
                flops_per_s: if use_flops { r } else { None },
            });
        }
    }
    rates
}

/// `Σ work / Σ (seconds - overhead)` over `nodes`; `None` when either sum
/// is not positive.
fn rate(nodes: &[&Instance], overhead: f64, work: fn(&NodeWork) -> f64) -> Option<f64> {
    let total: f64 = nodes.iter().map(|i| work(&i.work)).sum();
    let net: f64 = nodes.iter().map(|i| i.seconds - overhead).sum();
    (total > 0.0 && net > 0.0).then(|| total / net)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(op: &str, flops: f64, bytes: f64, seconds: f64) -> Instance {
        Instance {
            work: NodeWork {
                kernel: op.into(),
                dtype: DType::F32,
                flops,
                bytes,
            },
            seconds,
        }
    }

    fn op_rate(op: &str, at_bytes: f64, bytes_per_s: Option<f64>, flops_per_s: Option<f64>) -> OpRate {
        OpRate {
            op: op.into(),
            dtype: DType::F32,
            at_bytes: Some(at_bytes),
            bytes_per_s,
            flops_per_s,
        }
    }

    #[test]
    fn fit_matches_each_bands_total_and_picks_the_better_work_measure() {
        let rates = fit(
            &[
                // Time follows bytes: 1 + bytes / 100.
                instance("Add", 50.0, 100.0, 2.0),
                instance("Add", 500.0, 110.0, 2.1),
                // Four times the size, half the speed: 1 + bytes / 50.
                instance("Add", 5.0, 400.0, 9.0),
                // Time follows FLOPs: 1 + flops / 10, in both bands.
                instance("Attention", 10.0, 1000.0, 2.0),
                instance("Attention", 40.0, 1000.0, 5.0),
                instance("Attention", 20.0, 3000.0, 3.0),
                // All overhead: no rate.
                instance("Reshape", 0.0, 0.0, 0.5),
            ],
            1.0,
        );
        let expected = vec![
            op_rate("Add", 104.9, Some(100.0), None),
            op_rate("Add", 400.0, Some(50.0), None),
            op_rate("Attention", 1000.0, None, Some(10.0)),
            op_rate("Attention", 3000.0, None, Some(10.0)),
        ];
        assert_eq!(rates, expected);
    }
}
