//! `autopar plan` and `autopar explain` through the real binary: every
//! fixture plans on a GPU node and on this host, the JSON contract, plan
//! snapshots, MoE plans use expert parallelism where it pays, and a model
//! that fits nowhere is a clear error.

mod common;

use common::{assert_error, autopar, scratch, scratch_file};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models");

fn plan_json(args: &[&str], file: &str) -> serde_json::Value {
    let out = scratch(file);
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    all.extend(["-o", out.to_str().unwrap(), "--json"]);
    let (code, stdout, err) = autopar(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(printed, written);
    printed
}

#[test]
fn every_fixture_plans_on_a_gpu_node_and_on_this_host() {
    let mut models: Vec<_> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    models.sort();
    assert!(models.len() >= 9);
    for model in &models {
        let m = model.to_str().unwrap();
        for cluster in [["dgx-h100", "8"], ["cpu", "4"]] {
            let v = plan_json(
                &[
                    m,
                    "--cluster",
                    cluster[0],
                    "--gpus",
                    cluster[1],
                    "--global-batch",
                    "8",
                ],
                "fixture.json",
            );
            let gpus: u64 = cluster[1].parse().unwrap();
            let p = &v["parallel"];
            let product = ["dp", "tp", "pp", "cp"]
                .iter()
                .map(|k| p[k].as_u64().unwrap())
                .product::<u64>();
            assert_eq!(product, gpus, "{m} on {}: {p}", cluster[0]);
            assert!(v["predicted"]["fits"].as_bool().unwrap());
            assert!(!v["sharding"].as_array().unwrap().is_empty());
        }
    }
}

#[test]
fn json_has_the_contract_keys_and_explain_reads_it() {
    let out = scratch("gpt.json");
    let spec = "gpt:layers=8,hidden=1024,heads=16,vocab=50304,seq=1024,dtype=bf16";
    let v = plan_json(
        &[
            spec,
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--top",
            "3",
        ],
        "gpt.json",
    );
    assert_eq!(v["format"], "autopar-plan");
    assert_eq!(v["version"], 2);
    for key in ["step_time_s", "mfu", "memory_per_gpu_bytes"] {
        assert!(v["predicted"][key].as_f64().is_some(), "predicted.{key}");
    }
    assert!(v["search"]["configs_evaluated"].as_u64().unwrap() > 10);
    assert!(v["search"]["seconds"].as_f64().is_some());
    assert!(v["parallel"]["dp"].as_u64().is_some());
    assert_eq!(v["search"]["top"].as_array().unwrap().len(), 3);
    assert_eq!(v["mesh"]["ranks"].as_array().unwrap().len(), 16);
    let layers: u64 = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["layers"][1].as_u64().unwrap() - s["layers"][0].as_u64().unwrap())
        .sum();
    assert_eq!(layers, 8);
    let (code, text, err) = autopar(&["explain", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "mesh",
        "stages",
        "each GPU holds",
        "where a step",
        "why this plan",
    ] {
        assert!(text.contains(needle), "explain lacks '{needle}':\n{text}");
    }
    // The runner-up is the fastest other configuration, wherever the plan
    // itself sits among the ranked ones.
    let why = |text: &str| {
        text.lines()
            .find(|l| l.contains("why this plan"))
            .map(str::to_string)
    };
    let mut swapped = v.clone();
    swapped["search"]["top"].as_array_mut().unwrap().swap(0, 1);
    let other = scratch("gpt-second.json");
    std::fs::write(&other, serde_json::to_string(&swapped).unwrap()).unwrap();
    let (code, second, err) = autopar(&["explain", other.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(why(&second), why(&text), "{second}");
}

/// The plan with the run-dependent search time zeroed, for snapshots.
fn stable(mut v: serde_json::Value) -> String {
    v["search"]["seconds"] = serde_json::json!(0.0);
    serde_json::to_string_pretty(&v).unwrap()
}

#[test]
fn plan_snapshots() {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../snapshots");
    let cases = [
        // Relative to the crate (the tests' working folder), so that the
        // recorded model argument is the same in every checkout.
        (
            "gpt2_tiny_h100x8",
            "fixtures/models/gpt2-tiny.dynamo.onnx",
            "dgx-h100",
            "8",
        ),
        (
            "llama_tiny_a100x4",
            "fixtures/models/llama-tiny.ts.onnx",
            "dgx-a100-80g",
            "4",
        ),
        (
            "mixtral_tiny_h100x8",
            "fixtures/models/mixtral-tiny.dynamo.onnx",
            "dgx-h100",
            "8",
        ),
    ];
    for (name, model, cluster, gpus) in cases {
        let v = plan_json(
            &[
                model,
                "--cluster",
                cluster,
                "--gpus",
                gpus,
                "--global-batch",
                "16",
                "--top",
                "3",
            ],
            "snap.json",
        );
        settings.bind(|| insta::assert_snapshot!(format!("plan__{name}"), stable(v)));
    }
}

/// Expert parallelism is priced as lowering runs it: each token row is
/// dispatched all-to-all to its experts' rank and back, and each rank runs
/// `1/ep` of the experts on the rows routed to them (the expert work of one
/// rank's tokens, in larger products), for `1/ep` of the expert weights and
/// their gradients' reduction. So ep 2 moves bytes in all-to-alls, computes
/// no more, reduces fewer gradient bytes and needs less memory, and the
/// planner picks expert parallelism for this model, its plan carrying the
/// experts' per-op sharding.
#[test]
fn moe_plans_price_expert_parallelism_as_it_is_lowered() {
    let spec = "moe:layers=8,hidden=2048,ffn=8192,heads=16,kv_heads=4,experts=16,top_k=2,vocab=32000,seq=2048,dtype=bf16";
    let estimate = |ep: &str| {
        let args = [
            "estimate",
            spec,
            "--cluster",
            "dgx-h100",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--zero",
            "1",
            "--ep",
            ep,
            "--json",
        ];
        let (code, out, err) = autopar(&args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let (one, two) = (estimate("1"), estimate("2"));
    let part = |v: &serde_json::Value, k: &str| v["breakdown"][k].as_f64().unwrap();
    assert!(
        part(&two, "compute_s") <= part(&one, "compute_s"),
        "{two} vs {one}"
    );
    assert!(part(&two, "ep_comm_s") > 0.0 && part(&one, "ep_comm_s") == 0.0);
    let number = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(number(&two, "comm_bytes_per_gpu") < number(&one, "comm_bytes_per_gpu"));
    assert!(number(&two, "memory_per_gpu_bytes") < number(&one, "memory_per_gpu_bytes"));
    let v = plan_json(
        &[
            spec,
            "--cluster",
            "dgx-h100",
            "--gpus",
            "16",
            "--global-batch",
            "64",
        ],
        "moe.json",
    );
    assert!(v["parallel"]["ep"].as_u64().unwrap() > 1, "{}", v["parallel"]);
    assert!(v["sharding"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["op"] == "MoeExperts"));
}

#[test]
fn a_model_that_fits_nowhere_names_the_smallest_need() {
    let out = scratch("never.json");
    let spec = "gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048,dtype=bf16";
    assert_error(
        &[
            "plan",
            spec,
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "-o",
            out.to_str().unwrap(),
        ],
        2,
        &[
            "no plan fits in 72.0 GiB per GPU: the smallest needs",
            "alone takes",
        ],
    );
    assert!(!out.exists(), "no plan file is left behind");
}

/// 5,128 GPUs are 641 nodes of 8: no layout uses them all with a batch of
/// 2,560, so the plan runs on 5,120 and says 8 stay idle (table, JSON,
/// explain); a count no smaller one can replace either is a finite error.
#[test]
fn a_cluster_that_does_not_factor_plans_with_spares() {
    let spec = "gpt:layers=2,hidden=256,heads=8,vocab=1024,seq=256";
    let args = [
        "--cluster",
        "dgx-a100-80g",
        "--gpus",
        "5128",
        "--global-batch",
        "2560",
    ];
    let v = plan_json(&[&[spec][..], &args].concat(), "spares.json");
    assert_eq!(
        (v["gpus_used"].as_u64(), v["spare_gpus"].as_u64()),
        (Some(5120), Some(8))
    );
    assert_eq!(v["mesh"]["ranks"].as_array().unwrap().len(), 5120);
    let out = scratch("spares-table.json");
    let (code, table, err) = autopar(&[&["plan", spec][..], &args, &["-o", out.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    let line = "5120 GPUs used, 8 left idle as spares: no parallel layout uses all 5128";
    assert!(table.contains(line), "{table}");
    let (code, explained, _) = autopar(&["explain", out.to_str().unwrap()]);
    assert!(code == 0 && explained.contains(line), "{explained}");
    // Three GPUs of one node with a batch of 2: two of them.
    let v = plan_json(
        &[
            spec,
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            "3",
            "--global-batch",
            "2",
        ],
        "spares-small.json",
    );
    assert_eq!(
        (v["gpus_used"].as_u64(), v["spare_gpus"].as_u64()),
        (Some(2), Some(1))
    );
}

/// `autopar plan` of a small zoo GPT on eight GPUs, with `flags`.
fn small_plan<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan", "gpt:layers=2,hidden=64,heads=4,vocab=100,seq=16"];
    args.extend(["--gpus", "8"]);
    args.extend_from_slice(flags);
    args
}

#[test]
fn bad_plan_requests_and_files() {
    let out = scratch("bad.json");
    let o = out.to_str().unwrap();
    let junk = scratch_file("junk.json", br#"{"format": "autopar-graph"}"#);
    let junk = junk.to_str().unwrap();
    let a100 = "dgx-a100-80g";
    let cases: [(Vec<&str>, &[&str]); 5] = [
        (
            small_plan(&["--cluster", a100, "--global-batch", "0", "-o", o]),
            &["--global-batch must be at least 1"],
        ),
        (
            small_plan(&[
                "--cluster",
                a100,
                "--global-batch",
                "8",
                "--max-memory-fraction",
                "1.5",
                "-o",
                o,
            ]),
            &["--max-memory-fraction 1.5"],
        ),
        (
            small_plan(&["--cluster", "nope", "--global-batch", "8", "-o", o]),
            &["unknown cluster preset 'nope'"],
        ),
        (
            small_plan(&[
                "--cluster",
                a100,
                "--global-batch",
                "8",
                "-o",
                "/no/such/dir/p.json",
            ]),
            &["/no/such/dir"],
        ),
        (vec!["explain", junk], &["junk.json", "autopar-plan"]),
    ];
    for (args, needles) in &cases {
        assert_error(args, 2, needles);
    }
    assert!(!out.exists(), "no plan file is left behind");
}

/// `--verify K` simulates the K fastest candidates, chooses the fastest
/// simulated, and reports each one's simulated step; `--verify 0` trusts the
/// estimate alone.
#[test]
fn verified_plans_carry_their_simulated_steps() {
    let model = format!("{FIXTURES}/gpt2-tiny.ts.onnx");
    let base = [
        model.as_str(),
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "16",
    ];
    let v = plan_json(&[&base[..], &["--verify", "3"]].concat(), "verify3.json");
    let top = v["search"]["top"].as_array().unwrap();
    let simulated: Vec<f64> = top
        .iter()
        .filter_map(|a| a["simulated_step_time_s"].as_f64())
        .collect();
    assert_eq!(simulated.len(), 3.min(top.len()), "{top:?}");
    assert!(simulated.windows(2).all(|w| w[0] <= w[1]), "{simulated:?}");
    assert_eq!(v["simulated_step_time_s"].as_f64(), Some(simulated[0]));
    assert_eq!(top[0]["parallel"], v["parallel"]);
    let v = plan_json(&[&base[..], &["--verify", "0"]].concat(), "verify0.json");
    assert!(v.get("simulated_step_time_s").is_none());
    assert!(v["search"]["top"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a.get("simulated_step_time_s").is_none()));
}
