//! What the exporter recorded about where an initializer came from. The
//! dynamo exporter tags every module state it keeps with its kind (a
//! parameter, or a buffer that PyTorch does not train) and every constant
//! its optimizer folded with the values it was folded from. Where that
//! record exists it is the truth: a buffer is not trained even if its data
//! looks like a weight, and a folded attention mask is not trained even
//! though it is a float initializer. Without it (the legacy exporter,
//! hand-written graphs) initializers are judged by their data
//! ([`super::buffers`], [`super::ties`]).

use std::collections::HashMap;

use super::proto::GraphProto;

/// The key under which the dynamo exporter records a kept state's kind.
const KIND: &str = "pkg.torch.export.graph_signature.InputSpec.kind";
/// The key under which the exporter's optimizer records a folded constant's sources.
const FOLDED_FROM: &str = "pkg.onnxscript.optimizer.folded_from";

/// Where an initializer came from, as far as the file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// Nothing recorded.
    Unknown,
    /// A module parameter.
    Parameter,
    /// A module buffer or a constant tensor of the program: not trained.
    Buffer,
    /// Folded from module state: some of a parameter's values, maybe in
    /// another layout (a transposed weight, gathered position rows), so it
    /// trains; the state itself may be gone from the file.
    FoldedFromState,
    /// Folded from shape arithmetic alone (masks, position ids): a constant.
    FoldedFromShapes,
}

/// The recorded origin of each initializer that has one, by name.
pub(super) fn origins(proto: &GraphProto) -> HashMap<&str, Origin> {
    let props = |key: &'static str| {
        proto
            .value_info
            .iter()
            .chain(&proto.input)
            .flat_map(|vi| vi.metadata_props.iter().map(move |p| (vi, p)))
            .filter(move |(_, p)| p.key == key)
            .map(|(vi, p)| (vi.name.as_str(), p.value.as_str()))
    };
    let mut origins: HashMap<&str, Origin> = props(KIND)
        .map(|(name, kind)| {
            let origin = if kind == "PARAMETER" {
                Origin::Parameter
            } else if kind == "BUFFER" || kind == "CONSTANT_TENSOR" {
                Origin::Buffer
            } else {
                Origin::Unknown
            };
            (name, origin)
        })
        .collect();
    let kept_state: Vec<&str> = origins.keys().copied().collect();
    for (name, sources) in props(FOLDED_FROM) {
        let from_state = list_items(sources).any(|s| names_state(s, &kept_state));
        let origin = if from_state {
            Origin::FoldedFromState
        } else {
            Origin::FoldedFromShapes
        };
        origins.entry(name).or_insert(origin);
    }
    origins
}

/// Whether a folded constant's source is module state: a state the file
/// still tags, or a state's qualified name (`encoder.embed.weight`). The
/// exporter names every other value after its operator (`add_3`,
/// `arange`, `val_12`), and those names hold no dot.
fn names_state(source: &str, kept_state: &[&str]) -> bool {
    source.contains('.') || kept_state.contains(&source)
}

/// The items of the Python list literal the exporter writes
/// (`['add', 'm.embed.weight']`).
fn list_items(list: &str) -> impl Iterator<Item = &str> {
    list.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|item| item.trim().trim_matches(|c| c == '\'' || c == '"'))
        .filter(|item| !item.is_empty())
}

#[cfg(test)]
mod tests {
    use super::super::proto::{StringStringEntryProto, ValueInfoProto};
    use super::*;

    fn tagged(name: &str, key: &str, value: &str) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            metadata_props: vec![StringStringEntryProto {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn kinds_and_folded_sources_give_the_origin() {
        let proto = GraphProto {
            value_info: vec![
                tagged("m.lm_head.weight", KIND, "PARAMETER"),
                tagged("m.final_logits_bias", KIND, "BUFFER"),
                tagged("scale", KIND, "PARAMETER"),
                tagged(
                    "embedding_1",
                    FOLDED_FROM,
                    "['add', 'm.embed_positions.weight', 'val_1']",
                ),
                tagged("val_47", FOLDED_FROM, "['scale']"),
                tagged("where_1", FOLDED_FROM, "['add_11', 'arange_8', 'val_128']"),
                tagged("x", KIND, "USER_INPUT"),
            ],
            ..Default::default()
        };
        let o = origins(&proto);
        assert_eq!(o["m.lm_head.weight"], Origin::Parameter);
        assert_eq!(o["m.final_logits_bias"], Origin::Buffer);
        assert_eq!(o["embedding_1"], Origin::FoldedFromState);
        assert_eq!(o["val_47"], Origin::FoldedFromState);
        assert_eq!(o["where_1"], Origin::FoldedFromShapes);
        assert_eq!(o["x"], Origin::Unknown);
        assert!(!o.contains_key("other"));
    }
}
