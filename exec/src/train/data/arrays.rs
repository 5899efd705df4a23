//! Features and labels read from arrays: `--data FEATURES.npy --labels
//! LABELS.npy` for a model with one fed input, or `--data FILE.safetensors`
//! holding one tensor per fed input (named as the input) and `labels`.
//! Every array's first dim counts the examples; row `r` of step `s` is the
//! example drawn from `(seed, s, r)`, as token files draw their windows.
//!
//! Everything is checked when the files are opened, against the task the
//! training graph describes: each input's per-example shape, integer
//! inputs fed integers, the examples' counts, the labels' shape and (for
//! classification) range. Errors name the file and the tensor.

use super::{DataError, Values};
use crate::train::random;
use autopar_ir::{DType, Value};
use autopar_lower::{FeatureInput, Feed, Task};
use std::collections::BTreeMap;
use std::path::Path;

/// The labels' tensor in a safetensors file.
const LABELS: &str = "labels";

/// Loaded arrays, checked against their task.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrays {
    /// Each fed input's examples, by input name.
    inputs: BTreeMap<String, Column>,
    labels: Column,
    examples: usize,
    seed: u64,
}

/// One array's examples, flattened: `per_example` values each.
#[derive(Debug, Clone, PartialEq)]
struct Column {
    per_example: usize,
    values: Values,
}

/// An array as read: its shape (examples first) and values.
struct Array {
    shape: Vec<usize>,
    values: Values,
}

/// Where an array came from, for messages: its file, and its tensor's
/// name in a safetensors file.
#[derive(Clone, Copy)]
struct Source<'a> {
    path: &'a Path,
    tensor: Option<&'a str>,
}

impl Source<'_> {
    fn error(&self, message: impl std::fmt::Display) -> DataError {
        let message = match self.tensor {
            Some(t) => format!("tensor '{t}': {message}"),
            None => message.to_string(),
        };
        DataError::Arrays {
            path: self.path.to_path_buf(),
            message,
        }
    }
}

impl Arrays {
    /// Whether `path` names an array file rather than a token file.
    pub(super) fn is_arrays(path: &Path) -> bool {
        matches!(extension(path).as_str(), "npy" | "safetensors")
    }

    /// Reads `path` (and `labels`, for `.npy` features) for `task`.
    pub fn open(path: &Path, labels: Option<&Path>, task: &Task, seed: u64) -> Result<Arrays, DataError> {
        let (inputs, label_classes, outputs) = match task {
            Task::Classify { inputs, classes } => (inputs, Some(*classes), 1),
            Task::Regress { inputs, outputs } => (inputs, None, *outputs),
            _ => {
                return Err(DataError::ArraysForTokens {
                    path: path.to_path_buf(),
                    objective: task.objective(),
                })
            }
        };
        let not_arrays = || DataError::NotArrays {
            path: path.to_path_buf(),
            objective: task.objective(),
        };
        let mut read: Vec<(Source, Array, Option<&FeatureInput>)> = Vec::new();
        let bytes;
        match extension(path).as_str() {
            "npy" => {
                let [input] = inputs.as_slice() else {
                    let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
                    return Err(DataError::Arrays {
                        path: path.to_path_buf(),
                        message: format!(
                            "one .npy file feeds one input, but the model has {}: {}; give a .safetensors file with a tensor per input and 'labels'",
                            names.len(),
                            names.join(", ")
                        ),
                    });
                };
                let Some(labels) = labels else {
                    return Err(DataError::Arrays {
                        path: path.to_path_buf(),
                        message: "features in a .npy file need their labels: give --labels LABELS.npy".into(),
                    });
                };
                let features = Source { path, tensor: None };
                read.push((features, read_npy(features)?, Some(input)));
                let labels = Source {
                    path: labels,
                    tensor: None,
                };
                read.push((labels, read_npy(labels)?, None));
            }
            "safetensors" => {
                if let Some(labels) = labels {
                    return Err(DataError::Arrays {
                        path: labels.to_path_buf(),
                        message: format!(
                            "{} holds the labels (tensor '{LABELS}'); --labels goes with .npy features",
                            path.display()
                        ),
                    });
                }
                bytes = std::fs::read(path).map_err(|source| DataError::ReadArrays {
                    path: path.to_path_buf(),
                    source,
                })?;
                let file = Source { path, tensor: None };
                let st = safetensors::SafeTensors::deserialize(&bytes)
                    .map_err(|e| file.error(format!("not a .safetensors file: {e}")))?;
                let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).chain([LABELS]).collect();
                for (name, spec) in names.into_iter().zip(inputs.iter().map(Some).chain([None])) {
                    let source = Source {
                        path,
                        tensor: Some(name),
                    };
                    let view = st.tensor(name).map_err(|_| {
                        let mut held = st.names();
                        held.sort_unstable();
                        let what = match spec {
                            Some(_) => "the model's input",
                            None => "the labels",
                        };
                        file.error(format!(
                            "no tensor '{name}' ({what}); it holds {}",
                            held.join(", ")
                        ))
                    })?;
                    read.push((source, safetensor(source, &view)?, spec));
                }
            }
            _ => return Err(not_arrays()),
        }
        let examples = read[0].1.shape.first().copied().unwrap_or(0);
        let first = match read[0].0.tensor {
            Some(t) => format!("tensor '{t}'"),
            None => format!("the features {}", path.display()),
        };
        let mut columns = BTreeMap::new();
        let mut label_column = None;
        for (source, array, spec) in read {
            let n = array.shape.first().copied().unwrap_or(0);
            if n != examples {
                return Err(source.error(format!("holds {n} examples, but {first} holds {examples}")));
            }
            if n == 0 {
                return Err(source.error("holds no examples"));
            }
            match spec {
                Some(spec) => {
                    columns.insert(spec.name.clone(), feature_column(source, array, spec)?);
                }
                None => label_column = Some(label_column_of(source, array, label_classes, outputs)?),
            }
        }
        Ok(Arrays {
            inputs: columns,
            labels: label_column.expect("the labels are read with the features"),
            examples,
            seed,
        })
    }

    /// Row `row` of step `step` of `input` (fed with `feed`) for `task`.
    pub(super) fn row(
        &self,
        task: &Task,
        feed: Feed,
        input: &str,
        step: u64,
        row: usize,
    ) -> Result<Values, DataError> {
        let column = match feed {
            Feed::Features => self.inputs.get(input),
            Feed::Targets | Feed::Values => Some(&self.labels),
            _ => None,
        };
        let Some(column) = column else {
            return Err(DataError::WrongData {
                objective: task.objective(),
                data: "arrays",
            });
        };
        let key = random::key(&[self.seed, step, row as u64]);
        let example = random::below(key, 0, self.examples as u64) as usize;
        let range = example * column.per_example..(example + 1) * column.per_example;
        Ok(match &column.values {
            Values::Ints(v) => Values::Ints(v[range].to_vec()),
            Values::Floats(v) => Values::Floats(v[range].to_vec()),
        })
    }
}

/// The file extension, lower case.
fn extension(path: &Path) -> String {
    path.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default()
}

/// `array` as the examples of input `spec`.
fn feature_column(source: Source, array: Array, spec: &FeatureInput) -> Result<Column, DataError> {
    if array.shape[1..] != spec.row[..] {
        return Err(source.error(format!(
            "examples of shape {:?} (shape {:?}), but input '{}' takes rows of {:?}",
            &array.shape[1..],
            array.shape,
            spec.name,
            spec.row
        )));
    }
    let values = match (array.values, spec.dtype.is_float()) {
        (Values::Floats(_), false) => {
            return Err(source.error(format!(
                "holds real values, but input '{}' is {}",
                spec.name, spec.dtype
            )))
        }
        (Values::Ints(v), true) => Values::Floats(v.into_iter().map(|x| x as f64).collect()),
        (values, _) => values,
    };
    Ok(Column {
        per_example: spec.row.iter().product(),
        values,
    })
}

/// `array` as the labels: one class of `classes` per example
/// (classification), or `outputs` values (regression).
fn label_column_of(
    source: Source,
    array: Array,
    classes: Option<usize>,
    outputs: usize,
) -> Result<Column, DataError> {
    let per_example: usize = array.shape[1..].iter().product();
    let fits = match array.shape.len() {
        1 => outputs == 1,
        2 => array.shape[1] == outputs,
        _ => false,
    };
    if !fits {
        let want = match (classes, outputs) {
            (Some(_), _) => "[examples] (one class each)".to_string(),
            (None, 1) => "[examples] or [examples, 1]".to_string(),
            (None, k) => format!("[examples, {k}] (the model's outputs)"),
        };
        return Err(source.error(format!(
            "labels of shape {:?}, but the model needs {want}",
            array.shape
        )));
    }
    let values = match (classes, array.values) {
        (Some(classes), Values::Ints(v)) => {
            if let Some((i, c)) = v
                .iter()
                .enumerate()
                .find(|(_, &c)| c < 0 || c as usize >= classes)
            {
                return Err(source.error(format!(
                    "label {c} of example {i} is not one of the model's {classes} classes (0 to {})",
                    classes - 1
                )));
            }
            Values::Ints(v)
        }
        (Some(_), Values::Floats(_)) => {
            return Err(source.error("classification labels must be integer classes, not real values"))
        }
        (None, Values::Ints(v)) => Values::Floats(v.into_iter().map(|x| x as f64).collect()),
        (None, floats) => floats,
    };
    Ok(Column { per_example, values })
}

/// Reads a `.npy` array of floats, integers or booleans (C order).
fn read_npy(source: Source) -> Result<Array, DataError> {
    use npyz::TypeChar;
    let bytes = std::fs::read(source.path).map_err(|e| DataError::ReadArrays {
        path: source.path.to_path_buf(),
        source: e,
    })?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| source.error(format!("not a .npy file: {e}")))?;
    if npy.order() == npyz::Order::Fortran {
        return Err(source.error("stored in Fortran order; save it in C order (numpy.ascontiguousarray)"));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let npyz::DType::Plain(ts) = npy.dtype() else {
        return Err(source.error("holds records; a plain array of numbers is needed"));
    };
    let read = |e: std::io::Error| source.error(format!("reading its values: {e}"));
    let ints = |v: Vec<i64>| Values::Ints(v);
    let values = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => Values::Floats(
            npy.into_vec::<f32>()
                .map_err(read)?
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        (TypeChar::Float, 8) => Values::Floats(npy.into_vec::<f64>().map_err(read)?),
        (TypeChar::Int, 1) => ints(
            npy.into_vec::<i8>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Int, 2) => ints(
            npy.into_vec::<i16>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Int, 4) => ints(
            npy.into_vec::<i32>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Int, 8) => ints(npy.into_vec::<i64>().map_err(read)?),
        (TypeChar::Uint, 1) => ints(
            npy.into_vec::<u8>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Uint, 2) => ints(
            npy.into_vec::<u16>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Uint, 4) => ints(
            npy.into_vec::<u32>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Bool, 1) => ints(
            npy.into_vec::<bool>()
                .map_err(read)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        _ => {
            return Err(source.error(format!(
                "dtype '{ts}' is not read (floats, integers and booleans are)"
            )))
        }
    };
    Ok(Array { shape, values })
}

/// A safetensors tensor of floats, integers or booleans.
fn safetensor(source: Source, view: &safetensors::tensor::TensorView) -> Result<Array, DataError> {
    use safetensors::Dtype as S;
    let dtype = match view.dtype() {
        S::BOOL => DType::Bool,
        S::U8 => DType::U8,
        S::I8 => DType::I8,
        S::I16 => DType::I16,
        S::U16 => DType::U16,
        S::I32 => DType::I32,
        S::U32 => DType::U32,
        S::I64 => DType::I64,
        S::F16 => DType::F16,
        S::BF16 => DType::Bf16,
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        other => {
            return Err(source.error(format!(
                "dtype {other} is not read (floats, integers and booleans are)"
            )))
        }
    };
    let shape = view.shape().to_vec();
    let v = Value::from_le_bytes(dtype, shape.clone(), view.data()).map_err(|e| source.error(e))?;
    let values = match v.data {
        autopar_ir::Data::I64(ints) => Values::Ints(ints),
        autopar_ir::Data::Bool(b) => Values::Ints(b.into_iter().map(i64::from).collect()),
        _ => Values::Floats(v.to_f64_vec()),
    };
    Ok(Array { shape, values })
}

#[cfg(test)]
mod tests {
    use super::*;
    use npyz::WriterBuilder;
    use safetensors::Dtype;
    use std::path::PathBuf;

    /// Writes a `.npy` array of `shape` holding `values` as `dir/name`.
    fn npy<T: npyz::AutoSerialize + Copy>(dir: &Path, name: &str, shape: &[u64], values: &[T]) -> PathBuf {
        let path = dir.join(name);
        let file = std::fs::File::create(&path).unwrap();
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .writer(file)
            .begin_nd()
            .unwrap();
        w.extend(values.iter().copied()).unwrap();
        w.finish().unwrap();
        path
    }

    /// Writes `tensors` (name, dtype, shape, little-endian bytes) as `dir/name`.
    fn safetensors_file(dir: &Path, name: &str, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> PathBuf {
        let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                (
                    *n,
                    safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                )
            })
            .collect();
        let path = dir.join(name);
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        path
    }

    fn input(name: &str, dtype: DType, row: &[usize]) -> FeatureInput {
        FeatureInput {
            name: name.into(),
            dtype,
            row: row.to_vec(),
        }
    }

    fn classify(row: &[usize], classes: usize) -> Task {
        Task::Classify {
            inputs: vec![input("x", DType::F32, row)],
            classes,
        }
    }

    fn floats(v: Values) -> Vec<f64> {
        match v {
            Values::Floats(v) => v,
            Values::Ints(_) => panic!("integers"),
        }
    }

    fn ints(v: Values) -> Vec<i64> {
        match v {
            Values::Ints(v) => v,
            Values::Floats(_) => panic!("reals"),
        }
    }

    /// Each row is one example, features and label alike, drawn from
    /// `(seed, step, row)` over all of them.
    #[test]
    fn npy_rows_are_examples_with_their_labels() {
        let dir = tempfile::tempdir().unwrap();
        let x: Vec<f32> = (0..15).map(|i| (i / 3 * 10 + i % 3) as f32).collect();
        let features = npy(dir.path(), "x.npy", &[5, 3], &x);
        let labels = npy(dir.path(), "y.npy", &[5], &[0i32, 1, 2, 0, 1]);
        let task = classify(&[3], 3);
        let a = Arrays::open(&features, Some(&labels), &task, 7).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for row in 0..40 {
            let f = floats(a.row(&task, Feed::Features, "x", 2, row).unwrap());
            let example = (f[0] / 10.0) as i64;
            assert_eq!(f, [0.0, 1.0, 2.0].map(|i| (example * 10) as f64 + i));
            let label = ints(a.row(&task, Feed::Targets, "", 2, row).unwrap());
            assert_eq!(label, [[0, 1, 2, 0, 1][example as usize]]);
            seen.insert(example);
        }
        assert_eq!(seen.len(), 5, "rows draw every example");
    }

    /// A safetensors file feeds every input by name (integer inputs get
    /// integers, float inputs any numbers) and `labels`.
    #[test]
    fn safetensors_feed_every_input_and_the_labels() {
        let dir = tempfile::tempdir().unwrap();
        let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let ids: Vec<u8> = [5i64, 6, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let path = safetensors_file(
            dir.path(),
            "data.safetensors",
            &[
                (
                    "dense",
                    Dtype::F32,
                    vec![3, 2],
                    le(&[0.5, 1.0, 1.5, 2.0, 2.5, 3.0]),
                ),
                ("ids", Dtype::I64, vec![3], ids),
                ("labels", Dtype::F32, vec![3, 1], le(&[10.0, 20.0, 30.0])),
            ],
        );
        let task = Task::Regress {
            inputs: vec![input("dense", DType::F32, &[2]), input("ids", DType::I64, &[])],
            outputs: 1,
        };
        let a = Arrays::open(&path, None, &task, 1).unwrap();
        for row in 0..10 {
            let id = ints(a.row(&task, Feed::Features, "ids", 0, row).unwrap())[0];
            let e = (id - 5) as usize;
            let dense = floats(a.row(&task, Feed::Features, "dense", 0, row).unwrap());
            assert_eq!(dense, [0.5 + e as f64, 1.0 + e as f64]);
            assert_eq!(
                floats(a.row(&task, Feed::Values, "", 0, row).unwrap()),
                [10.0 * (e + 1) as f64]
            );
        }
    }

    /// Arrays that do not fit the model are refused when opened, naming
    /// the file and the tensor.
    #[test]
    fn misfit_arrays_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let x = npy(d, "x.npy", &[5, 4], &[0f32; 20]);
        let y = npy(d, "y.npy", &[5], &[0i64, 1, 2, 1, 0]);
        let short = npy(d, "short.npy", &[4], &[0i64; 4]);
        let wide = npy(d, "wide.npy", &[5], &[0i64, 1, 7, 1, 0]);
        let reals = npy(d, "reals.npy", &[5], &[0.5f64; 5]);
        let garbage = d.join("garbage.npy");
        std::fs::write(&garbage, b"not numpy").unwrap();
        let st = safetensors_file(d, "x.safetensors", &[("x", Dtype::F32, vec![5, 4], vec![0; 80])]);
        let ints_task = Task::Classify {
            inputs: vec![input("ids", DType::I64, &[4])],
            classes: 3,
        };
        let ids = npy(d, "ids.npy", &[5, 4], &[0.5f32; 20]);
        let show = |p: &Path| p.display().to_string();
        let cases: Vec<(Result<Arrays, DataError>, String)> = vec![
            (
                Arrays::open(&x, Some(&y), &classify(&[3], 3), 0),
                format!(
                    "{}: examples of shape [4] (shape [5, 4]), but input 'x' takes rows of [3]",
                    show(&x)
                ),
            ),
            (
                Arrays::open(&x, Some(&short), &classify(&[4], 3), 0),
                format!(
                    "{}: holds 4 examples, but the features {} holds 5",
                    show(&short),
                    show(&x)
                ),
            ),
            (
                Arrays::open(&x, Some(&wide), &classify(&[4], 3), 0),
                format!(
                    "{}: label 7 of example 2 is not one of the model's 3 classes (0 to 2)",
                    show(&wide)
                ),
            ),
            (
                Arrays::open(&x, Some(&reals), &classify(&[4], 3), 0),
                format!(
                    "{}: classification labels must be integer classes, not real values",
                    show(&reals)
                ),
            ),
            (
                Arrays::open(&x, None, &classify(&[4], 3), 0),
                format!(
                    "{}: features in a .npy file need their labels: give --labels LABELS.npy",
                    show(&x)
                ),
            ),
            (
                Arrays::open(&garbage, Some(&y), &classify(&[4], 3), 0),
                format!("{}: not a .npy file", show(&garbage)),
            ),
            (
                Arrays::open(&st, None, &classify(&[4], 3), 0),
                format!("{}: no tensor 'labels' (the labels); it holds x", show(&st)),
            ),
            (
                Arrays::open(&ids, Some(&y), &ints_task, 0),
                format!("{}: holds real values, but input 'ids' is i64", show(&ids)),
            ),
            (
                Arrays::open(&st, Some(&y), &classify(&[4], 3), 0),
                format!(
                    "{}: {} holds the labels (tensor 'labels'); --labels goes with .npy features",
                    show(&y),
                    show(&st)
                ),
            ),
        ];
        for (got, want) in cases {
            let err = got.unwrap_err().to_string();
            assert!(err.starts_with(&want), "{err}\nexpected: {want}");
        }
    }
}
