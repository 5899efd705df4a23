//! `autopar export`: a plan as Megatron-LM arguments, a torchtitan job TOML
//! and a DeepSpeed config, each holding the plan's degrees and batch sizes,
//! and what a target cannot express said in the file and on stderr.

mod common;

use common::{autopar, plan_1t, FIXTURES, GPT_1T};
use std::collections::BTreeMap;
use std::path::Path;

/// A plan for Megatron-LM's 1T-parameter run.
fn plan(dir: &Path) -> (String, serde_json::Value) {
    let out = dir.join("plan.json");
    plan_1t(&out);
    let text = std::fs::read_to_string(&out).unwrap();
    (
        out.to_str().unwrap().to_string(),
        serde_json::from_str(&text).unwrap(),
    )
}

/// Exports `plan` to `to`; the file and stderr.
fn export(plan: &str, to: &str, dir: &Path) -> (String, String) {
    let out = dir.join(format!("out-{to}"));
    let (code, _, err) = autopar(&["export", plan, "--to", to, "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    (std::fs::read_to_string(out).unwrap(), err)
}

/// Megatron-LM's arguments: flag → value ("" for a switch).
fn megatron_args(text: &str) -> BTreeMap<String, String> {
    let body = text
        .split("MEGATRON_ARGS=(")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            (
                it.next().unwrap().to_string(),
                it.next().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn each_target_holds_the_plans_degrees_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (plan, v) = plan(dir.path());
    let p = &v["parallel"];
    let n = |k: &str| p[k].as_u64().unwrap();
    assert!(n("tp") > 1 && n("pp") > 1 && n("virtual_stages") > 1, "{p}");

    let (text, _) = export(&plan, "megatron", dir.path());
    let a = megatron_args(&text);
    assert_eq!(a["--tensor-model-parallel-size"], n("tp").to_string());
    assert_eq!(a["--pipeline-model-parallel-size"], n("pp").to_string());
    assert_eq!(a["--micro-batch-size"], n("micro_batch").to_string());
    assert_eq!(a["--global-batch-size"], n("global_batch").to_string());
    assert_eq!(
        a["--num-layers-per-virtual-pipeline-stage"],
        (128 / (n("pp") * n("virtual_stages"))).to_string()
    );
    assert_eq!(a.contains_key("--sequence-parallel"), p["sp"].as_bool().unwrap());
    assert_eq!(a.contains_key("--use-distributed-optimizer"), n("zero") >= 1);
    assert_eq!(a["--num-layers"], "128");
    assert_eq!(a["--hidden-size"], "25600");
    assert!(a.contains_key("--bf16"));

    let (text, _) = export(&plan, "torchtitan", dir.path());
    let t: toml::Table = text.parse().unwrap();
    let par = t["parallelism"].as_table().unwrap();
    let int = |k: &str| par[k].as_integer().unwrap() as u64;
    assert_eq!(int("tensor_parallel_degree"), n("tp"));
    assert_eq!(int("pipeline_parallel_degree"), n("pp"));
    assert_eq!(
        int("data_parallel_replicate_degree") * int("data_parallel_shard_degree"),
        n("dp")
    );
    assert_eq!(
        par["pipeline_parallel_schedule"].as_str(),
        Some("Interleaved1F1B")
    );
    assert_eq!(
        t["training"]["global_batch_size"].as_integer().unwrap() as u64,
        n("global_batch")
    );

    let (text, _) = export(&plan, "deepspeed", dir.path());
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ds = |k: &str| d[k].as_u64().unwrap();
    assert_eq!(ds("train_batch_size"), n("global_batch"));
    assert_eq!(
        ds("train_micro_batch_size_per_gpu") * ds("gradient_accumulation_steps") * n("dp"),
        n("global_batch")
    );
    assert_eq!(d["zero_optimization"]["stage"].as_u64(), Some(n("zero")));
    assert_eq!(d["tensor_parallel"]["autotp_size"].as_u64(), Some(n("tp")));
    // Pipeline stages live in the training script: said, not dropped.
    let comment = d["comment"].to_string();
    assert!(comment.contains("PipelineModule(num_stages="), "{comment}");
}

#[test]
fn what_a_target_cannot_express_is_said_in_the_file_and_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut v) = plan(dir.path());
    v["parallel"]["grad_compression"] = serde_json::json!("bf16");
    let edited = dir.path().join("compressed.json");
    std::fs::write(&edited, serde_json::to_string(&v).unwrap()).unwrap();
    for to in ["megatron", "torchtitan", "deepspeed"] {
        let (text, err) = export(edited.to_str().unwrap(), to, dir.path());
        assert!(
            err.contains("not expressible: gradient compression (bf16)"),
            "{to}: {err}"
        );
        assert!(
            text.contains("Not expressible") && text.contains("gradient compression (bf16)"),
            "{to}: {text}"
        );
    }
}

#[test]
fn the_fixture_plan_exports_in_its_models_precision() {
    let dir = tempfile::tempdir().unwrap();
    // An f32 model: no tool may fall back to its own mixed-precision
    // default (torchtitan's is bfloat16).
    let plan = format!("{FIXTURES}/plans/v1.json");
    let (megatron, _) = export(&plan, "megatron", dir.path());
    assert!(
        !megatron.contains("--bf16") && !megatron.contains("--fp16"),
        "{megatron}"
    );
    let (torchtitan, _) = export(&plan, "torchtitan", dir.path());
    assert!(
        torchtitan.contains("mixed_precision_param = \"float32\""),
        "{torchtitan}"
    );
    let (deepspeed, _) = export(&plan, "deepspeed", dir.path());
    let ds: serde_json::Value = serde_json::from_str(&deepspeed).unwrap();
    assert_eq!(
        (&ds["bf16"]["enabled"], &ds["fp16"]["enabled"]),
        (&false.into(), &false.into())
    );
}

/// `estimate --from` reads each file exported from `plan_file` back as the
/// plan's configuration: the same estimate as the plan's degrees and knobs
/// given as flags (the tools lay tensor-parallel ops out as Megatron-LM
/// does, which the flags price too). torchtitan has no ZeRO-1: its FSDP
/// shards gradients too, so it prices as ZeRO-2. DeepSpeed's config holds
/// no pipeline depth (it follows from the GPUs), schedule, chunks or
/// sequence parallelism (flags).
fn assert_round_trip(plan_file: &Path, dir: &Path) {
    let plan = plan_file.to_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(plan_file).unwrap()).unwrap();
    let p = &v["parallel"];
    let s = |k: &str| p[k].to_string().trim_matches('"').to_string();
    let c = &v["inputs"]["cluster"];
    let gpus = (p["dp"].as_u64().unwrap()
        * p["tp"].as_u64().unwrap()
        * p["pp"].as_u64().unwrap()
        * p["cp"].as_u64().unwrap())
    .to_string();
    let model = v["inputs"]["model"].as_str().unwrap();
    let base = [
        model,
        "--cluster",
        c["name"].as_str().unwrap(),
        "--gpus",
        &gpus,
        "--json",
    ];
    let step = |extra: &[&str]| -> f64 {
        let mut args = vec!["estimate"];
        args.extend(base);
        args.extend(extra);
        let (code, stdout, err) = autopar(&args);
        assert_eq!(code, 0, "{plan}: {extra:?}: {err}");
        let e: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        e["step_time_s"].as_f64().unwrap()
    };
    let flags = |zero: String, mesh_order: &str| {
        let mut flags = vec![
            "--mesh-order".to_string(),
            mesh_order.into(),
            "--tp".into(),
            s("tp"),
            "--pp".into(),
            s("pp"),
            "--zero".into(),
            zero,
            "--global-batch".into(),
            s("global_batch"),
            "--micro-batch".into(),
            s("micro_batch"),
            "--schedule".into(),
            s("schedule"),
            "--virtual-stages".into(),
            s("virtual_stages"),
            "--recompute".into(),
            s("recompute"),
            "--overlap-grad-reduce".into(),
        ];
        if p["sp"].as_bool().unwrap() {
            flags.push("--sp".into());
        }
        step(&flags.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // Only Megatron-LM lays ranks out pipeline-inner (a caveat elsewhere).
    let order = s("mesh_order");
    let (schedule, vs) = (s("schedule"), s("virtual_stages"));
    let zero = p["zero"].as_u64().unwrap();
    let fsdp_zero = if zero == 1 { 2 } else { zero };
    for (to, want) in [
        ("megatron", flags(zero.min(1).to_string(), &order)),
        ("torchtitan", flags(fsdp_zero.to_string(), "dp-inner")),
        ("deepspeed", flags(zero.to_string(), "dp-inner")),
    ] {
        let out = dir.join(format!("out-{to}"));
        export(plan, to, dir);
        let mut extra = vec!["--from", to, out.to_str().unwrap()];
        if to == "deepspeed" {
            // DeepSpeed's sequence parallelism and schedule live in the script.
            extra.extend(["--schedule", &schedule, "--virtual-stages", &vs]);
            if p["sp"].as_bool().unwrap() {
                extra.push("--sp");
            }
        }
        let got = step(&extra);
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{plan} → {to}: {got} vs {want}"
        );
    }
}

#[test]
fn estimate_from_an_exported_file_prices_the_plans_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let (plan, _) = plan(dir.path());
    assert_round_trip(Path::new(&plan), dir.path());
    assert_round_trip(Path::new(&format!("{FIXTURES}/plans/v1.json")), dir.path());
}

/// The same for the plan autopar finds for each of Megatron-LM's SC'21 runs.
#[test]
fn every_sc21_runs_plan_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let runs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{FIXTURES}/megatron_sc21_table1.json")).unwrap(),
    )
    .unwrap();
    for (i, r) in runs["rows"].as_array().unwrap().iter().enumerate() {
        let n = |k: &str| r[k].as_u64().unwrap().to_string();
        let plan = dir.path().join(format!("sc21-{i}.json"));
        let model = format!(
            "gpt:layers={},hidden={},heads={},vocab=51200,seq=2048,dtype=bf16",
            n("layers"),
            n("hidden"),
            n("heads")
        );
        let (code, _, err) = autopar(&[
            "plan",
            &model,
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            &n("gpus"),
            "--global-batch",
            &n("batch"),
            "-o",
            plan.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        assert_round_trip(&plan, dir.path());
    }
}

/// `plan --compare` sets the found plan beside a configuration a user
/// runs: its step is what `estimate --from` gives for that file, and the
/// plan's speed-up over it is said with the terms that differ.
#[test]
fn plan_compare_says_how_much_faster_the_plan_is() {
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("mine.sh");
    std::fs::write(
        &mine,
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 32 --micro-batch-size 1 \\\n\
         --global-batch-size 3072 --recompute-granularity full --sequence-parallel --use-distributed-optimizer\n",
    )
    .unwrap();
    let model = GPT_1T;
    let out = dir.path().join("plan.json");
    let base = ["--cluster", "dgx-a100-80g", "--gpus", "3072"];
    let mut args = vec![
        "plan",
        model,
        "--global-batch",
        "3072",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend(base);
    args.extend(["--compare", mine.to_str().unwrap(), "--json"]);
    let (code, stdout, err) = autopar(&args);
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let c: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    let mut est = vec![
        "estimate",
        model,
        "--from",
        "megatron",
        mine.to_str().unwrap(),
        "--json",
    ];
    est.extend(base);
    let (code, stdout, err) = autopar(&est);
    assert_eq!(code, 0, "{err}");
    let theirs: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let theirs = theirs["step_time_s"].as_f64().unwrap();
    let ours = plan["predicted"]["step_time_s"].as_f64().unwrap();
    assert_eq!(c["tool"], "Megatron-LM");
    assert!((c["theirs"]["step_time_s"].as_f64().unwrap() - theirs).abs() <= 1e-9 * theirs);
    assert!((c["speedup"].as_f64().unwrap() - theirs / ours).abs() <= 1e-9);
    assert!(c["speedup"].as_f64().unwrap() > 1.0, "{c}");
    assert!(!c["by_term"].as_array().unwrap().is_empty(), "{c}");
}
