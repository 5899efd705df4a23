//! Training data, deterministic and independent of how many ranks consume
//! it: row `r` of step `s`'s global batch is a pure function of
//! `(seed, s, r)`, so a data-parallel rank asks for its own rows and a
//! single process asking for all rows sees the same data (the "parallel =
//! single" tests rest on this).
//!
//! What a row holds is the training graph's [`Task`]; where it comes from
//! is a [`Data`]: a token stream (synthetic or a token file) for the token
//! objectives, synthetic features or arrays read from `.npy` or
//! `.safetensors` files for classification and regression.

mod arrays;
mod features;
mod token_tasks;
mod tokens;

pub use arrays::Arrays;
pub use tokens::TokenSource;

use autopar_ir::{round_float, DType, Value};
use autopar_lower::{Feed, Objective, Task};
use std::path::{Path, PathBuf};

/// Where a run's rows come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// A token stream, for lm, seq2seq and mlm ([`token_tasks`]).
    Tokens(TokenSource),
    /// Learnable synthetic features and labels, for classify and regress
    /// (see [`features`]).
    Features { seed: u64 },
    /// Features and labels read from arrays, for classify and regress.
    Arrays(Arrays),
}

impl From<TokenSource> for Data {
    fn from(source: TokenSource) -> Data {
        Data::Tokens(source)
    }
}

/// Some rows' values of one data input, flattened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Values {
    Ints(Vec<i64>),
    /// Real values (synthetic ones exact in f32, so an f64 run reads what
    /// an f32 run reads, widened).
    Floats(Vec<f64>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Ints(v) => v.len(),
            Values::Floats(v) => v.len(),
        }
    }

    /// Appends `other`, which must be of the same kind.
    fn extend(&mut self, other: Values) {
        match (self, other) {
            (Values::Ints(a), Values::Ints(b)) => a.extend(b),
            (Values::Floats(a), Values::Floats(b)) => a.extend(b),
            _ => unreachable!("one input's rows are all of one kind"),
        }
    }
}

/// Why data could not be loaded or served; file errors name the file, and
/// the tensor or field in it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read token file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("token file {} has {bytes} bytes, not a whole number of uint16 tokens", path.display())]
    OddBytes { path: PathBuf, bytes: usize },
    #[error("token file {} has {tokens} tokens, fewer than seq + 1 = {}", path.display(), seq + 1)]
    TooShort {
        path: PathBuf,
        tokens: usize,
        seq: usize,
    },
    #[error("token file {}: token {index} is {token}, not below the vocabulary size {vocab}", path.display())]
    TokenOutOfRange {
        path: PathBuf,
        index: usize,
        token: u32,
        vocab: usize,
    },
    #[error("synthetic tokens need a vocabulary of at least one token")]
    EmptyVocab,
    #[error("cannot read {}: {source}", path.display())]
    ReadArrays { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", path.display())]
    Arrays { path: PathBuf, message: String },
    #[error("--data {}: --objective {objective} trains on a uint16 token file, not arrays (.npy and .safetensors feed classify and regress)", path.display())]
    ArraysForTokens { path: PathBuf, objective: Objective },
    #[error("--data {}: --objective {objective} reads features from .npy (with --labels) or .safetensors files", path.display())]
    NotArrays { path: PathBuf, objective: Objective },
    #[error("--labels {}: labels go with --data FEATURES.npy under --objective classify or regress, not {objective}", path.display())]
    StrayLabels { path: PathBuf, objective: Objective },
    #[error("input '{input}' is {dtype}: synthetic data makes float features only; give --data FILE.safetensors holding a tensor '{input}'")]
    SyntheticInts { input: String, dtype: DType },
    #[error("--objective {objective} cannot train on {data}")]
    WrongData {
        objective: Objective,
        data: &'static str,
    },
    #[error("input '{input}' is {dtype}, but the data holds real values for it")]
    Reals { input: String, dtype: DType },
    #[error("input '{input}': {want} values for shape {shape:?}, {got} made")]
    Size {
        input: String,
        shape: Vec<usize>,
        want: usize,
        got: usize,
    },
}

impl Data {
    /// The data `task` trains on: synthetic without `data` (progressions
    /// for token objectives, see [`TokenSource::Synthetic`]; features for
    /// the others, see [`features`]), else the file `data`: a uint16 token
    /// file, or `.npy` features with `labels`, or a `.safetensors` file
    /// holding one tensor per model input and `labels`. Checks up front
    /// what would otherwise fail mid-run.
    pub fn open(
        task: &Task,
        data: Option<&Path>,
        labels: Option<&Path>,
        seed: u64,
    ) -> Result<Data, DataError> {
        let objective = task.objective();
        if let (true, Some(path)) = (objective.on_tokens(), labels) {
            return Err(DataError::StrayLabels {
                path: path.to_path_buf(),
                objective,
            });
        }
        match (task, data) {
            (Task::Lm { vocab, .. } | Task::Seq2Seq { vocab, .. } | Task::Mlm { vocab, .. }, None) => {
                Ok(Data::Tokens(TokenSource::synthetic(*vocab, seed)))
            }
            (Task::Lm { vocab, .. } | Task::Seq2Seq { vocab, .. } | Task::Mlm { vocab, .. }, Some(path)) => {
                if Arrays::is_arrays(path) {
                    return Err(DataError::ArraysForTokens {
                        path: path.to_path_buf(),
                        objective,
                    });
                }
                let window = token_tasks::window(task);
                Ok(Data::Tokens(TokenSource::open(path, *vocab, window, seed)?))
            }
            (Task::Classify { inputs, .. } | Task::Regress { inputs, .. }, None) => {
                if let Some(path) = labels {
                    return Err(DataError::StrayLabels {
                        path: path.to_path_buf(),
                        objective,
                    });
                }
                if let Some(int) = inputs.iter().find(|i| !i.dtype.is_float()) {
                    return Err(DataError::SyntheticInts {
                        input: int.name.clone(),
                        dtype: int.dtype,
                    });
                }
                Ok(Data::Features { seed })
            }
            (Task::Classify { .. } | Task::Regress { .. }, Some(path)) => {
                Ok(Data::Arrays(Arrays::open(path, labels, task, seed)?))
            }
        }
    }

    /// The value of data input `input`, fed with `feed`, of type `dtype` and
    /// shape `shape`, for rows `rows.0..rows.1` of step `step`'s global batch.
    #[allow(clippy::too_many_arguments)]
    pub fn batch(
        &self,
        task: &Task,
        feed: Feed,
        input: &str,
        dtype: DType,
        shape: &[usize],
        rows: (usize, usize),
        step: u64,
    ) -> Result<Value, DataError> {
        let count: usize = shape.iter().product();
        let values = match feed {
            Feed::Ones => Values::Ints(vec![1; count]),
            Feed::Zeros => Values::Ints(vec![0; count]),
            Feed::Positions => {
                let len = shape.last().copied().unwrap_or(1).max(1);
                Values::Ints((0..count).map(|i| (i % len) as i64).collect())
            }
            Feed::Seed => Values::Floats(vec![1.0; count]),
            Feed::Tokens
            | Feed::DecoderTokens
            | Feed::Targets
            | Feed::Values
            | Feed::Masked
            | Feed::Features => {
                let mut all: Option<Values> = None;
                for row in rows.0..rows.1 {
                    let one = self.row(task, feed, input, step, row)?;
                    match &mut all {
                        None => all = Some(one),
                        Some(all) => all.extend(one),
                    }
                }
                all.unwrap_or(Values::Floats(Vec::new()))
            }
        };
        if values.len() != count {
            return Err(DataError::Size {
                input: input.into(),
                shape: shape.to_vec(),
                want: count,
                got: values.len(),
            });
        }
        value(input, dtype, shape, values)
    }

    /// Row `row` of step `step` of the input fed with `feed`.
    fn row(&self, task: &Task, feed: Feed, input: &str, step: u64, row: usize) -> Result<Values, DataError> {
        let wrong = |data| DataError::WrongData {
            objective: task.objective(),
            data,
        };
        match (self, task.objective().on_tokens()) {
            (Data::Tokens(source), true) => token_tasks::row(source, task, feed, step, row),
            (Data::Features { seed }, false) => features::row(*seed, task, feed, input, step, row),
            (Data::Arrays(arrays), false) => arrays.row(task, feed, input, step, row),
            (Data::Tokens(_), false) => Err(wrong("a token stream")),
            (Data::Features { .. } | Data::Arrays(_), true) => Err(wrong("features and labels")),
        }
    }
}

/// `values` as input `input`'s tensor of `dtype` (integers wrap to its
/// range, reals round to it).
fn value(input: &str, dtype: DType, shape: &[usize], values: Values) -> Result<Value, DataError> {
    let shape = shape.to_vec();
    let made = match (values, dtype.is_float()) {
        (Values::Ints(v), false) => Value::ints(dtype, shape, v),
        (Values::Ints(v), true) => float_value(dtype, shape, v.into_iter().map(|x| x as f64).collect()),
        (Values::Floats(v), true) => float_value(dtype, shape, v),
        (Values::Floats(_), false) => {
            return Err(DataError::Reals {
                input: input.into(),
                dtype,
            })
        }
    };
    Ok(made.expect("the element count was checked"))
}

fn float_value(dtype: DType, shape: Vec<usize>, v: Vec<f64>) -> Result<Value, autopar_ir::ValueError> {
    match dtype {
        DType::F64 => Value::f64(shape, v),
        dt => Value::new(
            dt,
            shape,
            autopar_ir::Data::F32(v.into_iter().map(|x| round_float(dt, x as f32)).collect()),
        ),
    }
}
