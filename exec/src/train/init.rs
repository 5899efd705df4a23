//! Initial values for weightless parameters, so zoo models (built from a
//! spec string, without data) can be trained.

use super::random;
use autopar_ir::{round_float, DType, Data, Graph, Op, Role, TensorId, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// Standard deviation of the normal initialisation of matrices: GPT-2's
/// (and nanoGPT's) 0.02. GPT-2 also scales residual output projections by
/// 1/√(2·layers); that refinement is left out, as it needs to know which
/// linears feed the residual stream.
pub const INIT_STD: f64 = 0.02;

/// Why parameters could not be initialised; names the tensor.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InitError {
    #[error("parameter '{tensor}' has symbolic shape {shape}; bind its dims before initialising")]
    Symbolic { tensor: String, shape: String },
}

/// Fills every float parameter that has no data: N(0, [`INIT_STD`]) for
/// parameters of rank ≥ 2 (linear weights, embeddings), ones for the scale
/// (input 1) of a `LayerNorm`/`RmsNorm`, zeros for other parameters of rank
/// ≤ 1 (biases). Values are a function of `seed` and the parameter's name
/// only, not of graph order, so a model gets the same weights whatever else
/// is in the graph; parameters that already have data are left alone.
/// Rotary caches left weightless get RoPE's tables. Returns how many
/// tensors were filled. Checks every shape before
/// filling any, so an error leaves the graph unchanged.
pub fn initialize(graph: &mut Graph, seed: u64) -> Result<usize, InitError> {
    let scales: HashSet<TensorId> = graph
        .node_indices()
        .map(|n| graph.node(n))
        .filter(|node| special_inputs(&node.op) == Special::NormScale)
        .filter_map(|node| node.inputs.get(1).copied().flatten())
        .collect();
    let todo = graph
        .tensors()
        .filter(|(_, t)| t.role == Role::Parameter && t.ty.dtype.is_float() && t.data.is_none())
        .map(|(id, t)| {
            let shape = t.ty.shape.as_fixed().ok_or_else(|| InitError::Symbolic {
                tensor: t.name.clone(),
                shape: t.ty.shape.to_string(),
            })?;
            let fill = if shape.len() >= 2 {
                Fill::Normal(random::name_key(seed, &t.name))
            } else if scales.contains(&id) {
                Fill::Constant(1.0)
            } else {
                Fill::Constant(0.0)
            };
            Ok((id, shape, fill))
        })
        .collect::<Result<Vec<_>, InitError>>()?;
    for (id, shape, fill) in &todo {
        let tensor = graph.tensor_mut(*id);
        tensor.data = Some(Arc::new(fill.value(tensor.ty.dtype, shape.clone())));
    }
    Ok(todo.len() + fill_rotary_caches(graph))
}

/// Parameter inputs of an op that start neither random nor zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    /// Nothing special: weights N(0, σ), biases zero.
    Plain,
    /// Input 1 is a normalisation's scale: ones.
    NormScale,
    /// Inputs 1 and 2 are the rotary cos/sin caches: RoPE's tables.
    RotaryCaches,
}

/// Which of `op`'s parameter inputs start specially. Exhaustive on purpose:
/// an op whose parameters must not start random or zero has to say so here.
fn special_inputs(op: &Op) -> Special {
    match op {
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => Special::NormScale,
        Op::RotaryEmbedding { .. } => Special::RotaryCaches,
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast { .. }
        | Op::Clip
        | Op::Silu
        | Op::Gelu { .. }
        | Op::MatMul
        | Op::Gemm { .. }
        | Op::Linear
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Attention { .. }
        | Op::MoeRouter { .. }
        | Op::MoeExperts { .. }
        | Op::AttentionGrad { .. }
        | Op::MoeExpertsGrad { .. }
        | Op::MoeSort { .. }
        | Op::MoeSlots { .. }
        | Op::NormGrad { .. }
        | Op::ActivationGrad { .. }
        | Op::SoftmaxGrad { .. }
        | Op::Comm { .. }
        | Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Shape { .. }
        | Op::Size
        | Op::Trilu { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::Embedding
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::ConstantOfShape { .. }
        | Op::Conv { .. }
        | Op::ConvTranspose { .. }
        | Op::Pool { .. }
        | Op::ConvGrad { .. }
        | Op::PoolGrad { .. }
        | Op::Range => Special::Plain,
    }
}

/// Base of the rotary frequencies (RoPE's θ, Llama's default).
pub const ROPE_THETA: f64 = 10_000.0;

/// Weightless cos/sin caches of rotary embeddings (inputs 1 and 2 of
/// `RotaryEmbedding`, `[positions, rotary_dim/2]`) get RoPE's tables:
/// `cos(p·θ^(−2i/d))` and `sin(p·θ^(−2i/d))` with `d = rotary_dim`.
fn fill_rotary_caches(graph: &mut Graph) -> usize {
    let caches: Vec<(TensorId, bool)> = graph
        .node_indices()
        .map(|n| graph.node(n))
        .filter(|node| special_inputs(&node.op) == Special::RotaryCaches)
        .flat_map(|node| [(node.inputs.get(1), false), (node.inputs.get(2), true)])
        .filter_map(|(t, sin)| t.copied().flatten().map(|t| (t, sin)))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut filled = 0;
    for (id, sin) in caches {
        let t = graph.tensor(id);
        let Some([rows, half]) =
            t.ty.shape
                .as_fixed()
                .as_deref()
                .map(|d| [d[0], d.get(1).copied().unwrap_or(1)])
        else {
            continue;
        };
        if t.data.is_some() || !t.ty.dtype.is_float() {
            continue;
        }
        let d = (2 * half) as f64;
        let values: Vec<f64> = (0..rows * half)
            .map(|k| {
                let (p, i) = ((k / half) as f64, (k % half) as f64);
                let angle = p * ROPE_THETA.powf(-2.0 * i / d);
                if sin {
                    angle.sin()
                } else {
                    angle.cos()
                }
            })
            .collect();
        let dtype = t.ty.dtype;
        let data = if dtype == DType::F64 {
            Data::F64(values)
        } else {
            Data::F32(values.into_iter().map(|v| round_float(dtype, v as f32)).collect())
        };
        let shape = vec![rows, half];
        graph.tensor_mut(id).data = Some(Arc::new(Value { dtype, shape, data }));
        filled += 1;
    }
    filled
}

/// How one parameter is filled.
enum Fill {
    /// N(0, INIT_STD) from the stream with this key, element `i` from draw `i`.
    Normal(u64),
    /// Every element this value.
    Constant(f64),
}

impl Fill {
    /// The parameter's value, stored as `dtype` stores floats (f64, or f32
    /// rounded to the narrower type).
    fn value(&self, dtype: DType, shape: Vec<usize>) -> Value {
        let n: usize = shape.iter().product();
        let element = |i: usize| match *self {
            Fill::Normal(key) => INIT_STD * random::normal(key, i as u64),
            Fill::Constant(c) => c,
        };
        let data = if dtype == DType::F64 {
            Data::F64((0..n).map(element).collect())
        } else {
            Data::F32((0..n).map(|i| round_float(dtype, element(i) as f32)).collect())
        };
        Value { dtype, shape, data }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_ir::{Dim, Shape, TensorType};

    const GPT: &str = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16";

    fn params(g: &Graph) -> Vec<(String, Arc<Value>)> {
        g.tensors()
            .filter(|(_, t)| t.role == Role::Parameter)
            .map(|(_, t)| (t.name.clone(), t.data.clone().expect("initialised")))
            .collect()
    }

    fn param<'g>(g: &'g Graph, name: &str) -> &'g Value {
        let (_, t) = g.tensors().find(|(_, t)| t.name == name).unwrap();
        t.data.as_deref().unwrap()
    }

    #[test]
    fn every_gpt_parameter_gets_data_of_its_shape() {
        let mut g = autopar_import::zoo::build(GPT).unwrap();
        let want = g.tensors().filter(|(_, t)| t.role == Role::Parameter).count();
        assert_eq!(initialize(&mut g, 0), Ok(want));
        for (_, t) in g.tensors().filter(|(_, t)| t.role == Role::Parameter) {
            let v = t.data.as_deref().unwrap();
            assert_eq!(Some(v.shape.clone()), t.ty.shape.as_fixed(), "{}", t.name);
            assert_eq!(v.dtype, t.ty.dtype, "{}", t.name);
        }
        assert_eq!(initialize(&mut g, 0), Ok(0), "filled parameters are left alone");
    }

    #[test]
    fn norm_scales_are_ones_biases_zeros_matrices_small_normals() {
        let mut g = autopar_import::zoo::build(GPT).unwrap();
        initialize(&mut g, 0).unwrap();
        assert!(param(&g, "h.1.ln_2.weight")
            .to_f64_vec()
            .iter()
            .all(|&x| x == 1.0));
        assert!(param(&g, "h.0.ln_1.bias").to_f64_vec().iter().all(|&x| x == 0.0));
        assert!(param(&g, "h.0.attn.qkv.bias")
            .to_f64_vec()
            .iter()
            .all(|&x| x == 0.0));
        let w = param(&g, "wte.weight").to_f64_vec();
        let mean = w.iter().sum::<f64>() / w.len() as f64;
        let std = (w.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
        assert!(
            mean.abs() < 1e-3 && (std - INIT_STD).abs() < 1e-3,
            "mean {mean}, std {std}"
        );
    }

    #[test]
    fn values_depend_on_seed_and_name_not_graph_order() {
        let build = |spec: &str, seed| {
            let mut g = autopar_import::zoo::build(spec).unwrap();
            initialize(&mut g, seed).unwrap();
            g
        };
        assert_eq!(params(&build(GPT, 7)), params(&build(GPT, 7)));
        assert_ne!(
            param(&build(GPT, 7), "wte.weight"),
            param(&build(GPT, 8), "wte.weight")
        );
        // A deeper model shares its first layers' names, so their weights.
        let deeper = build("gpt:layers=3,hidden=64,heads=4,vocab=128,seq=16", 7);
        let gpt = build(GPT, 7);
        assert_eq!(
            param(&deeper, "h.1.mlp.fc.weight"),
            param(&gpt, "h.1.mlp.fc.weight")
        );
        assert_ne!(param(&gpt, "h.0.mlp.fc.weight"), param(&gpt, "h.1.mlp.fc.weight"));
    }

    #[test]
    fn llama_rms_scales_are_ones() {
        let mut g =
            autopar_import::zoo::build("llama:layers=1,hidden=64,ffn=128,heads=4,vocab=128,seq=16").unwrap();
        initialize(&mut g, 0).unwrap();
        let (_, norm) = g
            .tensors()
            .find(|(_, t)| t.name.ends_with("norm.weight"))
            .unwrap();
        assert!(
            norm.data.as_ref().unwrap().to_f64_vec().iter().all(|&x| x == 1.0),
            "{}",
            norm.name
        );
    }

    #[test]
    fn symbolic_parameters_are_named_and_leave_the_graph_unchanged() {
        let mut g = autopar_import::zoo::build(GPT).unwrap();
        let ty = TensorType {
            dtype: DType::F32,
            shape: Shape(vec![Dim::Fixed(4), Dim::Sym("n".into())]),
        };
        g.add_tensor("odd.weight", ty, Role::Parameter, None);
        assert_eq!(
            initialize(&mut g, 0).unwrap_err().to_string(),
            "parameter 'odd.weight' has symbolic shape [4, n]; bind its dims before initialising"
        );
        assert!(g
            .tensors()
            .all(|(_, t)| t.role != Role::Parameter || t.data.is_none()));
    }

    #[test]
    fn narrow_float_parameters_hold_values_of_their_type() {
        let mut g =
            autopar_import::zoo::build("gpt:layers=1,hidden=32,heads=2,vocab=64,seq=8,dtype=bf16").unwrap();
        initialize(&mut g, 0).unwrap();
        let w = param(&g, "h.0.mlp.fc.weight");
        assert_eq!(w.dtype, DType::Bf16);
        let Data::F32(xs) = &w.data else {
            panic!("bf16 is stored as f32")
        };
        assert!(xs.iter().all(|&x| round_float(DType::Bf16, x) == x && x != 0.0));
    }
}
