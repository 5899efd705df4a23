//! The memory model's per-layer activations, derived from the IR's tensors,
//! against the closed forms of Korthikanti et al. 2022 ("Reducing Activation
//! Recomputation in Large Transformer Models", Table 2) for a GPT layer in
//! 16-bit precision with dropout and unfused attention.

use autopar_cost_models::memory::layer_activations;
use autopar_cost_models::{AttentionKernel, Recompute, Sharding, Workload, WorkloadOptions};
use autopar_import::ModelSpec;

const S: f64 = 512.0;
const B: f64 = 2.0;
const H: f64 = 1024.0;
const A: f64 = 16.0;

fn workload(tp: usize, sp: bool, attention: AttentionKernel) -> Workload {
    let spec: ModelSpec = "gpt:layers=3,hidden=1024,heads=16,vocab=1000,seq=512,dtype=bf16"
        .parse()
        .unwrap();
    let graph = spec.build().unwrap();
    let opts = WorkloadOptions {
        micro_batch: Some(B as usize),
        seq: None,
        sharding: Sharding { tp, sp, cp: 1, ep: 1 },
        attention,
        dropout: true,
        moe_capacity_factor: None,
        loss: Default::default(),
    };
    Workload::build(&graph, &opts).unwrap()
}

fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want, "got {got}, want {want}");
}

#[test]
fn no_parallelism_stores_34sbh_plus_5as2b() {
    let w = workload(1, false, AttentionKernel::Unfused);
    let sbh = S * B * H;
    assert_close(
        layer_activations(&w, Recompute::None, false, 1),
        sbh * (34.0 + 5.0 * A * S / H),
    );
}

#[test]
fn tensor_parallel_splits_all_but_10sbh() {
    for t in [2usize, 4, 8] {
        let tf = t as f64;
        let w = workload(t, false, AttentionKernel::Unfused);
        let want = S * B * H * (10.0 + 24.0 / tf + 5.0 * A * S / (H * tf));
        assert_close(layer_activations(&w, Recompute::None, false, t), want);
    }
}

/// Sequence parallelism splits everything: Korthikanti's `34sbh/t`. The
/// inputs of the two column-parallel products are gathered along the
/// sequence for the product and gathered again for its backward pass, so
/// the rank keeps its slice, as Megatron-LM does.
#[test]
fn sequence_parallel_splits_everything() {
    let t = 4.0;
    let w = workload(4, true, AttentionKernel::Unfused);
    let want = S * B * H * 34.0 / t + 5.0 * A * S * S * B / t;
    assert_close(layer_activations(&w, Recompute::None, true, 4), want);
}

#[test]
fn selective_recomputation_drops_the_attention_scores() {
    let t = 4.0;
    let w = workload(4, true, AttentionKernel::Unfused);
    assert_close(
        layer_activations(&w, Recompute::Selective, true, 4),
        S * B * H * 34.0 / t,
    );
    let w = workload(4, false, AttentionKernel::Unfused);
    assert_close(
        layer_activations(&w, Recompute::Selective, false, 4),
        S * B * H * (10.0 + 24.0 / t),
    );
}

#[test]
fn full_recomputation_keeps_the_layer_input() {
    let w = workload(4, false, AttentionKernel::Unfused);
    assert_close(layer_activations(&w, Recompute::Full, false, 4), 2.0 * S * B * H);
    let w = workload(4, true, AttentionKernel::Unfused);
    assert_close(
        layer_activations(&w, Recompute::Full, true, 4),
        2.0 * S * B * H / 4.0,
    );
}

#[test]
fn fused_attention_keeps_no_score_matrix() {
    let unfused = workload(1, false, AttentionKernel::Unfused);
    let fused = workload(1, false, AttentionKernel::Fused);
    let sbh = S * B * H;
    // q, k, v and nothing else of the attention (its fused adjoint reads
    // them and recomputes the probabilities): 34sbh, the mask already
    // counted there.
    let want = sbh * 34.0;
    assert_close(layer_activations(&fused, Recompute::None, false, 1), want);
    assert!(fused.layer.saved_bytes < unfused.layer.saved_bytes);
}
