//! An objective's head on the model: the output the loss reads, checked
//! against the objective; the loss's targets (and mlm's masked positions)
//! as new inputs; the loss; and the [`Task`] one row of data fills.

use super::{inputs, FeatureInput, Feed, Objective, Task};
use crate::TrainingError;
use autopar_ir::{DType, Dim, Graph, Role, Shape, TensorId, TensorType};

/// Of the tokens of a row, the share mlm masks (BERT's 15 %), at least one.
const MASKED_SHARE: f64 = 0.15;

/// What [`attach`] added: how every data input is fed, the loss, the task.
pub(crate) struct Head {
    pub feeds: Vec<(String, Feed)>,
    pub loss: TensorId,
    pub task: Task,
}

/// Adds `objective`'s loss on `g`'s output, for micro-batches of
/// `micro_batch` rows (of `seq` tokens, for token objectives) and a global
/// batch of `global_rows` rows. `g`'s `batch` and `seq` are bound.
pub(crate) fn attach(
    g: &mut Graph,
    objective: Objective,
    micro_batch: usize,
    seq: usize,
    global_rows: usize,
) -> Result<Head, TrainingError> {
    let output = output_of(g, objective)?;
    let mut feeds = inputs::feeds(g, objective)?;
    let (task, loss) = match objective {
        Objective::Lm | Objective::Seq2Seq | Objective::Mlm => {
            tokens_head(g, objective, &mut feeds, output, micro_batch, seq, global_rows)?
        }
        Objective::Classify | Objective::Regress => {
            features_head(g, objective, &mut feeds, output, micro_batch, global_rows)?
        }
    };
    Ok(Head { feeds, loss, task })
}

/// Next-token prediction, seq2seq or mlm: a cross-entropy on the logits
/// `[batch, length, vocab]` against a target token per position (mlm: at
/// the masked positions only).
fn tokens_head(
    g: &mut Graph,
    objective: Objective,
    feeds: &mut Vec<(String, Feed)>,
    logits: TensorId,
    micro_batch: usize,
    seq: usize,
    global_rows: usize,
) -> Result<(Task, TensorId), TrainingError> {
    let tokens = input_fed(g, feeds, Feed::Tokens).ok_or_else(|| TrainingError::NoTokens {
        objective,
        inputs: super::describe(g, &g.inputs),
    })?;
    check_dims(
        g,
        tokens,
        &[(0, "batch", micro_batch), (1, "sequence length", seq)],
    )?;
    let dims = resolved(g, logits)?;
    let vocab = dims[2];
    let (task, targets_ty) = match objective {
        Objective::Seq2Seq => {
            let decoder =
                input_fed(g, feeds, Feed::DecoderTokens).ok_or_else(|| TrainingError::NoDecoder {
                    inputs: super::describe(g, &g.inputs),
                })?;
            // A symbolic decoder length no flag names is the sequence length.
            if let Dim::Sym(s) = &g.tensor(decoder).ty.shape.0[1] {
                g.bindings.entry(s.clone()).or_insert(seq);
            }
            check_dims(g, decoder, &[(0, "batch", micro_batch)])?;
            let target = resolved(g, decoder)?[1];
            let task = Task::Seq2Seq {
                source: seq,
                target,
                vocab,
            };
            (task, g.tensor(decoder).ty.clone())
        }
        Objective::Mlm => {
            let masked = ((seq as f64 * MASKED_SHARE).round() as usize).clamp(1, seq);
            let task = Task::Mlm {
                seq,
                vocab,
                masked,
                mask_token: vocab as i64 - 1,
            };
            (task, g.tensor(tokens).ty.clone())
        }
        _ => (Task::Lm { seq, vocab }, g.tensor(tokens).ty.clone()),
    };
    let length = targets_ty.shape.0[1].resolve(&g.bindings);
    if length != Some(dims[1]) {
        return Err(output_error(g, objective));
    }
    let targets = add_input(g, feeds, "targets", targets_ty, Feed::Targets);
    let weights = match objective {
        Objective::Mlm => {
            let mut shape = g.tensor(tokens).ty.shape.0.clone();
            shape.push(Dim::Fixed(1));
            let ty = TensorType {
                dtype: g.tensor(logits).ty.dtype,
                shape: Shape(shape),
            };
            Some(add_input(g, feeds, "masked", ty, Feed::Masked))
        }
        _ => None,
    };
    let count = global_rows * task.terms_per_row();
    let loss = objective.loss().append(g, logits, targets, weights, count)?;
    Ok((task, loss))
}

/// Classification (a cross-entropy on `[batch, classes]` against one class
/// per row) or regression (the squared error of `[batch]` or
/// `[batch, outputs]` against as many values).
fn features_head(
    g: &mut Graph,
    objective: Objective,
    feeds: &mut Vec<(String, Feed)>,
    output: TensorId,
    micro_batch: usize,
    global_rows: usize,
) -> Result<(Task, TensorId), TrainingError> {
    let mut inputs = Vec::new();
    for (name, _) in feeds.iter().filter(|(_, f)| *f == Feed::Features) {
        let t = crate::training::tensor_id(g, name).expect("feeds name the graph's inputs");
        check_dims(g, t, &[(0, "batch", micro_batch)])?;
        inputs.push(FeatureInput {
            name: name.clone(),
            dtype: g.tensor(t).ty.dtype,
            row: resolved(g, t)?[1..].to_vec(),
        });
    }
    check_dims(g, output, &[(0, "batch", micro_batch)])?;
    let dims = resolved(g, output)?;
    let out_ty = g.tensor(output).ty.clone();
    let count = |task: &Task| global_rows * task.terms_per_row();
    match objective {
        Objective::Classify => {
            let task = Task::Classify {
                inputs,
                classes: dims[1],
            };
            let ty = TensorType {
                dtype: DType::I64,
                shape: Shape(vec![out_ty.shape.0[0].clone()]),
            };
            let targets = add_input(g, feeds, "targets", ty, Feed::Targets);
            let loss = objective.loss().append(g, output, targets, None, count(&task))?;
            Ok((task, loss))
        }
        _ => {
            let task = Task::Regress {
                inputs,
                outputs: dims.get(1).copied().unwrap_or(1),
            };
            let values = add_input(g, feeds, "targets", out_ty, Feed::Values);
            let loss = objective.loss().append(g, output, values, None, count(&task))?;
            Ok((task, loss))
        }
    }
}

/// The one float output `objective` trains, of the rank it reads.
fn output_of(g: &Graph, objective: Objective) -> Result<TensorId, TrainingError> {
    let floats: Vec<TensorId> = g
        .outputs
        .iter()
        .copied()
        .filter(|&t| g.tensor(t).ty.dtype.is_float())
        .collect();
    let [one] = floats.as_slice() else {
        return Err(output_error(g, objective));
    };
    let dims = &g.tensor(*one).ty.shape.0;
    let fits = match objective {
        Objective::Lm | Objective::Seq2Seq | Objective::Mlm => dims.len() == 3,
        Objective::Classify => dims.len() == 2 && dims[1].fixed().is_some_and(|c| c >= 2),
        Objective::Regress => dims.len() == 1 || dims.len() == 2,
    };
    match fits {
        true => Ok(*one),
        false => Err(output_error(g, objective)),
    }
}

fn output_error(g: &Graph, objective: Objective) -> TrainingError {
    let want = match objective {
        Objective::Lm | Objective::Mlm => "[batch, seq, vocab] (logits)",
        Objective::Seq2Seq => "[batch, target seq, vocab] (logits over the decoder's positions)",
        Objective::Classify => "[batch, classes] with two classes or more",
        Objective::Regress => "[batch] or [batch, outputs]",
    };
    TrainingError::Output {
        objective,
        want,
        outputs: super::describe(g, &g.outputs),
    }
}

/// The input fed with `feed`.
fn input_fed(g: &Graph, feeds: &[(String, Feed)], feed: Feed) -> Option<TensorId> {
    let (name, _) = feeds.iter().find(|(_, f)| *f == feed)?;
    crate::training::tensor_id(g, name)
}

/// Adds data input `name` of type `ty`, fed with `feed`.
fn add_input(
    g: &mut Graph,
    feeds: &mut Vec<(String, Feed)>,
    name: &str,
    ty: TensorType,
    feed: Feed,
) -> TensorId {
    let t = g.add_tensor(name, ty, Role::Input, None);
    g.inputs.push(t);
    feeds.push((name.into(), feed));
    t
}

/// `t`'s dims under the graph's bindings.
fn resolved(g: &Graph, t: TensorId) -> Result<Vec<usize>, TrainingError> {
    let tensor = g.tensor(t);
    tensor
        .ty
        .shape
        .resolve(&g.bindings)
        .ok_or_else(|| TrainingError::Unbound {
            tensor: tensor.name.clone(),
            shape: tensor.ty.shape.to_string(),
        })
}

/// Fixed dims of `t` must equal what the plan runs: `(dim, what, size)`.
fn check_dims(g: &Graph, t: TensorId, dims: &[(usize, &'static str, usize)]) -> Result<(), TrainingError> {
    let shape = &g.tensor(t).ty.shape.0;
    for &(dim, what, want) in dims {
        if let Some(Dim::Fixed(fixed)) = shape.get(dim) {
            if *fixed != want {
                return Err(TrainingError::FixedDim {
                    what,
                    fixed: *fixed,
                    want,
                });
            }
        }
    }
    Ok(())
}
