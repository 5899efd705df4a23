//! `autopar estimate` against Megatron-LM's published weak-scaling runs
//! (Narayanan et al., SC'21, Table 1; `fixtures/megatron_sc21_table1.json`):
//! every row within ±10 % of the published step time and a mean absolute
//! error of at most 5 %, with one cluster preset and the default
//! calibration for all rows. The published configuration is
//! `autopar_cost_models::published` (unfused attention, dropout, full
//! recomputation, interleaved 1F1B where there is a pipeline, micro-batch 1).

use autopar::estimate::{run, Request};
use autopar_cost_models::published::{self, PublishedRun};

/// The CLI request for a published run.
fn published_request(r: &PublishedRun) -> Request {
    let cfg = r.config();
    Request {
        model: r.model_spec(),
        cluster: r.setting.cluster.clone(),
        gpus: r.gpus,
        tp: cfg.tp,
        pp: cfg.pp,
        dp: Some(cfg.dp),
        virtual_stages: Some(cfg.virtual_stages),
        layers_per_chunk: None,
        sp: cfg.sp,
        cp: cfg.cp,
        ep: cfg.ep,
        zero: cfg.zero,
        global_batch: cfg.global_batch,
        micro_batch: Some(cfg.micro_batch),
        seq: None,
        recompute: cfg.recompute,
        schedule: cfg.schedule,
        attention: cfg.attention,
        dropout: cfg.dropout,
        moe_capacity_factor: cfg.moe_capacity_factor,
        objective: None,
        overlap_grad_reduce: cfg.overlap_grad_reduce,
        grad_bucket_mib: cfg.grad_reduce.bucket_mib,
        tp_comm_overlap: cfg.tp_comm_overlap,
        overlap_param_gather: cfg.overlap_param_gather,
        f32_main_grads: cfg.grad_reduce.f32_main_grads,
        f32_cross_entropy: cfg.f32_cross_entropy,
        grad_compression: cfg.grad_reduce.compression,
        mesh_order: cfg.mesh_order,
        calibration: None,
    }
}

#[test]
fn every_published_run_within_ten_percent() {
    let mut errors = Vec::new();
    println!("row  params  gpus  tp  pp  predicted_s  published_s   error  fits");
    for (i, r) in published::megatron_sc21().iter().enumerate() {
        let report = run(&published_request(r)).unwrap();
        let (predicted, published) = (report.estimate.step_time_s, r.step_time_s());
        let err = (predicted - published) / published;
        println!(
            "{:>3}  {:>5.1}B  {:>4}  {:>2}  {:>2}  {:>11.3}  {:>11.3}  {:>+5.1}%  {}",
            i + 1,
            report.parameters / 1e9,
            r.gpus,
            r.tp,
            r.pp,
            predicted,
            published,
            100.0 * err,
            report.estimate.fits
        );
        // Megatron ran every one of these configurations.
        assert!(report.estimate.fits, "row {} does not fit", i + 1);
        errors.push(err);
    }
    assert_eq!(errors.len(), 10);
    let mean = errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
    println!("mean absolute error {:.1}%", 100.0 * mean);
    assert!(errors.iter().all(|e| e.abs() <= 0.10), "{errors:?}");
    assert!(mean <= 0.05, "mean {mean}");
}

/// Megatron-Core's H100 model table (`fixtures/megatron_core_h100.json`)
/// as its authors ran it: the same request path, their overlaps, f32
/// gradients and f32 cross-entropy priced, within the aim of a mean of 5 %
/// and a largest error of 10 % (it gives 4.0 % and 9.0 %).
#[test]
fn the_h100_table_as_run_stays_near_its_published_steps() {
    let mut errors = Vec::new();
    for (i, r) in published::megatron_core_h100().iter().enumerate() {
        let report = run(&published_request(r)).unwrap();
        let err = report.estimate.step_time_s / r.step_time_s() - 1.0;
        println!("row {} error {:+.1}%", i + 1, 100.0 * err);
        assert!(report.estimate.fits, "row {} does not fit", i + 1);
        errors.push(err);
    }
    assert_eq!(errors.len(), 9);
    let mean = errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
    assert!(errors.iter().all(|e| e.abs() <= 0.10), "{errors:?}");
    assert!(mean <= 0.05, "mean {mean}");
}

/// Each published run written as the Megatron-LM arguments it ran with
/// reads back (`estimate --from megatron`) as the same configuration: the
/// same estimate as the published request.
#[test]
fn each_published_run_reads_back_from_its_megatron_arguments() {
    let dir = tempfile::tempdir().unwrap();
    for (i, r) in published::megatron_sc21().iter().enumerate() {
        let cfg = r.config();
        let mut args = vec![
            format!("--tensor-model-parallel-size {}", cfg.tp),
            format!("--pipeline-model-parallel-size {}", cfg.pp),
            format!("--micro-batch-size {}", cfg.micro_batch),
            format!("--global-batch-size {}", cfg.global_batch),
            format!(
                "--ddp-bucket-size {}",
                u64::from(cfg.grad_reduce.bucket_mib) << 20
            ),
            format!(
                "--attention-backend {}",
                match cfg.attention {
                    autopar_cost_models::AttentionKernel::Fused => "flash",
                    autopar_cost_models::AttentionKernel::Unfused => "unfused",
                }
            ),
        ];
        if cfg.virtual_stages > 1 {
            args.push(format!(
                "--num-layers-per-virtual-pipeline-stage {}",
                r.layers / (cfg.pp * cfg.virtual_stages)
            ));
        }
        let switches = [
            (cfg.sp, "--sequence-parallel"),
            (cfg.zero >= 1, "--use-distributed-optimizer"),
            (cfg.overlap_grad_reduce, "--overlap-grad-reduce"),
            (cfg.overlap_param_gather, "--overlap-param-gather"),
            (cfg.tp_comm_overlap, "--tp-comm-overlap"),
            (
                cfg.grad_reduce.f32_main_grads,
                "--accumulate-allreduce-grads-in-fp32",
            ),
        ];
        args.extend(switches.iter().filter(|(on, _)| *on).map(|(_, f)| f.to_string()));
        match cfg.recompute {
            autopar_cost_models::Recompute::Full => args.push("--recompute-granularity full".into()),
            autopar_cost_models::Recompute::Selective => {
                args.push("--recompute-granularity selective".into())
            }
            autopar_cost_models::Recompute::None => {}
        }
        if !cfg.dropout {
            args.push("--attention-dropout 0.0 --hidden-dropout 0.0".into());
        }
        let file = dir.path().join(format!("row{i}.sh"));
        std::fs::write(&file, args.join(" \\\n")).unwrap();
        let settings = autopar::export::read(autopar::export::Tool::Megatron, &file).unwrap();
        // Only the model, cluster, GPUs and the loss's precision come from
        // outside the file; every setting it holds starts elsewhere.
        let blank = Request {
            tp: 1,
            pp: 1,
            dp: None,
            virtual_stages: None,
            sp: false,
            zero: 0,
            global_batch: 1,
            micro_batch: None,
            recompute: autopar_cost_models::Recompute::None,
            schedule: autopar_cost_models::Schedule::OneFOneB,
            attention: autopar_cost_models::AttentionKernel::Fused,
            dropout: false,
            overlap_grad_reduce: false,
            grad_bucket_mib: 1,
            tp_comm_overlap: false,
            overlap_param_gather: false,
            f32_main_grads: false,
            ..published_request(r)
        };
        let read = run(&blank.with(&settings)).unwrap();
        let want = run(&published_request(r)).unwrap();
        let (a, b) = (read.estimate.step_time_s, want.estimate.step_time_s);
        assert!((a - b).abs() <= 1e-9 * b, "row {i}: {a} vs {b}");
    }
}
