//! A training configuration to estimate: parallel degrees, ZeRO stage,
//! recomputation, pipeline schedule and batch sizes, checked against the
//! cluster and the model before anything is priced.

use crate::workload::AttentionKernel;
use autopar_ir::Loss;

/// What activations the backward pass recomputes instead of storing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recompute {
    /// Store everything.
    None,
    /// Recompute attention's score-sized tensors (Korthikanti et al. 2022).
    Selective,
    /// Store each layer's input only; redo the layer's forward pass.
    Full,
}

/// Pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// All forwards, then all backwards: every micro-batch in flight.
    Gpipe,
    /// One-forward-one-backward: at most `pp` micro-batches in flight.
    OneFOneB,
    /// 1F1B over `virtual_stages` layer chunks per stage (Megatron-LM):
    /// a bubble `virtual_stages` times smaller, more point-to-point traffic.
    Interleaved,
}

/// Declares, from one list of `"name" => Variant` pairs, everything that
/// reads or writes a configuration keyword: `FromStr` and `Display` (CLI
/// flags and messages; `Display` pads, so tables can align it), serde as the
/// same string (plan files) and a JSON Schema whose `enum` lists the names.
/// Every reader goes through `FromStr`, so a flag and a plan file refuse an
/// unknown name with the same message, which lists the names allowed.
macro_rules! keyword_enum {
    ($ty:ident, $what:literal, $($name:literal => $value:path),+ $(,)?) => {
        impl $ty {
            /// The names this keyword accepts, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The keyword's name, as plan files and flags spell it.
            pub fn name(self) -> &'static str {
                match self { $($value => $name,)+ }
            }
        }
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($value),)+
                    _ => Err(format!(concat!("unknown ", $what, " '{}' (expected {})"), s, Self::NAMES.join(", "))),
                }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.pad(self.name())
            }
        }
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = String::deserialize(d)?;
                name.parse().map_err(<D::Error as serde::de::Error>::custom)
            }
        }
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "enum": Self::NAMES })
            }
        }
    };
}
pub(crate) use keyword_enum;

keyword_enum!(Recompute, "recompute policy", "none" => Recompute::None, "selective" => Recompute::Selective, "full" => Recompute::Full);
keyword_enum!(Schedule, "schedule", "gpipe" => Schedule::Gpipe, "1f1b" => Schedule::OneFOneB, "interleaved" => Schedule::Interleaved);
keyword_enum!(AttentionKernel, "attention kernel", "fused" => AttentionKernel::Fused, "unfused" => AttentionKernel::Unfused);
keyword_enum!(MeshOrder, "mesh order", "dp-inner" => MeshOrder::DataInner, "pp-inner" => MeshOrder::PipelineInner);
/// How data-parallel gradient reductions compress what they send
/// (`parallel.grad_compression`, `--grad-compression`), spelled `bf16`,
/// `fp16`, `powersgd:R` or `topk:F`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GradCompression {
    /// Values sent as bfloat16, partial sums in the gradients' own type.
    Bf16,
    /// Values sent as IEEE half precision, partial sums in the gradients' own type.
    Fp16,
    /// Rank-`rank` PowerSGD (Vogels et al., 2019) with error feedback and
    /// warm-started factors: each matrix `M` (a gradient viewed as its
    /// first dim by the rest) is sent as `P = M·Q` and `Q = Mᵀ·P̂` in two
    /// all-reduces; vectors, and matrices too small to gain, go whole.
    /// The first `warmup` steps reduce uncompressed.
    PowerSgd { rank: u32, warmup: u32 },
    /// Top-k sparsification with error feedback: each rank sends the
    /// `parts_per_million / 10⁶` largest-magnitude values of its bucket
    /// (value and index) to every other, and keeps the rest for the next
    /// step. The first `warmup` steps reduce uncompressed.
    TopK { parts_per_million: u32, warmup: u32 },
}

impl GradCompression {
    /// The spellings, for errors and the JSON Schema.
    pub const FORMS: &'static str =
        "bf16, fp16, powersgd:R or topk:F (R a rank ≥ 1, F a fraction in (0, 1]), either optionally followed by :W, steps reduced uncompressed first";

    /// What the planner tries when asked for lossy compression: PowerSGD
    /// at rank 8 and top-k keeping 10 %, each after 20 uncompressed steps.
    /// Over 200 steps of a small GPT on four ranks, rank-8 PowerSGD after
    /// that warm-up ended within 0.4 % of uncompressed training (mean of
    /// the last ten losses); top-k ended 2× higher, and without the
    /// warm-up both were further off.
    pub const LOSSY_DEFAULTS: [GradCompression; 2] = [
        GradCompression::PowerSgd { rank: 8, warmup: 20 },
        GradCompression::TopK {
            parts_per_million: 100_000,
            warmup: 20,
        },
    ];

    /// The 16-bit type values cross the wire in, for the 16-bit reductions.
    pub fn narrow(self) -> Option<autopar_ir::DType> {
        match self {
            GradCompression::Bf16 => Some(autopar_ir::DType::Bf16),
            GradCompression::Fp16 => Some(autopar_ir::DType::F16),
            GradCompression::PowerSgd { .. } | GradCompression::TopK { .. } => None,
        }
    }

    /// Whether training differs from uncompressed beyond rounding: the
    /// planner picks these only when asked.
    pub fn lossy(self) -> bool {
        self.narrow().is_none()
    }

    /// Steps reduced uncompressed before a lossy method starts.
    pub fn warmup(self) -> u32 {
        match self {
            GradCompression::PowerSgd { warmup, .. } | GradCompression::TopK { warmup, .. } => warmup,
            GradCompression::Bf16 | GradCompression::Fp16 => 0,
        }
    }

    /// Top-k's kept fraction.
    pub fn fraction(self) -> Option<f64> {
        match self {
            GradCompression::TopK {
                parts_per_million, ..
            } => Some(f64::from(parts_per_million) / 1e6),
            _ => None,
        }
    }

    /// Top-k's kept count of `len` values: at least one.
    pub fn kept(self, len: usize) -> usize {
        self.fraction()
            .map_or(len, |f| ((f * len as f64).ceil() as usize).clamp(1, len.max(1)))
    }

    /// PowerSGD's elements sent for a `rows × cols` matrix: its two factors
    /// where they are smaller than it, else the matrix.
    pub fn matrix_elements(self, rows: usize, cols: usize) -> usize {
        match self {
            GradCompression::PowerSgd { rank, .. } if Self::factored(rank, rows, cols) => {
                rank as usize * (rows + cols)
            }
            _ => rows * cols,
        }
    }

    /// How a lossy compression sends one bucket of gradients, `shapes`
    /// being each gradient's `(rows, cols)` view, over `ranks` members: the
    /// collective and the bytes of each of its calls ([`crate::comm`]'s
    /// convention), values and top-k's indices `elem_bytes` wide. `None`
    /// for the 16-bit reductions (the plain collective on fewer bytes).
    pub fn lossy_calls(
        self,
        shapes: &[(usize, usize)],
        elem_bytes: f64,
        ranks: usize,
    ) -> Option<(crate::comm::Collective, Vec<f64>)> {
        use crate::comm::Collective;
        match self {
            GradCompression::TopK { .. } => {
                let len = shapes.iter().map(|&(m, n)| m * n).sum();
                let kept = self.kept(len) as f64;
                Some((
                    Collective::AllGather,
                    vec![ranks as f64 * 2.0 * kept * elem_bytes],
                ))
            }
            GradCompression::PowerSgd { rank, .. } => {
                let r = rank as usize;
                let (mut p, mut q) = (0, 0);
                for &(m, n) in shapes {
                    match Self::factored(rank, m, n) {
                        true => {
                            p += m * r;
                            q += n * r;
                        }
                        false => p += m * n,
                    }
                }
                let calls = [p, q].into_iter().filter(|&e| e > 0);
                Some((
                    Collective::AllReduce,
                    calls.map(|e| e as f64 * elem_bytes).collect(),
                ))
            }
            GradCompression::Bf16 | GradCompression::Fp16 => None,
        }
    }

    /// The compression's own work on `elements` gradient values of
    /// `elem_bytes` each, `(flops, bytes of memory traffic)`: the 16-bit
    /// reductions round and pack what they send and unpack what they get;
    /// top-k adds the kept-back values, selects, and keeps the rest back;
    /// PowerSGD's three products with the rank-`R` factors (`M·Q`, `Mᵀ·P`,
    /// `P·Qᵀ`) and its passes for the kept-back values.
    pub fn work(self, elements: f64, elem_bytes: f64) -> (f64, f64) {
        let pass = elements * elem_bytes;
        match self {
            GradCompression::Bf16 | GradCompression::Fp16 => (0.0, 2.0 * pass),
            GradCompression::TopK { .. } => (elements, 4.0 * pass),
            GradCompression::PowerSgd { rank, .. } => (6.0 * f64::from(rank) * elements, 4.0 * pass),
        }
    }

    /// Whether PowerSGD at `rank` sends a `rows × cols` matrix as factors.
    pub fn factored(rank: u32, rows: usize, cols: usize) -> bool {
        rows > 1 && cols > 1 && (rank as usize) * (rows + cols) < rows * cols
    }
}

impl std::str::FromStr for GradCompression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("unknown gradient compression '{s}' (expected {})", Self::FORMS);
        let mut parts = s.split(':');
        let (name, setting, warmup) = (parts.next(), parts.next(), parts.next());
        let warmup = match warmup.map(str::parse::<u32>) {
            None => 0,
            Some(Ok(w)) => w,
            Some(Err(_)) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        match (name, setting) {
            (Some("bf16"), None) => Ok(GradCompression::Bf16),
            (Some("fp16"), None) => Ok(GradCompression::Fp16),
            (Some("powersgd"), Some(r)) => match r.parse::<u32>() {
                Ok(rank) if rank >= 1 => Ok(GradCompression::PowerSgd { rank, warmup }),
                _ => Err(bad()),
            },
            (Some("topk"), Some(f)) => match f.parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 && (f * 1e6).round() >= 1.0 => Ok(GradCompression::TopK {
                    parts_per_million: (f * 1e6).round() as u32,
                    warmup,
                }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for GradCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let text = match self {
            GradCompression::Bf16 => "bf16".to_string(),
            GradCompression::Fp16 => "fp16".to_string(),
            GradCompression::PowerSgd { rank, .. } => format!("powersgd:{rank}"),
            GradCompression::TopK { .. } => format!("topk:{}", self.fraction().unwrap_or(1.0)),
        };
        let text = match self.warmup() {
            0 => text,
            w => format!("{text}:{w}"),
        };
        f.pad(&text)
    }
}

impl serde::Serialize for GradCompression {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for GradCompression {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(<D::Error as serde::de::Error>::custom)
    }
}

impl schemars::JsonSchema for GradCompression {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "GradCompression".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^(bf16|fp16|(powersgd:[1-9][0-9]*|topk:(0?\\.[0-9]+|1(\\.0*)?|[0-9.]+e-?[0-9]+))(:[0-9]+)?)$",
            "description": Self::FORMS,
        })
    }
}

/// Everything that defines one training step's execution. Degrees multiply:
/// `dp · tp · pp · cp` ranks; `ep` divides `dp` (experts are spread over
/// data-parallel replicas).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingConfig {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    /// Layer chunks per pipeline stage (interleaved schedule).
    pub virtual_stages: usize,
    pub sp: bool,
    pub cp: usize,
    pub ep: usize,
    /// ZeRO stage 0-3 over the data-parallel group.
    pub zero: u8,
    pub recompute: Recompute,
    pub schedule: Schedule,
    /// Samples per micro-batch.
    pub micro_batch: usize,
    /// Samples per optimizer step, over all replicas.
    pub global_batch: usize,
    pub seq: Option<usize>,
    pub attention: AttentionKernel,
    /// Dropout on (Megatron's placement; see [`crate::workload::WorkloadOptions`]).
    pub dropout: bool,
    /// MoE capacity factor (drop and pad); `None`: no token is dropped
    /// ([`crate::workload::WorkloadOptions::moe_capacity_factor`]).
    pub moe_capacity_factor: Option<f64>,
    /// The loss training appends on the output (the objective's).
    pub loss: Loss,
    /// Gradient reduction overlaps the last micro-batch's backward pass
    /// (bucketed, as PyTorch DDP does) instead of following it.
    pub overlap_grad_reduce: bool,
    /// How gradients cross the data-parallel group.
    pub grad_reduce: GradReduce,
    /// Tensor-parallel collectives run in chunks beside the linear layers'
    /// GEMMs (Megatron-Core's `--tp-comm-overlap`), so only what the GEMMs
    /// cannot cover is exposed. No backend here runs it: it prices runs of
    /// Megatron-Core, and lowering refuses a plan that assumes it.
    pub tp_comm_overlap: bool,
    /// ZeRO-1/2's all-gathers of the updated weights run bucket by bucket
    /// beside the next step's first forward pass, each issued as the
    /// forward pass reaches the bucket before it (Megatron-Core's
    /// `--overlap-param-gather`), instead of after the optimizer step. No
    /// backend here runs it: it prices runs of Megatron-Core.
    pub overlap_param_gather: bool,
    /// The loss as Megatron-LM computes it by default: the logits cast to
    /// f32 and its vocabulary-parallel cross-entropy's passes over them
    /// ([`crate::workload::kernels::megatron_cross_entropy`]), instead of
    /// the cross-entropy lowering emits. No backend here runs it: it
    /// prices runs of Megatron-LM.
    pub f32_cross_entropy: bool,
    /// ZeRO-3: how many layers ahead of the one it computes a task gathers
    /// weights (0: each right before its first use).
    pub zero3_prefetch: usize,
    /// Which parallel dimension sits inside a node after tensor parallelism.
    pub mesh_order: MeshOrder,
    /// Layers and recomputation per pipeline stage; `None` spreads the
    /// layers evenly and recomputes `recompute` everywhere.
    pub stages: Option<Vec<StageSpec>>,
}

/// One pipeline stage's layer count and recomputation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StageSpec {
    pub layers: usize,
    pub recompute: Recompute,
}

/// Gradient reduction across data-parallel replicas (ZeRO 0; ZeRO 1-3
/// always reduce-scatter and all-gather on rings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GradReduce {
    /// Ring all-reduce or a parameter server.
    pub algorithm: crate::comm::Algorithm,
    /// Gradients sent compressed, if at all.
    pub compression: Option<GradCompression>,
    /// Gradients accumulated over micro-batches and reduced in f32 beside
    /// 16-bit weights (Megatron-LM's default for bf16: `main_grad`
    /// buffers), so they take twice the weights' bytes in memory and on the
    /// wire. No backend here does it: it prices runs of Megatron-LM.
    pub f32_main_grads: bool,
    /// Gradients are reduced in buckets of about this many MiB, each issued
    /// as soon as the backward pass has produced all of it; 0 reduces each
    /// parameter tensor on its own.
    pub bucket_mib: u32,
}

/// ZeRO-3 gathers weights one layer ahead of the layer a task computes, as
/// FSDP's prefetch does.
pub const DEFAULT_PREFETCH: usize = 1;

/// PyTorch DDP's default bucket (`bucket_cap_mb`): large enough that each
/// collective runs near link bandwidth, small enough to start early in the
/// backward pass.
pub const DEFAULT_BUCKET_MIB: u32 = 25;

impl GradReduce {
    /// The bucket cap in bytes (0: one collective per tensor).
    pub fn bucket_bytes(&self) -> usize {
        (self.bucket_mib as usize) << 20
    }

    /// Gradient bytes a rank holds per byte of weights of type `weights`.
    pub fn held_per_weight_byte(&self, weights: autopar_ir::DType) -> f64 {
        match self.f32_main_grads {
            true => (32.0 / weights.size_bits() as f64).max(1.0),
            false => 1.0,
        }
    }

    /// Gradient bytes the reduction sends per byte of weights of type
    /// `weights`: the held gradients, or fewer in the compressed type.
    pub fn sent_per_weight_byte(&self, weights: autopar_ir::DType) -> f64 {
        let held = self.held_per_weight_byte(weights);
        self.compression
            .and_then(GradCompression::narrow)
            .map_or(held, |wire| {
                (wire.size_bits() as f64 / weights.size_bits() as f64).min(held)
            })
    }

    /// How a bucket of gradients of `weights`' type crosses the group under
    /// ZeRO stage `zero`: an all-reduce by this algorithm (ZeRO-0), else a
    /// ring reduce-scatter, sending the held gradients or their 16-bit
    /// rounding; top-k all-gathers each rank's kept values and indices;
    /// PowerSGD all-reduces its factors in two collectives, sending the
    /// share of elements `params` gives (every weight the group reduces,
    /// each with how many times it repeats). The compression's own work is
    /// priced by `rates`.
    pub fn wire<'p>(
        &self,
        zero: u8,
        weights: autopar_ir::DType,
        params: impl IntoIterator<Item = (&'p crate::workload::ParamShard, usize)>,
        rates: &crate::compute::Rates,
    ) -> GradWire {
        use crate::comm::{Algorithm, Collective};
        let held = self.held_per_weight_byte(weights);
        let width = weights.size_bits() as f64 / 8.0;
        let work_per_byte = self.compression.map_or(0.0, |c| {
            let (flops, bytes) = c.work(1.0 / width, held * width);
            rates.vector(flops, bytes)
        });
        let (collective, algorithm) = match zero {
            0 => (Collective::AllReduce, self.algorithm),
            _ => (Collective::ReduceScatter, Algorithm::Ring),
        };
        let plain = GradWire {
            collective,
            algorithm,
            calls: 1,
            per_byte: self.sent_per_weight_byte(weights),
            per_member: 0.0,
            work_per_byte,
        };
        match self.compression {
            Some(c @ GradCompression::TopK { .. }) => GradWire {
                collective: Collective::AllGather,
                algorithm: Algorithm::Ring,
                per_byte: 0.0,
                // A value and its index per kept element, from every member.
                per_member: 2.0 * c.fraction().unwrap_or(1.0) * held,
                ..plain
            },
            Some(c @ GradCompression::PowerSgd { .. }) => {
                let (mut sent, mut all) = (0.0, 0.0);
                for (p, times) in params {
                    let rows = p.rows.max(1.0);
                    let cols = (p.elements / rows).round().max(1.0);
                    sent += times as f64 * c.matrix_elements(rows as usize, cols as usize) as f64;
                    all += times as f64 * p.elements;
                }
                GradWire {
                    calls: 2,
                    per_byte: held * if all > 0.0 { sent / all } else { 1.0 },
                    ..plain
                }
            }
            _ => plain,
        }
    }
}

/// How a bucket of gradients crosses the data-parallel group: `calls`
/// collectives (one after another) of `collective` by `algorithm`, over
/// [`GradWire::ratio`] bytes per byte of weights, in [`crate::comm`]'s
/// convention (an all-gather's bytes are what it gathers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradWire {
    pub collective: crate::comm::Collective,
    pub algorithm: crate::comm::Algorithm,
    pub calls: usize,
    per_byte: f64,
    per_member: f64,
    /// The compression's own seconds per byte of weights, beside the
    /// collectives on the same stream.
    pub work_per_byte: f64,
}

impl GradWire {
    /// Weights moved as they are (ZeRO's refresh): one `collective`.
    pub const fn plain(collective: crate::comm::Collective, algorithm: crate::comm::Algorithm) -> GradWire {
        GradWire {
            collective,
            algorithm,
            calls: 1,
            per_byte: 1.0,
            per_member: 0.0,
            work_per_byte: 0.0,
        }
    }

    /// One `collective` over `per_byte` bytes per byte of weights (tests
    /// scale the bytes to make a collective take a chosen time).
    #[cfg(test)]
    pub(crate) fn scaled(
        collective: crate::comm::Collective,
        algorithm: crate::comm::Algorithm,
        per_byte: f64,
    ) -> GradWire {
        GradWire {
            per_byte,
            ..GradWire::plain(collective, algorithm)
        }
    }

    /// Bytes of the collectives per byte of weights over `ranks` members.
    pub fn ratio(&self, ranks: usize) -> f64 {
        self.per_byte + self.per_member * ranks as f64
    }
}

impl Default for GradReduce {
    fn default() -> Self {
        GradReduce {
            algorithm: crate::comm::Algorithm::Ring,
            compression: None,
            f32_main_grads: false,
            bucket_mib: DEFAULT_BUCKET_MIB,
        }
    }
}

/// How ranks are numbered, fastest-varying dimension first. Tensor
/// parallelism is always innermost (it needs the fastest links); the next
/// dimension decides whether data-parallel replicas or pipeline stages
/// share a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MeshOrder {
    /// tp, cp, dp, pp (Megatron-LM's order).
    #[default]
    DataInner,
    /// tp, cp, pp, dp.
    PipelineInner,
}

impl Default for TrainingConfig {
    /// One GPU, one sample, nothing split or recomputed.
    fn default() -> Self {
        TrainingConfig {
            dp: 1,
            tp: 1,
            pp: 1,
            virtual_stages: 1,
            sp: false,
            cp: 1,
            ep: 1,
            zero: 0,
            recompute: Recompute::None,
            schedule: Schedule::OneFOneB,
            micro_batch: 1,
            global_batch: 1,
            seq: None,
            attention: AttentionKernel::Fused,
            dropout: false,
            moe_capacity_factor: None,
            loss: Loss::CrossEntropy,
            overlap_grad_reduce: false,
            grad_reduce: GradReduce::default(),
            tp_comm_overlap: false,
            overlap_param_gather: false,
            f32_cross_entropy: false,
            zero3_prefetch: DEFAULT_PREFETCH,
            mesh_order: MeshOrder::default(),
            stages: None,
        }
    }
}

impl TrainingConfig {
    /// This configuration as the backends here run it: without the
    /// overlaps, gradient handling and loss only priced for other tools'
    /// runs (tensor-parallel overlap, the weight gather beside the forward
    /// pass, f32 main gradients, Megatron-LM's f32 cross-entropy).
    pub fn runnable(&self) -> TrainingConfig {
        TrainingConfig {
            tp_comm_overlap: false,
            overlap_param_gather: false,
            f32_cross_entropy: false,
            grad_reduce: GradReduce {
                f32_main_grads: false,
                ..self.grad_reduce
            },
            ..self.clone()
        }
    }
}

/// Why a configuration cannot run.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("--gpus {gpus} is not divisible by tp·pp·cp = {tp}·{pp}·{cp} = {product}", product = tp * pp * cp)]
    GpusNotDivisible {
        gpus: usize,
        tp: usize,
        pp: usize,
        cp: usize,
    },
    #[error("--dp {dp} · tp {tp} · pp {pp} · cp {cp} = {product} differs from --gpus {gpus}", product = dp * tp * pp * cp)]
    DpMismatch {
        dp: usize,
        tp: usize,
        pp: usize,
        cp: usize,
        gpus: usize,
    },
    #[error("--global-batch {global_batch} is not divisible by dp · micro-batch = {dp} · {micro_batch}")]
    BatchNotDivisible {
        global_batch: usize,
        dp: usize,
        micro_batch: usize,
    },
    #[error("--ep {ep} must divide the data-parallel degree {dp}")]
    EpNotDividingDp { ep: usize, dp: usize },
    #[error("--zero {0} is not a ZeRO stage (0-3)")]
    ZeroStage(u8),
    #[error("--virtual-stages {0} needs --schedule interleaved")]
    VirtualNeedsInterleaved(usize),
    #[error(
        "the interleaved schedule needs the micro-batches per step ({micro_batches}) to be a multiple of --pp {pp}"
    )]
    InterleavedMicroBatches { micro_batches: usize, pp: usize },
    #[error("{given} stage layer counts given for {pp} pipeline stages")]
    StageCount { given: usize, pp: usize },
    #[error(
        "ZeRO {0} reduces gradients with ring reduce-scatter; a parameter server is only priced for ZeRO 0"
    )]
    ShardedNeedsRing(u8),
    #[error(
        "gradient compression '{0}' compresses the ring all-reduce of ZeRO 0 (it keeps each rank's unsent values for its next step); ZeRO {1} reduce-scatters, which only bf16 or fp16 compress"
    )]
    LossyNeedsAllReduce(GradCompression, u8),
    #[error("gradient compression '{0}' runs on a ring, not a parameter server")]
    CompressionNeedsRing(GradCompression),
    #[error(
        "--overlap-param-gather overlaps the weight all-gather of ZeRO 1 or 2 with the next forward pass; with --zero {0} there is none"
    )]
    ParamGatherNeedsZero(u8),
}

impl TrainingConfig {
    /// Checks the degrees and batch sizes fit together on `gpus` ranks.
    pub fn check(&self, gpus: usize) -> Result<(), ConfigError> {
        let degrees = [
            ("--tp", self.tp),
            ("--pp", self.pp),
            ("--dp", self.dp),
            ("--cp", self.cp),
            ("--ep", self.ep),
            ("--virtual-stages", self.virtual_stages),
            ("--micro-batch", self.micro_batch),
            ("--global-batch", self.global_batch),
        ];
        for (name, v) in degrees {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.dp * self.tp * self.pp * self.cp != gpus {
            return Err(ConfigError::DpMismatch {
                dp: self.dp,
                tp: self.tp,
                pp: self.pp,
                cp: self.cp,
                gpus,
            });
        }
        if self.global_batch % (self.dp * self.micro_batch) != 0 {
            return Err(ConfigError::BatchNotDivisible {
                global_batch: self.global_batch,
                dp: self.dp,
                micro_batch: self.micro_batch,
            });
        }
        if self.dp % self.ep != 0 {
            return Err(ConfigError::EpNotDividingDp {
                ep: self.ep,
                dp: self.dp,
            });
        }
        if self.zero > 3 {
            return Err(ConfigError::ZeroStage(self.zero));
        }
        if self.virtual_stages > 1 && self.schedule != Schedule::Interleaved {
            return Err(ConfigError::VirtualNeedsInterleaved(self.virtual_stages));
        }
        if !self.interleaving_fits() {
            return Err(ConfigError::InterleavedMicroBatches {
                micro_batches: self.micro_batches(),
                pp: self.pp,
            });
        }
        if let Some(stages) = &self.stages {
            if stages.len() != self.pp {
                return Err(ConfigError::StageCount {
                    given: stages.len(),
                    pp: self.pp,
                });
            }
        }
        if self.grad_reduce.algorithm != crate::comm::Algorithm::Ring && self.zero > 0 {
            return Err(ConfigError::ShardedNeedsRing(self.zero));
        }
        if self.overlap_param_gather && !matches!(self.zero, 1 | 2) {
            return Err(ConfigError::ParamGatherNeedsZero(self.zero));
        }
        if let Some(c) = self.grad_reduce.compression {
            if self.grad_reduce.algorithm != crate::comm::Algorithm::Ring {
                return Err(ConfigError::CompressionNeedsRing(c));
            }
            if c.lossy() && self.zero > 0 {
                return Err(ConfigError::LossyNeedsAllReduce(c, self.zero));
            }
        }
        Ok(())
    }

    /// Data-parallel degree for `gpus` ranks: `gpus / (tp·pp·cp)`.
    pub fn derive_dp(gpus: usize, tp: usize, pp: usize, cp: usize) -> Result<usize, ConfigError> {
        let model = tp * pp * cp;
        if model == 0 {
            return Err(ConfigError::Zero("--tp, --pp and --cp"));
        }
        if gpus % model != 0 {
            return Err(ConfigError::GpusNotDivisible { gpus, tp, pp, cp });
        }
        Ok(gpus / model)
    }

    /// Micro-batches each pipeline runs per step.
    pub fn micro_batches(&self) -> usize {
        self.global_batch / (self.dp * self.micro_batch)
    }

    /// Whether the micro-batches per step suit the schedule: interleaving
    /// (more than one chunk per stage) sends micro-batches through the
    /// stages in groups of `pp`, so it needs a multiple of `pp`, as
    /// Megatron-LM does.
    pub fn interleaving_fits(&self) -> bool {
        self.virtual_stages <= 1 || self.micro_batches() % self.pp == 0
    }

    /// The default chunk count of the interleaved schedule for `layers`
    /// layers: the smallest count above one that splits each stage's layers
    /// evenly (Megatron-LM needs even chunks), or one when none does or
    /// there is no pipeline to interleave.
    pub fn default_virtual_stages(layers: usize, pp: usize) -> usize {
        if pp <= 1 {
            return 1;
        }
        let per_stage = layers / pp;
        (2..=per_stage).find(|v| per_stage % v == 0).unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gradient_compressions_parse_and_print_as_spelled() {
        for spelled in [
            "bf16",
            "fp16",
            "powersgd:4",
            "powersgd:8:20",
            "topk:0.01",
            "topk:0.1:20",
        ] {
            let c: GradCompression = spelled.parse().unwrap();
            assert_eq!(c.to_string(), spelled);
        }
        let c: GradCompression = "powersgd:8:20".parse().unwrap();
        assert_eq!((c.warmup(), c.lossy()), (20, true));
        for bad in [
            "powersgd",
            "powersgd:0",
            "topk:0",
            "topk:1.5",
            "bf16:3",
            "topk:0.1:x",
            "powersgd:2:3:4",
            "int8",
        ] {
            let err = bad.parse::<GradCompression>().unwrap_err();
            assert!(err.contains(bad) && err.contains("powersgd:R"), "{err}");
        }
    }

    use super::*;

    pub(crate) fn megatron_like() -> TrainingConfig {
        TrainingConfig {
            dp: 4,
            tp: 8,
            pp: 2,
            virtual_stages: 1,
            sp: false,
            cp: 1,
            ep: 1,
            zero: 0,
            recompute: Recompute::Full,
            schedule: Schedule::OneFOneB,
            micro_batch: 1,
            global_batch: 64,
            seq: None,
            attention: AttentionKernel::Unfused,
            dropout: true,
            ..TrainingConfig::default()
        }
    }

    #[test]
    fn keywords_round_trip() {
        for s in ["none", "selective", "full"] {
            assert_eq!(s.parse::<Recompute>().unwrap().to_string(), s);
        }
        for s in ["gpipe", "1f1b", "interleaved"] {
            assert_eq!(s.parse::<Schedule>().unwrap().to_string(), s);
        }
        assert!("2f2b"
            .parse::<Schedule>()
            .unwrap_err()
            .contains("gpipe, 1f1b, interleaved"));
        // `Display` pads, so tables can align keywords.
        assert_eq!(format!("[{:<6}]", Recompute::Full), "[full  ]");
    }

    #[test]
    fn keywords_are_json_strings_listed_in_the_schema() {
        let json = serde_json::to_string(&[MeshOrder::DataInner, MeshOrder::PipelineInner]).unwrap();
        assert_eq!(json, r#"["dp-inner","pp-inner"]"#);
        let back: Vec<MeshOrder> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [MeshOrder::DataInner, MeshOrder::PipelineInner]);
        let algorithm: crate::comm::Algorithm = serde_json::from_str(r#""parameter-server""#).unwrap();
        assert_eq!(algorithm, crate::comm::Algorithm::ParameterServer);
        let err = serde_json::from_str::<Schedule>(r#""2f2b""#)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("unknown schedule '2f2b' (expected gpipe, 1f1b, interleaved)"),
            "{err}"
        );
        let schema = serde_json::to_value(schemars::schema_for!(Recompute)).unwrap();
        assert_eq!(schema["enum"], serde_json::json!(["none", "selective", "full"]));
    }

    #[test]
    fn checks_name_the_flag() {
        assert_eq!(TrainingConfig::derive_dp(64, 8, 2, 1), Ok(4));
        assert!(matches!(
            TrainingConfig::derive_dp(60, 8, 2, 1),
            Err(ConfigError::GpusNotDivisible { .. })
        ));
        let c = megatron_like();
        assert_eq!(c.check(64), Ok(()));
        assert_eq!(c.micro_batches(), 16);
        let bad = TrainingConfig {
            global_batch: 0,
            ..c.clone()
        };
        assert_eq!(bad.check(64), Err(ConfigError::Zero("--global-batch")));
        let bad = TrainingConfig {
            global_batch: 66,
            ..c.clone()
        };
        assert!(bad
            .check(64)
            .unwrap_err()
            .to_string()
            .contains("--global-batch 66"));
        let bad = TrainingConfig { ep: 3, ..c.clone() };
        assert!(matches!(bad.check(64), Err(ConfigError::EpNotDividingDp { .. })));
        let bad = TrainingConfig {
            virtual_stages: 2,
            ..c.clone()
        };
        assert!(matches!(
            bad.check(64),
            Err(ConfigError::VirtualNeedsInterleaved(2))
        ));
        let interleaved = TrainingConfig {
            schedule: Schedule::Interleaved,
            virtual_stages: 2,
            ..c
        };
        assert_eq!(interleaved.check(64), Ok(()));
        let bad = TrainingConfig {
            global_batch: 12, // 3 micro-batches for 2 stages
            ..interleaved.clone()
        };
        assert_eq!(
            bad.check(64).unwrap_err().to_string(),
            "the interleaved schedule needs the micro-batches per step (3) to be a multiple of --pp 2"
        );
        let one_chunk = TrainingConfig {
            virtual_stages: 1,
            ..bad
        };
        assert_eq!(one_chunk.check(64), Ok(()));
    }

    #[test]
    fn default_virtual_stages_split_stages_evenly() {
        assert_eq!(TrainingConfig::default_virtual_stages(128, 64), 2);
        assert_eq!(TrainingConfig::default_virtual_stages(105, 35), 3);
        assert_eq!(TrainingConfig::default_virtual_stages(96, 16), 2);
        assert_eq!(TrainingConfig::default_virtual_stages(7, 7), 1);
        assert_eq!(TrainingConfig::default_virtual_stages(48, 1), 1);
    }
}
