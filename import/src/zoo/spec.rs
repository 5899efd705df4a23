//! Model spec strings, `family:key=value,...`, parsed into one typed config
//! per family. The same string names a model everywhere in the CLI, so
//! [`ModelSpec`]'s `Display` gives a canonical form that parses back to the
//! same spec: keys in a fixed order, keys left at their default omitted.
//!
//! Keys per family (`*` = required; every number must be a positive integer
//! of at most 2³², and `layers` at most [`MAX_LAYERS`]):
//!
//! | family  | keys |
//! |---------|------|
//! | `gpt`   | `layers*`, `hidden*`, `ffn` (4·hidden), `heads*`, `vocab*`, `seq*`, `batch` (1), `tied` (true), `final_norm` (false), `dtype` (f32) |
//! | `llama` | `layers*`, `hidden*`, `ffn*`, `heads*`, `kv_heads` (heads), `vocab*`, `seq*`, `batch` (1), `tied` (false), `dtype` (f32) |
//! | `moe`   | the `llama` keys plus `experts*`, `top_k` (2) |
//! | `bert`  | `layers*`, `hidden*`, `ffn` (4·hidden), `heads*`, `vocab*`, `seq*`, `type_vocab` (2), `batch` (1), `dtype` (f32) |
//!
//! `gpt`'s `final_norm` defaults to `false` so that the parameter count equals
//! Megatron's published closed form `12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))`,
//! which leaves out the final LayerNorm; `final_norm=true` adds its `2·hidden`
//! parameters. `seq` is the default binding of the symbolic `seq` dim and the
//! row count of position tables (learned positions, rotary caches).

use super::ZooError;
use autopar_ir::DType;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Largest number a spec accepts, so that sizes and their small sums and
/// products never overflow.
const MAX_VALUE: u64 = 1 << 32;
/// Most layers a spec builds: a spec makes one block of nodes per layer,
/// and building, canonicalising and planning the graph grow with their
/// count; the deepest transformers trained have about 1,000 (DeepNet).
pub const MAX_LAYERS: usize = 1024;
const DEFAULT_BATCH: usize = 1;
const DEFAULT_DTYPE: DType = DType::F32;
const DEFAULT_TOP_K: usize = 2;
const DEFAULT_TYPE_VOCAB: usize = 2;

const GPT_KEYS: &[&str] = &[
    "layers",
    "hidden",
    "ffn",
    "heads",
    "vocab",
    "seq",
    "batch",
    "tied",
    "final_norm",
    "dtype",
];
const LLAMA_KEYS: &[&str] = &[
    "layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq", "batch", "tied", "dtype",
];
const MOE_KEYS: &[&str] = &[
    "layers", "hidden", "ffn", "heads", "kv_heads", "experts", "top_k", "vocab", "seq", "batch", "tied",
    "dtype",
];
const BERT_KEYS: &[&str] = &[
    "layers",
    "hidden",
    "ffn",
    "heads",
    "vocab",
    "seq",
    "type_vocab",
    "batch",
    "dtype",
];

/// A GPT-2/GPT-3/Megatron decoder: learned positions, pre-LayerNorm layers
/// with a fused QKV projection and a GELU(tanh) MLP, biases everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptConfig {
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub vocab: usize,
    pub seq: usize,
    pub batch: usize,
    /// LM head shares the token embedding table.
    pub tied: bool,
    /// Adds the final LayerNorm (off in Megatron's closed-form count).
    pub final_norm: bool,
    pub dtype: DType,
}

/// Mixture-of-experts settings of a Mixtral-style model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
}

/// A Llama decoder (RMSNorm, SwiGLU MLP, rotary positions, grouped-query
/// attention, no biases); with `moe`, a Mixtral-style model whose MLPs are
/// top-k routed SwiGLU experts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub seq: usize,
    pub batch: usize,
    /// LM head shares the token embedding table.
    pub tied: bool,
    pub dtype: DType,
    pub moe: Option<MoeConfig>,
}

/// A BERT encoder (post-LayerNorm, exact GELU, bidirectional attention):
/// HF `BertModel` without the pooler; its output is the last hidden state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BertConfig {
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub vocab: usize,
    pub seq: usize,
    /// Rows of the token-type (segment) embedding.
    pub type_vocab: usize,
    pub batch: usize,
    pub dtype: DType,
}

/// A zoo model: which family and its sizes. Parse with `str::parse`, print
/// with `to_string` (canonical), build with [`ModelSpec::build`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    Gpt(GptConfig),
    Llama(LlamaConfig),
    Bert(BertConfig),
}

impl ModelSpec {
    /// The family name as written in spec strings (`gpt`, `llama`, `moe`, `bert`).
    pub fn family(&self) -> &'static str {
        match self {
            ModelSpec::Gpt(_) => "gpt",
            ModelSpec::Llama(c) if c.moe.is_some() => "moe",
            ModelSpec::Llama(_) => "llama",
            ModelSpec::Bert(_) => "bert",
        }
    }

    /// Number of transformer layers (one graph block each).
    pub fn layers(&self) -> usize {
        match self {
            ModelSpec::Gpt(c) => c.layers,
            ModelSpec::Llama(c) => c.layers,
            ModelSpec::Bert(c) => c.layers,
        }
    }
}

/// The `key=value` items of one spec, checked against the family's keys.
struct Keys<'a> {
    family: &'static str,
    map: BTreeMap<&'a str, &'a str>,
}

impl<'a> Keys<'a> {
    fn parse(family: &'static str, allowed: &[&str], body: &'a str) -> Result<Keys<'a>, ZooError> {
        let mut map = BTreeMap::new();
        for item in body.split(',').filter(|_| !body.trim().is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(ZooError::BadItem {
                    family: family.into(),
                    item: item.into(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            if !allowed.contains(&key) {
                return Err(ZooError::UnknownKey {
                    family: family.into(),
                    key: key.into(),
                    expected: allowed.join(", "),
                });
            }
            if map.insert(key, value).is_some() {
                return Err(ZooError::DuplicateKey {
                    family: family.into(),
                    key: key.into(),
                });
            }
        }
        Ok(Keys { family, map })
    }

    fn bad_value(&self, key: &str, value: &str, expected: &'static str) -> ZooError {
        ZooError::BadValue {
            family: self.family.into(),
            key: key.into(),
            value: value.into(),
            expected,
        }
    }

    /// A positive size, or `None` when absent.
    fn size_opt(&self, key: &str) -> Result<Option<usize>, ZooError> {
        let Some(&text) = self.map.get(key) else {
            return Ok(None);
        };
        match text.parse::<u64>() {
            Ok(n) if n > 0 && n <= MAX_VALUE => Ok(Some(n as usize)),
            Ok(_) => Err(self.bad_value(key, text, "a positive integer of at most 2^32")),
            Err(_) => Err(self.bad_value(key, text, "a positive integer")),
        }
    }

    /// The layer count: a size of at most [`MAX_LAYERS`].
    fn layers(&self) -> Result<usize, ZooError> {
        let layers = self.size("layers")?;
        if layers > MAX_LAYERS {
            return Err(self.invalid(
                "layers",
                format!("layers={layers} is above the limit of {MAX_LAYERS} layers (MAX_LAYERS)"),
            ));
        }
        Ok(layers)
    }

    fn size(&self, key: &str) -> Result<usize, ZooError> {
        self.size_opt(key)?.ok_or_else(|| ZooError::MissingKey {
            family: self.family.into(),
            key: key.into(),
        })
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool, ZooError> {
        match self.map.get(key).copied() {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(other) => Err(self.bad_value(key, other, "true or false")),
        }
    }

    fn dtype(&self) -> Result<DType, ZooError> {
        let Some(&text) = self.map.get("dtype") else {
            return Ok(DEFAULT_DTYPE);
        };
        [DType::F32, DType::F64, DType::F16, DType::Bf16]
            .into_iter()
            .find(|d| d.name() == text)
            .ok_or_else(|| self.bad_value("dtype", text, "one of f32, f64, f16, bf16"))
    }

    fn invalid(&self, key: &str, message: String) -> ZooError {
        ZooError::Invalid {
            family: self.family.into(),
            key: key.into(),
            message,
        }
    }

    /// Checks that `heads` splits `hidden` evenly.
    fn check_heads(&self, hidden: usize, heads: usize) -> Result<(), ZooError> {
        if hidden % heads != 0 {
            return Err(self.invalid(
                "hidden",
                format!("hidden={hidden} is not divisible by heads={heads}"),
            ));
        }
        Ok(())
    }
}

fn parse_gpt(keys: &Keys) -> Result<GptConfig, ZooError> {
    let hidden = keys.size("hidden")?;
    let heads = keys.size("heads")?;
    keys.check_heads(hidden, heads)?;
    Ok(GptConfig {
        layers: keys.layers()?,
        hidden,
        ffn: keys.size_opt("ffn")?.unwrap_or(4 * hidden),
        heads,
        vocab: keys.size("vocab")?,
        seq: keys.size("seq")?,
        batch: keys.size_opt("batch")?.unwrap_or(DEFAULT_BATCH),
        tied: keys.flag("tied", true)?,
        final_norm: keys.flag("final_norm", false)?,
        dtype: keys.dtype()?,
    })
}

fn parse_llama(keys: &Keys, moe: bool) -> Result<LlamaConfig, ZooError> {
    let hidden = keys.size("hidden")?;
    let heads = keys.size("heads")?;
    keys.check_heads(hidden, heads)?;
    let kv_heads = keys.size_opt("kv_heads")?.unwrap_or(heads);
    if heads % kv_heads != 0 {
        return Err(keys.invalid(
            "kv_heads",
            format!("heads={heads} is not divisible by kv_heads={kv_heads}"),
        ));
    }
    let head_dim = hidden / heads;
    if head_dim % 2 != 0 {
        return Err(keys.invalid(
            "hidden",
            format!("head dim hidden/heads = {head_dim} must be even for rotary embeddings"),
        ));
    }
    let moe = if moe {
        let experts = keys.size("experts")?;
        let top_k = keys.size_opt("top_k")?.unwrap_or(DEFAULT_TOP_K);
        if top_k > experts {
            return Err(keys.invalid("top_k", format!("top_k={top_k} exceeds experts={experts}")));
        }
        Some(MoeConfig { experts, top_k })
    } else {
        None
    };
    Ok(LlamaConfig {
        layers: keys.layers()?,
        hidden,
        ffn: keys.size("ffn")?,
        heads,
        kv_heads,
        vocab: keys.size("vocab")?,
        seq: keys.size("seq")?,
        batch: keys.size_opt("batch")?.unwrap_or(DEFAULT_BATCH),
        tied: keys.flag("tied", false)?,
        dtype: keys.dtype()?,
        moe,
    })
}

fn parse_bert(keys: &Keys) -> Result<BertConfig, ZooError> {
    let hidden = keys.size("hidden")?;
    let heads = keys.size("heads")?;
    keys.check_heads(hidden, heads)?;
    Ok(BertConfig {
        layers: keys.layers()?,
        hidden,
        ffn: keys.size_opt("ffn")?.unwrap_or(4 * hidden),
        heads,
        vocab: keys.size("vocab")?,
        seq: keys.size("seq")?,
        type_vocab: keys.size_opt("type_vocab")?.unwrap_or(DEFAULT_TYPE_VOCAB),
        batch: keys.size_opt("batch")?.unwrap_or(DEFAULT_BATCH),
        dtype: keys.dtype()?,
    })
}

impl FromStr for ModelSpec {
    type Err = ZooError;

    fn from_str(s: &str) -> Result<ModelSpec, ZooError> {
        let (family, body) = s.trim().split_once(':').unwrap_or((s.trim(), ""));
        match family.trim() {
            "gpt" => parse_gpt(&Keys::parse("gpt", GPT_KEYS, body)?).map(ModelSpec::Gpt),
            "llama" => parse_llama(&Keys::parse("llama", LLAMA_KEYS, body)?, false).map(ModelSpec::Llama),
            "moe" => parse_llama(&Keys::parse("moe", MOE_KEYS, body)?, true).map(ModelSpec::Llama),
            "bert" => parse_bert(&Keys::parse("bert", BERT_KEYS, body)?).map(ModelSpec::Bert),
            other => Err(ZooError::UnknownFamily { family: other.into() }),
        }
    }
}

/// Canonical `key=value` items: required keys always, optional keys only
/// when they differ from their default.
#[derive(Default)]
struct Items(Vec<(&'static str, String)>);

impl Items {
    fn put(&mut self, key: &'static str, value: impl fmt::Display) -> &mut Items {
        self.0.push((key, value.to_string()));
        self
    }

    fn put_if<T: fmt::Display + PartialEq>(&mut self, key: &'static str, value: T, default: T) -> &mut Items {
        if value != default {
            self.put(key, value);
        }
        self
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items = Items::default();
        match self {
            ModelSpec::Gpt(c) => {
                items
                    .put("layers", c.layers)
                    .put("hidden", c.hidden)
                    .put_if("ffn", c.ffn, 4 * c.hidden)
                    .put("heads", c.heads)
                    .put("vocab", c.vocab)
                    .put("seq", c.seq)
                    .put_if("batch", c.batch, DEFAULT_BATCH)
                    .put_if("tied", c.tied, true)
                    .put_if("final_norm", c.final_norm, false)
                    .put_if("dtype", c.dtype, DEFAULT_DTYPE);
            }
            ModelSpec::Llama(c) => {
                items
                    .put("layers", c.layers)
                    .put("hidden", c.hidden)
                    .put("ffn", c.ffn)
                    .put("heads", c.heads)
                    .put_if("kv_heads", c.kv_heads, c.heads);
                if let Some(m) = &c.moe {
                    items
                        .put("experts", m.experts)
                        .put_if("top_k", m.top_k, DEFAULT_TOP_K);
                }
                items
                    .put("vocab", c.vocab)
                    .put("seq", c.seq)
                    .put_if("batch", c.batch, DEFAULT_BATCH)
                    .put_if("tied", c.tied, false)
                    .put_if("dtype", c.dtype, DEFAULT_DTYPE);
            }
            ModelSpec::Bert(c) => {
                items
                    .put("layers", c.layers)
                    .put("hidden", c.hidden)
                    .put_if("ffn", c.ffn, 4 * c.hidden)
                    .put("heads", c.heads)
                    .put("vocab", c.vocab)
                    .put("seq", c.seq)
                    .put_if("type_vocab", c.type_vocab, DEFAULT_TYPE_VOCAB)
                    .put_if("batch", c.batch, DEFAULT_BATCH)
                    .put_if("dtype", c.dtype, DEFAULT_DTYPE);
            }
        }
        write!(f, "{}:", self.family())?;
        for (i, (key, value)) in items.0.iter().enumerate() {
            let sep = if i > 0 { "," } else { "" };
            write!(f, "{sep}{key}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ModelSpec, ZooError> {
        s.parse()
    }

    #[test]
    fn gpt_defaults_fill_ffn_batch_tied_and_final_norm() {
        let spec = parse("gpt:layers=24,hidden=2304,heads=24,vocab=51200,seq=2048").unwrap();
        let ModelSpec::Gpt(c) = &spec else {
            panic!("not gpt: {spec:?}")
        };
        assert_eq!(
            (c.ffn, c.batch, c.tied, c.final_norm, c.dtype),
            (9216, 1, true, false, DType::F32)
        );
        assert_eq!(
            spec.to_string(),
            "gpt:layers=24,hidden=2304,heads=24,vocab=51200,seq=2048"
        );
    }

    #[test]
    fn llama_kv_heads_defaults_to_heads() {
        let spec = parse("llama:layers=2,hidden=64,ffn=128,heads=4,vocab=100,seq=16").unwrap();
        let ModelSpec::Llama(c) = &spec else {
            panic!("not llama: {spec:?}")
        };
        assert_eq!((c.kv_heads, c.tied, c.moe.clone()), (4, false, None));
    }

    #[test]
    fn canonical_strings_round_trip() {
        for s in [
            "gpt:layers=24,hidden=2304,heads=24,vocab=51200,seq=2048",
            "gpt:layers=2,hidden=64,ffn=100,heads=4,vocab=10,seq=8,batch=3,tied=false,final_norm=true,dtype=bf16",
            "llama:layers=126,hidden=16384,ffn=53248,heads=128,kv_heads=8,vocab=128000,seq=8192",
            "moe:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,experts=8,vocab=32000,seq=4096",
            "moe:layers=2,hidden=64,ffn=96,heads=4,experts=4,top_k=1,vocab=10,seq=8,tied=true",
            "bert:layers=12,hidden=768,heads=12,vocab=30522,seq=512",
            "bert:layers=1,hidden=8,ffn=16,heads=2,vocab=5,seq=4,type_vocab=1,batch=2,dtype=f16",
        ] {
            let spec = parse(s).unwrap();
            assert_eq!(spec.to_string(), s);
            assert_eq!(parse(&spec.to_string()).unwrap(), spec);
        }
    }

    #[test]
    fn keys_at_their_default_are_dropped_from_the_canonical_form() {
        let spec = parse("moe:seq=4096, top_k=2,layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=32,experts=8,vocab=32000,batch=1")
            .unwrap();
        assert_eq!(
            spec.to_string(),
            "moe:layers=32,hidden=4096,ffn=14336,heads=32,experts=8,vocab=32000,seq=4096"
        );
    }

    /// Each malformed spec → the error variant and the key it names.
    #[test]
    fn errors_name_the_key() {
        let cases: &[(&str, &str)] = &[
            ("gpx:layers=1", "unknown model family 'gpx'"),
            ("gpt:layers=1,colour=red", "gpt: unknown key 'colour'"),
            ("llama:layers=1,experts=8", "llama: unknown key 'experts'"),
            (
                "gpt:layers=2,hidden=64,heads=4,vocab=10",
                "gpt: missing required key 'seq'",
            ),
            ("gpt", "gpt: missing required key 'hidden'"),
            (
                "gpt:layers=2,hidden=6x4,heads=4,vocab=10,seq=8",
                "gpt: key 'hidden': '6x4' is not a positive integer",
            ),
            (
                "gpt:layers=0,hidden=64,heads=4,vocab=10,seq=8",
                "gpt: key 'layers': '0' is not a positive integer of at most 2^32",
            ),
            (
                "gpt:layers=2,hidden=64,heads=4,vocab=10,seq=8,tied=yes",
                "gpt: key 'tied': 'yes' is not true or false",
            ),
            (
                "gpt:layers=2,hidden=64,heads=4,vocab=10,seq=8,dtype=i8",
                "gpt: key 'dtype': 'i8' is not one of",
            ),
            (
                "gpt:layers=2,hidden=64,heads=5,vocab=10,seq=8",
                "gpt: key 'hidden': hidden=64 is not divisible by heads=5",
            ),
            (
                "llama:layers=2,hidden=64,ffn=8,heads=4,kv_heads=3,vocab=10,seq=8",
                "llama: key 'kv_heads': heads=4 is not divisible by kv_heads=3",
            ),
            (
                "llama:layers=2,hidden=12,ffn=8,heads=4,vocab=10,seq=8",
                "llama: key 'hidden': head dim hidden/heads = 3 must be even",
            ),
            (
                "moe:layers=2,hidden=64,ffn=8,heads=4,experts=2,top_k=3,vocab=10,seq=8",
                "moe: key 'top_k': top_k=3 exceeds experts=2",
            ),
            (
                "moe:layers=2,hidden=64,ffn=8,heads=4,vocab=10,seq=8",
                "moe: missing required key 'experts'",
            ),
            (
                "gpt:layers=100000,hidden=512,heads=8,vocab=8192,seq=256",
                "gpt: key 'layers': layers=100000 is above the limit of 1024 layers (MAX_LAYERS)",
            ),
            ("bert:layers=2,layers=3", "bert: key 'layers' given twice"),
            ("bert:layers=2,,hidden=4", "bert: item '' is not key=value"),
        ];
        for (spec, want) in cases {
            let err = parse(spec).expect_err(spec).to_string();
            assert!(err.starts_with(want), "{spec}: got '{err}', want '{want}...'");
        }
    }
}
