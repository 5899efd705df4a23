//! `TensorProto` → [`Value`]: initializers, `Constant` attributes and the
//! `.pb` files of ONNX test data sets.
//!
//! Sizes are checked against the bytes actually present before anything is
//! allocated, so a corrupt file yields an error, never a huge allocation.

use super::proto::{TensorProto, DATA_LOCATION_EXTERNAL};
use super::OnnxError;
use autopar_ir::op::TensorType;
use autopar_ir::{wrap_int, DType, Data, Shape, Value};
use half::{bf16, f16};
use prost::Message;
use std::path::Path;

/// Largest element count accepted for one tensor (2^40): far above any real
/// weight, far below where `u64` sums over a model's tensors could overflow.
pub(crate) const MAX_ELEMENTS: u64 = 1 << 40;

fn bad(tensor: &str, message: impl Into<String>) -> OnnxError {
    OnnxError::BadTensor {
        tensor: tensor.to_string(),
        message: message.into(),
    }
}

/// The element type for an ONNX `TensorProto.DataType` code.
pub(crate) fn dtype_from_code(code: i32, tensor: &str) -> Result<DType, OnnxError> {
    DType::from_onnx_code(code)
        .ok_or_else(|| bad(tensor, format!("element type code {code} is not supported")))
}

/// Validated dims and their element count.
pub(crate) fn checked_dims(dims: &[i64], tensor: &str) -> Result<(Vec<usize>, usize), OnnxError> {
    let mut numel: u64 = 1;
    let mut shape = Vec::with_capacity(dims.len());
    for &d in dims {
        let d = u64::try_from(d).map_err(|_| bad(tensor, format!("negative dimension {d} in {dims:?}")))?;
        numel = numel
            .checked_mul(d)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| bad(tensor, format!("dims {dims:?} exceed {MAX_ELEMENTS} elements")))?;
        shape.push(d as usize);
    }
    Ok((shape, numel as usize))
}

/// True when the tensor's bytes live in an external file.
pub(crate) fn is_external(t: &TensorProto) -> bool {
    t.data_location == DATA_LOCATION_EXTERNAL
}

/// Element type and static shape of a tensor proto.
pub(crate) fn tensor_type(t: &TensorProto) -> Result<TensorType, OnnxError> {
    let dtype = dtype_from_code(t.data_type, &t.name)?;
    let (shape, _) = checked_dims(&t.dims, &t.name)?;
    Ok(TensorType {
        dtype,
        shape: Shape::fixed(&shape),
    })
}

/// Decodes a tensor's data; `Ok(None)` for external (weightless) data.
pub(crate) fn tensor_value(t: &TensorProto) -> Result<Option<Value>, OnnxError> {
    let name = t.name.as_str();
    let dtype = dtype_from_code(t.data_type, name)?;
    let (shape, numel) = checked_dims(&t.dims, name)?;
    if is_external(t) {
        return Ok(None);
    }
    if !t.raw_data.is_empty() {
        let Some(want) = dtype.packed_bytes(numel) else {
            return Err(bad(
                name,
                "string tensors keep their data in string_data, not raw_data",
            ));
        };
        if t.raw_data.len() != want {
            return Err(bad(
                name,
                format!(
                    "raw_data has {} bytes, {dtype}{shape:?} needs {want}",
                    t.raw_data.len()
                ),
            ));
        }
        return Value::from_le_bytes(dtype, shape, &t.raw_data)
            .map(Some)
            .map_err(|e| bad(name, e.to_string()));
    }
    let data = typed_data(t, dtype, &shape)?;
    if data.len() != numel {
        return Err(bad(
            name,
            format!("holds {} elements, {dtype}{shape:?} needs {numel}", data.len()),
        ));
    }
    Value::new(dtype, shape, data)
        .map(Some)
        .map_err(|e| bad(name, e.to_string()))
}

/// The typed field the spec assigns to `dtype`, converted to our storage.
fn typed_data(t: &TensorProto, dtype: DType, shape: &[usize]) -> Result<Data, OnnxError> {
    let ints = |v: &[i64]| Data::I64(v.iter().map(|&x| wrap_int(dtype, x)).collect());
    Ok(match dtype {
        DType::F32 => Data::F32(t.float_data.clone()),
        DType::F64 => Data::F64(t.double_data.clone()),
        DType::F16 => Data::F32(
            t.int32_data
                .iter()
                .map(|&b| f16::from_bits(b as u16).to_f32())
                .collect(),
        ),
        DType::Bf16 => Data::F32(
            t.int32_data
                .iter()
                .map(|&b| bf16::from_bits(b as u16).to_f32())
                .collect(),
        ),
        DType::Bool => Data::Bool(t.int32_data.iter().map(|&b| b != 0).collect()),
        DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32 => {
            ints(&t.int32_data.iter().map(|&x| x as i64).collect::<Vec<_>>())
        }
        DType::I64 => Data::I64(t.int64_data.clone()),
        DType::U32 | DType::U64 => ints(&t.uint64_data.iter().map(|&x| x as i64).collect::<Vec<_>>()),
        // One byte per int32 entry: a float8 code, or packed 4-/2-bit codes
        // in the `raw_data` layout.
        DType::F8E4M3Fn
        | DType::F8E4M3Fnuz
        | DType::F8E5M2
        | DType::F8E5M2Fnuz
        | DType::F8E8M0
        | DType::F4E2M1
        | DType::U4
        | DType::I4
        | DType::U2
        | DType::I2 => {
            let bytes: Vec<u8> = t.int32_data.iter().map(|&b| b as u8).collect();
            Value::from_le_bytes(dtype, shape.to_vec(), &bytes)
                .map_err(|e| bad(&t.name, format!("int32_data: {e}")))?
                .data
        }
        DType::String => Data::Str(
            t.string_data
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    String::from_utf8(s.clone())
                        .map_err(|_| bad(&t.name, format!("string_data element {i} is not UTF-8")))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// Reads a serialized `TensorProto` (an ONNX test-data `.pb` file) and
/// returns its name and value.
pub fn read_tensor_file(path: &Path) -> Result<(String, Value), OnnxError> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let proto = TensorProto::decode(bytes.as_slice())?;
    let label = if proto.name.is_empty() {
        path.display().to_string()
    } else {
        proto.name.clone()
    };
    match tensor_value(&proto) {
        Ok(Some(v)) => Ok((proto.name, v)),
        Ok(None) => Err(bad(&label, "data is external; a tensor file must hold its data")),
        Err(OnnxError::BadTensor { message, .. }) => Err(bad(&label, message)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(dtype: DType, dims: &[i64]) -> TensorProto {
        TensorProto {
            name: "t".into(),
            data_type: dtype.onnx_code(),
            dims: dims.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn raw_data_is_little_endian() {
        let mut t = proto(DType::F32, &[2]);
        t.raw_data = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(
            tensor_value(&t).unwrap().unwrap(),
            Value::f32(vec![2], vec![1.5, -2.0]).unwrap()
        );
    }

    #[test]
    fn typed_fields_per_dtype() {
        let mut t = proto(DType::F16, &[2]);
        t.int32_data = vec![
            f16::from_f32(0.5).to_bits() as i32,
            f16::from_f32(-3.0).to_bits() as i32,
        ];
        assert_eq!(
            tensor_value(&t).unwrap().unwrap().data,
            Data::F32(vec![0.5, -3.0])
        );

        let mut t = proto(DType::U8, &[2]);
        t.int32_data = vec![255, 7];
        assert_eq!(tensor_value(&t).unwrap().unwrap().data, Data::I64(vec![255, 7]));

        let mut t = proto(DType::Bool, &[3]);
        t.int32_data = vec![1, 0, 1];
        assert_eq!(
            tensor_value(&t).unwrap().unwrap().data,
            Data::Bool(vec![true, false, true])
        );

        let mut t = proto(DType::U64, &[1]);
        t.uint64_data = vec![u64::MAX];
        assert_eq!(tensor_value(&t).unwrap().unwrap().data, Data::I64(vec![-1]));

        let mut t = proto(DType::I64, &[]);
        t.int64_data = vec![42];
        assert_eq!(tensor_value(&t).unwrap().unwrap(), Value::scalar_i64(42));
    }

    #[test]
    fn external_data_is_weightless() {
        let mut t = proto(DType::F32, &[1024, 1024]);
        t.data_location = DATA_LOCATION_EXTERNAL;
        assert_eq!(tensor_value(&t).unwrap(), None);
        assert_eq!(tensor_type(&t).unwrap().shape, Shape::fixed(&[1024, 1024]));
    }

    #[test]
    fn malformed_tensors_are_errors() {
        let mut t = proto(DType::F32, &[4]);
        t.raw_data = vec![0; 7];
        assert!(tensor_value(&t)
            .unwrap_err()
            .to_string()
            .contains("raw_data has 7 bytes"));

        let t = proto(DType::F32, &[-1]);
        assert!(tensor_value(&t)
            .unwrap_err()
            .to_string()
            .contains("negative dimension"));

        let t = proto(DType::F32, &[1 << 30, 1 << 30, 1 << 30]);
        assert!(tensor_value(&t).unwrap_err().to_string().contains("exceed"));

        let t = proto(DType::F32, &[3]);
        assert!(tensor_value(&t)
            .unwrap_err()
            .to_string()
            .contains("holds 0 elements"));

        let mut t = proto(DType::F32, &[1]);
        t.data_type = 14;
        assert!(tensor_value(&t).unwrap_err().to_string().contains("code 14"));

        let mut t = proto(DType::String, &[1]);
        t.raw_data = vec![1];
        assert!(tensor_value(&t).unwrap_err().to_string().contains("string_data"));
        t.raw_data.clear();
        t.string_data = vec![vec![0xff]];
        assert!(tensor_value(&t).unwrap_err().to_string().contains("not UTF-8"));
    }

    #[test]
    fn low_precision_and_string_fields() {
        // float8: one code per int32 entry (0x38 = 1.0, 0xc0 = -2.0 in e4m3fn).
        let mut t = proto(DType::F8E4M3Fn, &[2]);
        t.int32_data = vec![0x38, 0xc0];
        assert_eq!(
            tensor_value(&t).unwrap().unwrap().data,
            Data::F32(vec![1.0, -2.0])
        );
        // int4: packed pairs, low nibble first, in raw_data or int32_data.
        let mut t = proto(DType::I4, &[3]);
        t.raw_data = vec![0xf7, 0x08];
        let want = Value::ints(DType::I4, vec![3], vec![7, -1, -8]).unwrap();
        assert_eq!(tensor_value(&t).unwrap().unwrap(), want);
        t.raw_data.clear();
        t.int32_data = vec![0xf7, 0x08];
        assert_eq!(tensor_value(&t).unwrap().unwrap(), want);
        t.int32_data = vec![0xf7];
        assert!(tensor_value(&t).unwrap_err().to_string().contains("int32_data"));
        let mut t = proto(DType::String, &[2]);
        t.string_data = vec![b"a".to_vec(), b"bc".to_vec()];
        assert_eq!(
            tensor_value(&t).unwrap().unwrap(),
            Value::strings(vec![2], vec!["a".into(), "bc".into()]).unwrap()
        );
    }
}
