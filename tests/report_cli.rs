//! `autopar report`: one self-contained HTML page per plan, whose mesh,
//! stages and ranking are the plan's, small enough for a 3,072-GPU plan.
//! (`scripts/check-report.sh` renders the page in headless Chromium.)

mod common;

use common::{assert_error, autopar, plan_1t, scratch, scratch_dir, scratch_file, FIXTURES};
use std::path::Path;

/// Writes the report of `plan` to `out`; stdout and stderr.
fn report(plan: &Path, out: &Path) -> (String, String) {
    let (code, stdout, stderr) = autopar(&["report", plan.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    (stdout, stderr)
}

/// The text of the `<svg id=ID …>…</svg>` or `<table id=ID …>…</table>` element.
fn element<'a>(html: &'a str, tag: &str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<{tag} id=\"{id}\""))
        .unwrap_or_else(|| panic!("no <{tag} id={id}>"));
    let end = html[start..].find(&format!("</{tag}>")).unwrap();
    &html[start..start + end]
}

/// The table's body rows, as cell texts.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .split("<tr")
        .skip(2)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let text = &cell[cell.find('>').unwrap() + 1..];
                    let mut plain = String::new();
                    let mut in_tag = false;
                    for c in text.chars() {
                        match c {
                            '<' => in_tag = true,
                            '>' => in_tag = false,
                            c if !in_tag => plain.push(c),
                            _ => {}
                        }
                    }
                    plain.trim().to_string()
                })
                .collect()
        })
        .collect()
}

#[test]
fn the_report_of_a_3072_gpu_plan_is_whole_small_and_self_contained() {
    let dir = scratch_dir("big");
    let plan = dir.join("plan.json");
    plan_1t(&plan);
    let out = dir.join("report.html");
    let (stdout, stderr) = report(&plan, &out);
    assert!(stdout.contains("wrote"), "{stdout}");
    assert!(!stderr.contains("note:"), "nothing should be missing: {stderr}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.len() < 2 << 20, "{} bytes", html.len());
    // Self-contained: nothing is fetched.
    for outside in ["http:", "https:", " src=", "<link", "@import", "url("] {
        assert!(
            !html.contains(outside),
            "the page refers outside itself: {outside}"
        );
    }
    let p: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let stages = p["stages"].as_array().unwrap().len();
    // Every GPU on the map, every stage in the table, one timeline row a stage.
    assert_eq!(
        element(&html, "svg", "mesh-grid").matches("<title>rank ").count(),
        3072
    );
    assert_eq!(rows(element(&html, "table", "stage-table")).len(), stages);
    assert_eq!(
        element(&html, "svg", "timeline-svg").matches("<text").count(),
        stages + 5
    );
    assert!(html.contains("id=\"warmup-svg\""));
    // Memory by term for the peak stage and every stage, against capacity.
    let memory = element(&html, "svg", "memory-bars");
    assert_eq!(memory.matches("<title>weights: ").count(), stages + 1);
    assert!(memory.contains("capacity 80.0 GiB"));
    // The ranking: the plan's top list, the chosen row marked.
    let top = rows(element(&html, "table", "top-k"));
    assert_eq!(top.len(), p["search"]["top"].as_array().unwrap().len());
    assert!(top.iter().any(|r| r[1].ends_with("(chosen)")));
    assert!(html.contains("why this plan: the runner-up"));
    // Tensor groups of 8 sit inside nodes; pipeline groups cross them.
    let groups = rows(element(&html, "table", "groups"));
    let tensor = groups.iter().find(|r| r[0] == "tensor").unwrap();
    assert_eq!((tensor[1].as_str(), tensor[2].as_str()), ("8", "384"));
    assert!(tensor[3].starts_with("each inside one node"), "{tensor:?}");
    let pipeline = groups.iter().find(|r| r[0] == "pipeline").unwrap();
    assert_eq!(pipeline[1], stages.to_string());
    assert!(pipeline[3].contains("across"), "{pipeline:?}");
}

/// The first group of each kind in the report is the one the plan's mesh
/// gives rank 0 (the ranks lowering's collectives use).
#[test]
fn the_groups_are_the_meshs() {
    let dir = scratch_dir("groups");
    let plan = dir.join("plan.json");
    let (code, _, err) = autopar(&[
        "plan",
        "gpt:layers=40,hidden=6144,heads=48,vocab=51200,seq=2048,dtype=f16",
        "--cluster",
        "p3-v100",
        "--gpus",
        "64",
        "--global-batch",
        "128",
        "-o",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let out = dir.join("report.html");
    report(&plan, &out);
    let html = std::fs::read_to_string(&out).unwrap();
    let p: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let places = p["mesh"]["ranks"].as_array().unwrap();
    let coord = |r: &serde_json::Value, axis: &str| r[axis].as_u64().unwrap();
    // Rank 0's group along `axis`: the ranks that differ from it only there.
    let group = |axis: &str, also: &[&str]| -> Vec<u64> {
        let mut g: Vec<u64> = places
            .iter()
            .filter(|r| {
                ["tp", "cp", "dp", "pp"]
                    .iter()
                    .filter(|a| **a != axis && !also.contains(a))
                    .all(|a| coord(r, a) == coord(&places[0], a))
            })
            .map(|r| r["rank"].as_u64().unwrap())
            .collect();
        g.sort();
        g
    };
    let groups = rows(element(&html, "table", "groups"));
    let degree = |axis: &str| p["parallel"][axis].as_u64().unwrap();
    let expected = [
        ("tensor", degree("tp"), group("tp", &[])),
        (
            "data (replicas)",
            degree("dp") * degree("cp"),
            group("dp", &["cp"]),
        ),
        ("pipeline", degree("pp"), group("pp", &[])),
    ];
    let mut checked = 0;
    for (name, size, ranks) in expected {
        let row = groups.iter().find(|r| r[0] == name);
        if size == 1 {
            assert!(row.is_none(), "{name} has no groups");
            continue;
        }
        let row = row.unwrap_or_else(|| panic!("no {name} row in {groups:?}"));
        assert_eq!(row[1], size.to_string());
        assert_eq!(ranks.len() as u64, size);
        // The report writes runs of consecutive ranks as `a-b`, and of a
        // long list the first three runs, `… (N ranges)` and the last.
        let runs: Vec<Vec<u64>> = row[4]
            .split(", ")
            .filter(|part| !part.starts_with('…'))
            .map(|part| match part.split_once('-') {
                Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
                None => vec![part.parse().unwrap()],
            })
            .collect();
        let listed: Vec<u64> = runs.concat();
        if row[4].contains('…') {
            let head = runs[..3].concat();
            assert_eq!(listed[..head.len()], ranks[..head.len()], "{name}");
            assert_eq!(
                runs.last(),
                Some(&ranks[ranks.len() - runs.last().unwrap().len()..].to_vec()),
                "{name}"
            );
        } else {
            assert_eq!(listed, ranks, "{name}");
        }
        checked += 1;
    }
    assert!(
        checked >= 2,
        "the plan should split at least two ways: {groups:?}"
    );
}

/// A plan whose model file is gone still gets its report, which says what
/// it could not show.
#[test]
fn a_plan_without_its_model_still_reports() {
    let dir = scratch_dir("no-model");
    let model = dir.join("gpt2.onnx");
    std::fs::copy(format!("{FIXTURES}/models/gpt2-tiny.ts.onnx"), &model).unwrap();
    let plan = dir.join("plan.json");
    let (code, _, err) = autopar(&[
        "plan",
        model.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--gpus",
        "4",
        "--global-batch",
        "8",
        "-o",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_file(&model).unwrap();
    let out = dir.join("report.html");
    let (_, stderr) = report(&plan, &out);
    assert!(
        stderr.contains("note: no simulation or per-stage memory"),
        "{stderr}"
    );
    assert!(stderr.contains("gpt2.onnx"), "{stderr}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.contains("no simulation or per-stage memory"));
    assert!(html.contains("id=\"mesh-grid\"") && html.contains("id=\"top-k\""));
    assert!(!html.contains("id=\"timeline-svg\""));
}

#[test]
fn bad_report_input_is_refused_by_name() {
    let garbage = scratch_file("garbage.json", b"{ not a plan");
    assert_error(
        &[
            "report",
            garbage.to_str().unwrap(),
            "-o",
            scratch("x.html").to_str().unwrap(),
        ],
        2,
        &["garbage.json"],
    );
    let plan = format!("{FIXTURES}/plans/v1.json");
    assert_error(
        &["report", &plan, "-o", "/nonexistent-folder/report.html"],
        2,
        &["nonexistent-folder"],
    );
}

/// Expert parallelism: runs of `ep` consecutive data-parallel ranks hold
/// different experts, and each expert's copies sit `ep` ranks apart.
#[test]
fn expert_groups_and_their_replicas() {
    let dir = scratch_dir("moe");
    let plan = dir.join("plan.json");
    let (code, _, err) = autopar(&[
        "plan",
        "moe:layers=8,hidden=2048,heads=16,ffn=8192,vocab=32000,seq=2048,experts=16,top_k=2,dtype=bf16",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "-o",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let (ep, dp, tp) = (
        p["parallel"]["ep"].as_u64().unwrap(),
        p["parallel"]["dp"].as_u64().unwrap(),
        p["parallel"]["tp"].as_u64().unwrap(),
    );
    assert!(
        ep > 1 && tp == 1,
        "the search should pick expert parallelism alone: {}",
        p["parallel"]
    );
    let out = dir.join("report.html");
    report(&plan, &out);
    let html = std::fs::read_to_string(&out).unwrap();
    let groups = rows(element(&html, "table", "groups"));
    let row = |name: &str| groups.iter().find(|r| r[0] == name).unwrap().clone();
    let expert = row("expert");
    assert_eq!(
        (expert[1].clone(), expert[4].clone()),
        (ep.to_string(), format!("0-{}", ep - 1))
    );
    let replicas = row("data (expert replicas)");
    assert_eq!(replicas[1], (dp / ep).to_string());
    assert!(
        replicas[4].starts_with(&format!("0, {}, {}", ep, 2 * ep)),
        "{replicas:?}"
    );
}
