//! Trained weights back into the ONNX file they came from. Every
//! initializer is what the import read it as — a parameter, a tied copy of
//! one (maybe transposed), a parameter joined to a tied block, one slice
//! expanded over the batch, or a constant — so its trained value is that
//! reading evaluated on the trained parameters. The file is then rewritten
//! at the protobuf wire level, replacing only those initializers' data, so
//! everything else in it (nodes, metadata, fields this importer never
//! reads) stays byte for byte.

use super::error::OnnxError;
use super::import::Builder;
use super::proto::{GraphProto, ModelProto};
use autopar_ir::{DType, Data, Role, TensorId, Value};
use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};
use prost::Message;
use std::collections::{BTreeMap, HashMap};

/// `ModelProto.graph`, `GraphProto.initializer`, and the `TensorProto`
/// fields: name, and every field that holds or locates data.
const MODEL_GRAPH: u32 = 7;
const GRAPH_INITIALIZER: u32 = 5;
const TENSOR_NAME: u32 = 8;
const TENSOR_RAW_DATA: u32 = 9;
const TENSOR_DATA_FIELDS: [u32; 8] = [4, 5, 6, 7, 9, 10, 11, 13];
const TENSOR_DATA_LOCATION: u32 = 14;

/// The model file `bytes` with its initializers holding what `trained`
/// (parameter name → whole value, as the import names parameters) makes
/// of them; initializers that read no parameter keep their data. A
/// parameter of the model missing from `trained` is an error naming it.
pub fn with_trained_weights(bytes: &[u8], trained: &HashMap<String, Value>) -> Result<Vec<u8>, OnnxError> {
    let model = ModelProto::decode(bytes)?;
    let proto = model.graph.as_ref().ok_or(OnnxError::MissingGraph)?;
    let values = initializer_values(proto, trained)?;
    rewrite_model(bytes, &values)
}

/// Each initializer that reads a parameter, evaluated on `trained`, as the
/// file's element type.
fn initializer_values(
    proto: &GraphProto,
    trained: &HashMap<String, Value>,
) -> Result<BTreeMap<String, Value>, OnnxError> {
    let mut b = Builder::new(proto);
    b.add_initializers(proto)?;
    let g = b.graph();
    let mut known: HashMap<TensorId, Value> = HashMap::new();
    for (id, t) in g.tensors() {
        match t.role {
            Role::Parameter => {
                let v = trained.get(&t.name).ok_or_else(|| OnnxError::BadTensor {
                    tensor: t.name.clone(),
                    message: "the checkpoint has no trained value of this parameter".into(),
                })?;
                let dims = t.ty.shape.as_fixed().unwrap_or_default();
                if v.shape != dims {
                    return Err(OnnxError::BadTensor {
                        tensor: t.name.clone(),
                        message: format!("trained value has shape {:?}, the model {dims:?}", v.shape),
                    });
                }
                known.insert(id, cast(v, t.ty.dtype));
            }
            _ => {
                if let Some(data) = &t.data {
                    known.insert(id, (**data).clone());
                }
            }
        }
    }
    // The readings of tied copies, joined blocks and expanded slices.
    for idx in g.topo_order()? {
        let node = g.node(idx);
        let args: Vec<Option<&Value>> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|t| known.get(&t)))
            .collect();
        let outs = node.op.eval(&args).map_err(|e| OnnxError::BadTensor {
            tensor: node.name.clone(),
            message: e.to_string(),
        })?;
        for (t, v) in node.outputs.iter().zip(outs) {
            known.insert(*t, v);
        }
    }
    let reads_parameter = |id: TensorId| g.tensor(id).role == Role::Parameter || g.producer(id).is_some();
    let mut out = BTreeMap::new();
    for init in &proto.initializer {
        let Some(id) = b.bound(&init.name) else { continue };
        if reads_parameter(id) {
            if let Some(v) = known.get(&id) {
                out.insert(init.name.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

/// `v` as `dtype` (a run may train an f32 model in f64; narrow floats
/// are held as f32 values of their type).
fn cast(v: &Value, dtype: DType) -> Value {
    let wide = v.to_f64_vec();
    let data = match dtype {
        DType::F64 => Data::F64(wide),
        _ => Data::F32(wide.into_iter().map(|x| x as f32).collect()),
    };
    Value {
        dtype,
        shape: v.shape.clone(),
        data,
    }
}

/// One protobuf field: its number, wire type and encoded bytes (key included).
struct Field<'a> {
    number: u32,
    payload: Option<&'a [u8]>,
    whole: &'a [u8],
}

/// The fields of a message, in order.
fn fields(mut bytes: &[u8]) -> Result<Vec<Field<'_>>, OnnxError> {
    let all = bytes;
    let mut out = Vec::new();
    while bytes.has_remaining() {
        let start = all.len() - bytes.len();
        let (number, wire) = decode_key(&mut bytes)?;
        let payload = match wire {
            WireType::Varint => {
                decode_varint(&mut bytes)?;
                None
            }
            WireType::SixtyFourBit => skip(&mut bytes, 8)?,
            WireType::ThirtyTwoBit => skip(&mut bytes, 4)?,
            WireType::LengthDelimited => {
                let len = decode_varint(&mut bytes)? as usize;
                skip(&mut bytes, len)?
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(OnnxError::Wire("groups are not used by ONNX"))
            }
        };
        let payload = if wire == WireType::LengthDelimited {
            payload
        } else {
            None
        };
        out.push(Field {
            number,
            payload,
            whole: &all[start..all.len() - bytes.len()],
        });
    }
    Ok(out)
}

/// The next `n` bytes, consumed.
fn skip<'a>(bytes: &mut &'a [u8], n: usize) -> Result<Option<&'a [u8]>, OnnxError> {
    if bytes.len() < n {
        return Err(OnnxError::Wire("truncated field"));
    }
    let (taken, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(Some(taken))
}

/// A length-delimited field `number` holding `payload`.
fn length_delimited(number: u32, payload: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// The model with the graph's initializers in `values` replaced.
fn rewrite_model(bytes: &[u8], values: &BTreeMap<String, Value>) -> Result<Vec<u8>, OnnxError> {
    let mut out = Vec::with_capacity(bytes.len());
    for f in fields(bytes)? {
        match (f.number, f.payload) {
            (MODEL_GRAPH, Some(graph)) => {
                length_delimited(MODEL_GRAPH, &rewrite_graph(graph, values)?, &mut out)
            }
            _ => out.extend_from_slice(f.whole),
        }
    }
    Ok(out)
}

fn rewrite_graph(bytes: &[u8], values: &BTreeMap<String, Value>) -> Result<Vec<u8>, OnnxError> {
    let mut out = Vec::with_capacity(bytes.len());
    for f in fields(bytes)? {
        match (f.number, f.payload) {
            (GRAPH_INITIALIZER, Some(tensor)) => match rewrite_tensor(tensor, values)? {
                Some(new) => length_delimited(GRAPH_INITIALIZER, &new, &mut out),
                None => out.extend_from_slice(f.whole),
            },
            _ => out.extend_from_slice(f.whole),
        }
    }
    Ok(out)
}

/// The tensor with its data replaced, if `values` has it: every data and
/// external-location field dropped, the value as raw data.
fn rewrite_tensor(bytes: &[u8], values: &BTreeMap<String, Value>) -> Result<Option<Vec<u8>>, OnnxError> {
    let fs = fields(bytes)?;
    let name = fs
        .iter()
        .find(|f| f.number == TENSOR_NAME)
        .and_then(|f| f.payload)
        .map(String::from_utf8_lossy);
    let Some(value) = name.and_then(|n| values.get(n.as_ref())) else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(bytes.len());
    for f in &fs {
        if !TENSOR_DATA_FIELDS.contains(&f.number) && f.number != TENSOR_DATA_LOCATION {
            out.extend_from_slice(f.whole);
        }
    }
    length_delimited(TENSOR_RAW_DATA, &value.to_le_bytes(), &mut out);
    Ok(Some(out))
}
