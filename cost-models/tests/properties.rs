//! Properties of the cost models over random GPT configurations.

use autopar_cost_models::comm::{bytes_sent, Algorithm, Collective};
use autopar_cost_models::memory::layer_activations;
use autopar_cost_models::{
    estimate, AttentionKernel, Calibration, Cluster, Estimate, Recompute, Schedule, Sharding, TrainingConfig,
    Workload, WorkloadOptions,
};
use proptest::prelude::*;

/// A small GPT and a configuration for it on up to 64 GPUs.
#[derive(Debug, Clone)]
struct Case {
    layers: usize,
    heads: usize,
    head_dim: usize,
    seq: usize,
    tp: usize,
    pp: usize,
    dp: usize,
    micro_batch: usize,
    micro_batches: usize,
    sp: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        2usize..=8,
        prop::sample::select(vec![4usize, 8, 16]),
        prop::sample::select(vec![16usize, 32, 64]),
        prop::sample::select(vec![64usize, 256]),
        prop::sample::select(vec![1usize, 2, 4]),
        prop::sample::select(vec![1usize, 2]),
        prop::sample::select(vec![1usize, 2, 4, 8]),
        1usize..=2,
        1usize..=4,
        any::<bool>(),
    )
        .prop_map(
            |(layers, heads, head_dim, seq, tp, pp, dp, micro_batch, micro_batches, sp)| Case {
                layers,
                heads,
                head_dim,
                seq,
                tp,
                pp,
                dp,
                micro_batch,
                micro_batches,
                sp,
            },
        )
}

fn workload(c: &Case, attention: AttentionKernel) -> Workload {
    let spec: autopar_import::ModelSpec = format!(
        "gpt:layers={},hidden={},heads={},vocab=512,seq={},dtype=bf16",
        c.layers,
        c.heads * c.head_dim,
        c.heads,
        c.seq
    )
    .parse()
    .unwrap();
    let opts = WorkloadOptions {
        micro_batch: Some(c.micro_batch),
        seq: None,
        sharding: Sharding {
            tp: c.tp,
            sp: c.sp,
            cp: 1,
            ep: 1,
        },
        attention,
        dropout: true,
        moe_capacity_factor: None,
        loss: Default::default(),
    };
    Workload::build(&spec.build().unwrap(), &opts).unwrap()
}

fn run(c: &Case, w: &Workload, zero: u8, recompute: Recompute) -> Estimate {
    let gpus = c.dp * c.tp * c.pp;
    let cluster = Cluster::preset("dgx-a100-80g").unwrap().with_gpus(gpus).unwrap();
    let cfg = TrainingConfig {
        dp: c.dp,
        tp: c.tp,
        pp: c.pp,
        virtual_stages: 1,
        sp: c.sp,
        cp: 1,
        ep: 1,
        zero,
        recompute,
        schedule: Schedule::OneFOneB,
        micro_batch: c.micro_batch,
        global_batch: c.dp * c.micro_batch * c.micro_batches,
        seq: None,
        attention: AttentionKernel::Unfused,
        dropout: true,
        overlap_grad_reduce: false,
        ..TrainingConfig::default()
    };
    estimate(w, &cluster, &Calibration::default(), &cfg).unwrap()
}

/// The bytes a GPU sends with no data parallelism to speak of: everything
/// but the gradient reduction (ZeRO-0 with its reduction taken out).
fn run_tp_only(c: &Case, w: &Workload) -> f64 {
    let single = Case { dp: 1, ..*c };
    run(&single, w, 0, Recompute::None).comm_bytes_per_gpu
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn more_ranks_in_a_ring_never_send_less(n in 1usize..512, bytes in 1.0f64..1e10) {
        for c in [Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::AllToAll] {
            let fewer = bytes_sent(c, Algorithm::Ring, n, bytes).unwrap()[0];
            let more = bytes_sent(c, Algorithm::Ring, n + 1, bytes).unwrap()[0];
            prop_assert!(more >= fewer, "{c:?}: {n} ranks send {fewer}, {} send {more}", n + 1);
        }
    }

    #[test]
    fn each_zero_stage_needs_no_more_memory_than_the_last(c in cases()) {
        let w = workload(&c, AttentionKernel::Unfused);
        let memory: Vec<f64> = (0..=3).map(|z| run(&c, &w, z, Recompute::None).memory_per_gpu_bytes).collect();
        prop_assert!(memory.windows(2).all(|m| m[1] <= m[0]), "{memory:?}");
        if c.dp > 1 {
            prop_assert!(memory[3] < memory[0], "{memory:?}");
        }
    }

    #[test]
    fn recomputing_more_stores_less_and_takes_longer(c in cases()) {
        let w = workload(&c, AttentionKernel::Unfused);
        let stored = [Recompute::None, Recompute::Selective, Recompute::Full].map(|r| layer_activations(&w, r, c.sp, c.tp));
        prop_assert!(stored[2] < stored[1] && stored[1] < stored[0], "{stored:?}");
        let [none, selective, full] = [Recompute::None, Recompute::Selective, Recompute::Full].map(|r| run(&c, &w, 0, r));
        // At the peak the layer in its backward pass holds what it recomputed.
        prop_assert!(selective.memory.activations <= none.memory.activations);
        prop_assert!(none.step_time_s < selective.step_time_s);
        prop_assert!(selective.step_time_s < full.step_time_s);
    }

    #[test]
    fn each_zero_stage_sends_no_less_than_the_last(c in cases()) {
        let w = workload(&c, AttentionKernel::Fused);
        let sent: Vec<f64> = (0..=3).map(|z| run(&c, &w, z, Recompute::None).comm_bytes_per_gpu).collect();
        prop_assert!(sent.windows(2).all(|s| s[1] >= s[0] * (1.0 - 1e-12)), "{sent:?}");
        if c.dp > 1 {
            // ZeRO-3 gathers twice and reduce-scatters once per micro-batch:
            // at least one and a half all-reduces' worth.
            prop_assert!(sent[3] - sent[0] >= 0.5 * (sent[0] - run_tp_only(&c, &w)) - 1e-6, "{sent:?}");
        }
    }

    #[test]
    fn zero_3_cannot_hide_its_first_gather_nor_zero_1_its_refresh(c in cases()) {
        let w = workload(&c, AttentionKernel::Fused);
        if c.dp > 1 {
            for zero in [1, 2, 3] {
                let e = run(&c, &w, zero, Recompute::None);
                prop_assert!(e.breakdown.dp_comm_s > 0.0, "ZeRO-{zero}: {:?}", e.breakdown);
            }
        }
    }

    #[test]
    fn the_breakdown_adds_up_to_the_step(c in cases(), zero in 0u8..=3) {
        let w = workload(&c, AttentionKernel::Fused);
        let e = run(&c, &w, zero, Recompute::None);
        let b = e.breakdown;
        let sum = b.compute_s + b.tp_comm_s + b.cp_comm_s + b.ep_comm_s + b.dp_comm_s + b.bubble_s + b.p2p_s + b.optimizer_s;
        prop_assert!((sum - e.step_time_s).abs() <= 1e-9 * e.step_time_s, "{sum} vs {}", e.step_time_s);
        prop_assert!(b.bubble_s >= -1e-12, "{b:?}");
        prop_assert!(e.mfu > 0.0 && e.mfu < 1.0 && e.hfu > 0.0 && e.hfu < 1.0, "{e:?}");
        let m = e.memory;
        let parts = m.weights + m.gradients + m.optimizer + m.activations + m.communication;
        prop_assert!((parts - e.memory_per_gpu_bytes).abs() <= 1e-6 * parts);
    }
}
