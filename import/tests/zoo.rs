//! Model zoo: parameter counts against published closed forms and model
//! cards, one block per layer, symbolic dims, weightless parameters, and
//! graphs that pass `validate()`.

use autopar_import::{zoo, ModelSpec};
use autopar_ir::{Graph, Role};
use std::time::Instant;

const TABLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/megatron_sc21_table1.json"
);
/// From the fixture's `settings` text: "sequence length 2048, vocabulary 51200".
const SEQ: u64 = 2048;
const VOCAB: u64 = 51200;

fn build(spec: &str) -> Graph {
    zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn params(g: &Graph) -> u64 {
    g.float_parameter_elements(&g.bindings)
}

/// (layers, hidden, heads, params_b) of each row of Table 1.
fn megatron_rows() -> Vec<(u64, u64, u64, f64)> {
    let text = std::fs::read_to_string(TABLE).expect("fixture table");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("fixture json");
    let field = |row: &serde_json::Value, key: &str| {
        row[key]
            .as_f64()
            .unwrap_or_else(|| panic!("row lacks {key}: {row}"))
    };
    doc["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            (
                field(row, "layers") as u64,
                field(row, "hidden") as u64,
                field(row, "heads") as u64,
                field(row, "params_b"),
            )
        })
        .collect()
}

fn gpt_spec(l: u64, h: u64, heads: u64) -> String {
    format!("gpt:layers={l},hidden={h},heads={heads},vocab={VOCAB},seq={SEQ}")
}

#[test]
fn gpt_parameter_count_is_megatrons_closed_form_for_every_table_row() {
    let rows = megatron_rows();
    assert_eq!(rows.len(), 10);
    for (l, h, heads, params_b) in rows {
        let g = build(&gpt_spec(l, h, heads));
        let exact = l * (12 * h * h + 13 * h) + VOCAB * h + SEQ * h;
        assert_eq!(params(&g), exact, "layers={l} hidden={h}");
        let (lf, hf, v, s) = (l as f64, h as f64, VOCAB as f64, SEQ as f64);
        let closed = 12.0 * lf * hf * hf * (1.0 + 13.0 / (12.0 * hf) + (v + s) / (12.0 * lf * hf));
        assert!(
            (closed - exact as f64).abs() / closed < 1e-12,
            "closed form {closed} vs {exact}"
        );
        let billions = exact as f64 / 1e9;
        assert!(
            (billions - params_b).abs() / params_b < 0.03,
            "{billions}B vs published {params_b}B"
        );
    }
}

#[test]
fn gpt_final_norm_and_untied_head_add_their_parameters() {
    let base = "gpt:layers=2,hidden=64,heads=4,vocab=100,seq=16";
    let plain = params(&build(base));
    assert_eq!(params(&build(&format!("{base},final_norm=true"))), plain + 2 * 64);
    assert_eq!(params(&build(&format!("{base},tied=false"))), plain + 100 * 64);
}

#[test]
fn gpt2_small_with_final_norm_has_hf_gpt2_count() {
    // HF `gpt2`: 124,439,808 parameters (tied head, final ln_f).
    let g = build("gpt:layers=12,hidden=768,heads=12,vocab=50257,seq=1024,final_norm=true");
    assert_eq!(params(&g), 124_439_808);
}

#[test]
fn llama_7b_shape_has_6_738_415_616_parameters() {
    // 32 · (4·4096² attention + 3·4096·11008 SwiGLU + 2·4096 norms)
    // + 2 · 32000·4096 (untied embedding and head) + 4096 final norm.
    let g = build("llama:layers=32,hidden=4096,ffn=11008,heads=32,vocab=32000,seq=4096");
    assert_eq!(params(&g), 6_738_415_616);
}

#[test]
fn mixtral_8x7b_shape_has_46_702_792_704_parameters() {
    // 32 · (4096·(4096+1024+1024+4096) attention + 8·3·4096·14336 experts
    // + 4096·8 router + 2·4096 norms) + 2 · 32000·4096 + 4096.
    let g = build(
        "moe:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,experts=8,top_k=2,vocab=32000,seq=4096",
    );
    assert_eq!(params(&g), 46_702_792_704);
}

#[test]
fn bert_base_has_hf_bertmodel_count_without_pooler() {
    // HF bert-base-uncased: 109,482,240 including the 768·768+768 pooler.
    let g = build("bert:layers=12,hidden=768,heads=12,ffn=3072,vocab=30522,seq=512");
    assert_eq!(params(&g), 109_482_240 - (768 * 768 + 768));
}

const EXAMPLES: &[(&str, &str)] = &[
    (
        "gpt:layers=3,hidden=64,heads=4,vocab=100,seq=16,final_norm=true",
        "h.",
    ),
    (
        "llama:layers=3,hidden=64,ffn=96,heads=4,kv_heads=2,vocab=100,seq=16",
        "layers.",
    ),
    (
        "moe:layers=3,hidden=64,ffn=96,heads=4,kv_heads=2,experts=4,top_k=2,vocab=100,seq=16,tied=true",
        "layers.",
    ),
    (
        "bert:layers=3,hidden=64,heads=4,vocab=100,seq=16,batch=2",
        "encoder.layer.",
    ),
];

#[test]
fn one_block_per_layer_with_the_layer_prefix() {
    for (spec, prefix) in EXAMPLES {
        let g = build(spec);
        assert_eq!(g.blocks.len(), 3, "{spec}");
        for (i, block) in g.blocks.iter().enumerate() {
            assert_eq!(block.nodes.len(), g.blocks[0].nodes.len(), "{spec}: block {i}");
            let layer = format!("{prefix}{i}.");
            assert!(
                block.nodes.iter().all(|n| n.starts_with(&layer)),
                "{spec}: {:?}",
                block.nodes
            );
        }
    }
}

#[test]
fn dims_are_symbolic_and_bound_by_default_and_weights_absent() {
    for (spec, _) in EXAMPLES {
        let g = build(spec);
        let batch = if spec.contains("batch=2") { 2 } else { 1 };
        assert_eq!(
            g.bindings,
            [("batch".to_string(), batch), ("seq".to_string(), 16)].into()
        );
        let out = g.tensor(g.outputs[0]).ty.shape.to_string();
        let width = if spec.starts_with("bert") { 64 } else { 100 };
        assert_eq!(out, format!("[batch, seq, {width}]"), "{spec}");
        for (_, t) in g.tensors() {
            if t.role == Role::Parameter {
                assert!(t.data.is_none(), "{spec}: {} is materialised", t.name);
            }
        }
        assert_eq!(g.name, spec.parse::<ModelSpec>().unwrap().to_string());
    }
}

#[test]
fn every_zoo_graph_validates() {
    for (spec, _) in EXAMPLES {
        build(spec).validate().unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
}

#[test]
fn published_sizes_validate() {
    for spec in [
        "gpt:layers=24,hidden=2304,heads=24,vocab=51200,seq=2048",
        "llama:layers=126,hidden=16384,ffn=53248,heads=128,kv_heads=8,vocab=128000,seq=8192",
        "moe:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,experts=8,top_k=2,vocab=32000,seq=4096",
        "bert:layers=12,hidden=768,heads=12,ffn=3072,vocab=30522,seq=512",
    ] {
        build(spec).validate().unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
}

/// The largest Table 1 row (1T parameters) builds without weights; the time
/// is printed (`cargo test -- --nocapture`), not asserted.
#[test]
fn trillion_parameter_row_builds_quickly() {
    let spec = gpt_spec(128, 25600, 160);
    let start = Instant::now();
    let g = build(&spec);
    let elapsed = start.elapsed();
    println!(
        "built {spec}: {} nodes, {} params in {elapsed:?}",
        g.node_count(),
        params(&g)
    );
    assert_eq!(g.blocks.len(), 128);
    assert_eq!(params(&g), 1_008_038_707_200);
}

#[test]
fn bad_specs_are_errors_naming_the_key() {
    let err = zoo::build("gpt:layers=2,hidden=64,heads=4,vocab=10").unwrap_err();
    assert_eq!(err.to_string(), "gpt: missing required key 'seq'");
    let err = zoo::build("llama:layers=2,hidden=64,ffn=8,heads=4,kv_heads=3,vocab=10,seq=8").unwrap_err();
    assert_eq!(
        err.to_string(),
        "llama: key 'kv_heads': heads=4 is not divisible by kv_heads=3"
    );
}

#[test]
fn zoo_graphs_round_trip_through_json() {
    for (spec, _) in EXAMPLES {
        let g = build(spec);
        let back = autopar_ir::json::from_json(&autopar_ir::json::to_json(&g))
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        back.validate().unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(
            (params(&back), &back.blocks, &back.bindings),
            (params(&g), &g.blocks, &g.bindings),
            "{spec}"
        );
    }
}
