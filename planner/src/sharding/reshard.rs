//! Prices: moving a tensor between layouts over the `tp` group (a
//! collective from `comm::time` at the calibrated link rates, as the step
//! estimate prices them) and one rank's share of an op's forward and backward kernels (the compute model's
//! roofline over `Op::cost`).

use super::Layout;
use autopar_cost_models::comm::{self, Algorithm, Span};
use autopar_cost_models::compute::Rates;
use autopar_cost_models::workload::{Kernel, OpWork};
use autopar_cost_models::{Calibration, Cluster};
use autopar_ir::op::sharding as rules;
use autopar_ir::{DType, Op, TensorType};

/// The price of a layout change lowering cannot run: far above any step,
/// so the program never picks it while replicating stays possible.
pub const UNRUNNABLE_S: f64 = 1e3;

/// Prices collectives over ranks `0..tp` and kernels on one device.
pub struct Pricer<'a> {
    /// The cluster with achievable link bandwidths.
    cluster: Cluster,
    span: Span,
    tp: usize,
    rates: Rates<'a>,
}

impl<'a> Pricer<'a> {
    /// A pricer for a `tp`-rank group on `cluster` (which must hold `tp` ranks).
    pub fn new(cluster: &'a Cluster, calibration: &'a Calibration, tp: usize) -> Result<Pricer<'a>, String> {
        let device = &cluster.device;
        let dtype = [DType::F32]
            .into_iter()
            .chain(device.peak_flops.keys().copied())
            .find(|&d| device.peak(d).is_some())
            .unwrap_or(DType::F32);
        let rates = Rates::new(device, calibration, dtype).map_err(|e| e.to_string())?;
        let effective = Cluster {
            intra_node: calibration.effective_link(cluster.intra_node, true),
            inter_node: calibration.effective_link(cluster.inter_node, false),
            ..cluster.clone()
        };
        let ranks: Vec<usize> = (0..tp).collect();
        let span = Span::of(&effective, &ranks).map_err(|e| e.to_string())?;
        Ok(Pricer {
            cluster: effective,
            span,
            tp,
            rates,
        })
    }

    /// Seconds to turn a tensor of `bytes` (whole logical size) laid out as
    /// `from` into `to` by the comm ops lowering runs for the move
    /// ([`rules::moves`]): gathers and reductions; taking a block of a
    /// replicated tensor is free. Turning a whole tensor or a block into a
    /// pending sum is not something lowering runs (its gradient would need
    /// a reduction the layouts do not show), so it costs [`UNRUNNABLE_S`].
    pub fn reshard(&self, from: Layout, to: Layout, bytes: f64) -> Result<f64, String> {
        if from == to || bytes == 0.0 || self.tp < 2 {
            return Ok(0.0);
        }
        let Some(steps) = rules::moves(from, to) else {
            return Ok(UNRUNNABLE_S);
        };
        let mut seconds = 0.0;
        for collective in steps.into_iter().filter_map(|(kind, _)| comm::of_comm(kind)) {
            seconds += comm::time(&self.cluster, self.span, collective, Algorithm::Ring, bytes)
                .map_err(|e| e.to_string())?;
        }
        Ok(seconds)
    }

    /// Seconds one rank spends on an op (forward, plus backward when
    /// `backward`) with its work divided `divisor` ways.
    pub fn compute(
        &self,
        op: &Op,
        inputs: &[Option<TensorType>],
        outputs: &[TensorType],
        divisor: usize,
        backward: bool,
    ) -> f64 {
        let input_refs: Vec<Option<&TensorType>> = inputs.iter().map(Option::as_ref).collect();
        let output_refs: Vec<&TensorType> = outputs.iter().collect();
        let cost = op.cost(&input_refs, &output_refs);
        let div = divisor.max(1) as f64;
        let bytes = match op {
            // A lookup reads only the rows it returns (as the workload model prices it).
            Op::Embedding | Op::Gather { .. } | Op::GatherNd { .. } | Op::GatherElements { .. } => {
                2.0 * outputs
                    .iter()
                    .map(|t| numel(t) * t.dtype.size_bits() as f64 / 8.0)
                    .sum::<f64>()
            }
            _ => cost.bytes_read + cost.bytes_written,
        } / div;
        let dtype = outputs
            .first()
            .map(|t| t.dtype)
            .filter(|d| d.is_float())
            .unwrap_or(DType::F32);
        let work = OpWork {
            node: String::new(),
            kernel: kernel(op, &input_refs, &output_refs),
            dtype,
            forward_flops: cost.forward_flops / div,
            backward_flops: cost.backward_flops / div,
            forward_bytes: bytes,
            // A backward pass reads the output gradient and saved inputs and
            // writes the input gradients: about twice the forward traffic.
            backward_bytes: 2.0 * bytes,
            attention_core: false,
        };
        let backward_s = if backward { self.rates.backward(&work) } else { 0.0 };
        self.rates.forward(&work) + backward_s
    }
}

fn dims(t: &TensorType) -> Vec<f64> {
    t.shape.0.iter().map(|d| d.fixed().unwrap_or(0) as f64).collect()
}

fn numel(t: &TensorType) -> f64 {
    dims(t).iter().product()
}

/// The kernel shape that sets an op's arithmetic rate: products and
/// attention run at the GEMM rate of their shape, the rest stream.
fn kernel(op: &Op, inputs: &[Option<&TensorType>], outputs: &[&TensorType]) -> Kernel {
    let dims_of = |i: usize| inputs.get(i).copied().flatten().map(dims).unwrap_or_default();
    let out = outputs.first().map(|t| dims(t)).unwrap_or_default();
    let out_numel: f64 = out.iter().product();
    let product = |k: f64| {
        let n = out.last().copied().unwrap_or(1.0).max(1.0);
        Kernel::Matmul {
            batch: 1.0,
            m: out_numel / n,
            n,
            k,
        }
    };
    match op {
        Op::Linear | Op::MatMul => product(dims_of(0).last().copied().unwrap_or(1.0)),
        Op::Gemm { trans_a, .. } => product(dims_of(0).get(usize::from(!trans_a)).copied().unwrap_or(1.0)),
        Op::MoeExperts { .. } => match dims_of(3).as_slice() {
            &[_, h, f] => Kernel::Matmul {
                batch: 1.0,
                m: out_numel / h.max(1.0),
                n: f,
                k: h,
            },
            _ => Kernel::Streaming,
        },
        Op::Attention { .. } => match (dims_of(0).as_slice(), dims_of(1).as_slice()) {
            (&[b, h, sq, d], &[_, _, sk, _]) => Kernel::FusedAttention {
                batch: b * h,
                sq,
                sk,
                d,
            },
            _ => Kernel::Streaming,
        },
        _ => Kernel::Streaming,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_ir::Shape;
    use Layout::*;

    #[test]
    fn collectives_are_the_moves_lowering_runs() {
        let cal = Calibration::default();
        let cluster = Cluster::preset("dgx-h100").unwrap().with_gpus(8).unwrap();
        let p = Pricer::new(&cluster, &cal, 4).unwrap();
        let mb = 1e6;
        let t = |a, b| p.reshard(a, b, mb).unwrap();
        assert_eq!(
            (t(Replicate, Shard(1)), t(Partial, Partial), t(Shard(2), Shard(2))),
            (0.0, 0.0, 0.0)
        );
        // Lowering has no way to make a pending sum of whole values.
        assert_eq!(
            (t(Replicate, Partial), t(Shard(0), Partial)),
            (UNRUNNABLE_S, UNRUNNABLE_S)
        );
        // Ring all-reduce = reduce-scatter + all-gather.
        let ar = t(Partial, Replicate);
        assert!(
            (ar - t(Partial, Shard(0)) - t(Shard(0), Replicate)).abs() < 1e-12,
            "{ar}"
        );
        // A block moves to another dim as lowering moves it: gathered, then sliced.
        assert_eq!(t(Shard(0), Shard(1)), t(Shard(0), Replicate));
        let one = Pricer::new(&cluster, &cal, 1).unwrap();
        assert_eq!(one.reshard(Partial, Replicate, mb).unwrap(), 0.0);
    }

    #[test]
    fn divided_work_is_cheaper() {
        let cal = Calibration::default();
        let cluster = Cluster::preset("dgx-h100").unwrap().with_gpus(8).unwrap();
        let p = Pricer::new(&cluster, &cal, 8).unwrap();
        let t = |d: &[usize]| TensorType {
            dtype: DType::Bf16,
            shape: Shape::fixed(d),
        };
        let inputs = [Some(t(&[4, 512, 1024])), Some(t(&[1024, 4096])), None];
        let outputs = [t(&[4, 512, 4096])];
        let whole = p.compute(&Op::Linear, &inputs, &outputs, 1, true);
        let split = p.compute(&Op::Linear, &inputs, &outputs, 8, true);
        let forward = p.compute(&Op::Linear, &inputs, &outputs, 1, false);
        assert!(
            whole > 0.0 && split < whole / 4.0 && forward < whole / 2.0,
            "{whole} {split} {forward}"
        );
    }
}
