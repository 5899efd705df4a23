//! Checkpoints through the real binary: `run --save` and `--resume` continue
//! a run bit for bit (in one process and under a launcher), a job that
//! loses a process is relaunched on fewer ranks and continues as a run of
//! that many resumed from the checkpoint, a `kill -9` during a save never
//! leaves `latest` naming a broken checkpoint, and `export-weights` and
//! `replan` read what was saved.

mod common;

use common::{autopar, free_port, launch_all, launched, run_json};
use std::path::Path;
use std::time::{Duration, Instant};

const GPT2_TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models/gpt2-tiny.ts.onnx");
/// A zoo model small enough that a step takes milliseconds.
const ZOO: &str = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8";

fn losses(v: &serde_json::Value) -> Vec<f64> {
    v["losses"]
        .as_array()
        .unwrap_or_else(|| panic!("no losses in {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The step `DIR/latest` names, if any.
fn latest_step(dir: &Path) -> Option<usize> {
    let name = std::fs::read_to_string(dir.join("latest")).ok()?;
    name.trim().strip_prefix("step-")?.parse().ok()
}

/// The newest complete checkpoint in `DIR` (a `step-<S>` folder with its
/// index): what `--resume DIR` continues from. A process stopped between
/// publishing a folder and pointing `latest` at it leaves this one newer.
fn newest_published(dir: &Path) -> Option<usize> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let step = e.file_name().to_str()?.strip_prefix("step-")?.parse().ok()?;
            e.path().join("index.json").exists().then_some(step)
        })
        .max()
}

#[test]
fn a_resumed_run_continues_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let common = [GPT2_TINY, "--plan", "auto", "--ranks", "2"];
    let whole = run_json(&[&common[..], &["--steps", "6"]].concat());
    let first = run_json(&[&common[..], &["--steps", "3", "--save", path(&ck)]].concat());
    assert_eq!(first["resumed_from_step"], serde_json::Value::Null);
    assert_eq!(latest_step(&ck), Some(3));
    let second = run_json(&[&common[..], &["--steps", "6", "--resume", path(&ck)]].concat());
    assert_eq!(second["resumed_from_step"], 3);
    assert_eq!(losses(&second).len(), 3, "steps 4-6 only");
    let joined = [losses(&first), losses(&second)].concat();
    assert_eq!(bits(&joined), bits(&losses(&whole)));

    // Nothing left to run, and another model, are refused naming the checkpoint.
    for (args, needle) in [
        (
            vec![GPT2_TINY, "--plan", "auto", "--ranks", "2", "--steps", "3"],
            "leaves nothing to run",
        ),
        (
            vec![ZOO, "--plan", "auto", "--ranks", "2", "--steps", "6"],
            "of another model",
        ),
    ] {
        let mut all = vec!["run"];
        all.extend(args);
        all.extend(["--resume", path(&ck)]);
        let (code, _, err) = autopar(&all);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(needle) && err.contains("step-3"), "{err}");
    }
}

/// Runs `args` as `world` launched processes and returns rank 0's report.
fn launch(world: usize, args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&launch_all(world, args)[0].stdout).unwrap()
}

#[test]
fn launched_processes_resume_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let whole = run_json(&[ZOO, "--plan", "auto", "--ranks", "2", "--steps", "6"]);
    let args = |steps: &'static str, flag: &'static str| {
        vec![
            "run",
            ZOO,
            "--plan",
            "auto",
            "--steps",
            steps,
            flag,
            path(&ck),
            "--json",
        ]
    };
    let first = launch(2, &args("3", "--save"));
    let second = launch(2, &args("6", "--resume"));
    assert_eq!(second["resumed_from_step"], 3);
    let joined = [losses(&first), losses(&second)].concat();
    assert_eq!(bits(&joined), bits(&losses(&whole)));
}

/// Four processes save every step; one is killed after step 3's checkpoint.
/// The job relaunched on two (`--resume DIR --plan auto`: no manual step)
/// continues from the newest checkpoint exactly as a two-rank run resumed
/// from it does, and close to what the four ranks would have trained.
#[test]
fn a_job_relaunched_on_fewer_ranks_continues_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let job = |steps: &str| -> Vec<String> {
        let ck = path(&ck);
        [
            "run",
            ZOO,
            "--plan",
            "auto",
            "--steps",
            steps,
            "--save",
            ck,
            "--save-every",
            "1",
            "--resume",
            ck,
            "--json",
        ]
        .map(String::from)
        .to_vec()
    };
    let port = free_port();
    let endless = job("100000");
    let endless: Vec<&str> = endless.iter().map(String::as_str).collect();
    let mut children: Vec<_> = (0..4).map(|rank| launched(rank, 4, port, &endless)).collect();
    let began = Instant::now();
    while latest_step(&ck).is_none_or(|s| s < 3) {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "no checkpoint of step 3"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    children[3].kill().unwrap();
    let outcomes: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let survivor = String::from_utf8_lossy(&outcomes[0].stderr);
    assert!(!outcomes[0].status.success(), "rank 0 went on without rank 3");
    assert!(survivor.contains("rank 3"), "{survivor}");

    // Rank 0 may have published the step after `latest`'s before it
    // stopped: the relaunch continues from the newest complete one.
    let saved = newest_published(&ck).unwrap();
    let kept = dir.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    let from = ck.join(format!("step-{saved}"));
    std::fs::create_dir(kept.join(format!("step-{saved}"))).unwrap();
    for f in std::fs::read_dir(&from).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), kept.join(format!("step-{saved}")).join(f.file_name())).unwrap();
    }
    let total = (saved + 3).to_string();
    let total = total.as_str();
    let relaunch = job(total);
    let relaunched = launch(2, &relaunch.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(relaunched["resumed_from_step"], saved);
    assert_eq!(relaunched["ranks"], 2);
    let kept_step = kept.join(format!("step-{saved}"));
    let two_ranks = run_json(&[
        ZOO,
        "--plan",
        "auto",
        "--ranks",
        "2",
        "--steps",
        total,
        "--resume",
        path(&kept_step),
    ]);
    assert_eq!(bits(&losses(&relaunched)), bits(&losses(&two_ranks)));
    let four_ranks = run_json(&[ZOO, "--plan", "auto", "--ranks", "4", "--steps", total]);
    let after = &losses(&four_ranks)[saved..];
    for (a, b) in losses(&relaunched).iter().zip(after) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "{:?} vs {after:?}",
            losses(&relaunched)
        );
    }
}

#[test]
fn a_kill_during_saves_never_leaves_latest_broken() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    // Relaunched as a supervisor would: the same command, resuming.
    let args = [
        "run",
        GPT2_TINY,
        "--plan",
        "auto",
        "--ranks",
        "2",
        "--steps",
        "100000",
        "--save",
        path(&ck),
        "--save-every",
        "1",
        "--keep",
        "2",
        "--resume",
        path(&ck),
    ];
    let out = dir.path().join("w.safetensors");
    // Each relaunch is killed a little later after it has published a
    // checkpoint of its own, so the kills land at different moments of
    // the saves that follow, however fast this machine is.
    for delay_ms in [0, 25, 50, 75, 100, 150, 200, 300] {
        let before = latest_step(&ck);
        let mut child = common::binary()
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let began = Instant::now();
        while latest_step(&ck) == before {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "no checkpoint after {before:?}"
            );
            assert!(child.try_wait().unwrap().is_none(), "the run ended by itself");
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let (code, _, err) = autopar(&["export-weights", path(&ck), "-o", path(&out)]);
        assert_eq!(code, 0, "after a kill {delay_ms} ms past a save: {err}");
    }
    // A fresh run into a folder that holds later checkpoints is refused.
    let (code, _, err) = autopar(&[
        "run",
        GPT2_TINY,
        "--plan",
        "auto",
        "--ranks",
        "2",
        "--save",
        path(&ck),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("already holds a checkpoint of step"), "{err}");
}

#[test]
fn exported_weights_are_the_trained_ones() {
    use autopar_ir::Role;
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    run_json(&[
        GPT2_TINY,
        "--plan",
        "auto",
        "--ranks",
        "2",
        "--steps",
        "2",
        "--save",
        path(&ck),
    ]);
    let restored = autopar_exec::checkpoint::open(&ck).unwrap();
    let (st, onnx) = (dir.path().join("w.safetensors"), dir.path().join("m.onnx"));
    for out in [&st, &onnx] {
        let (code, _, err) = autopar(&["export-weights", path(&ck), "-o", path(out)]);
        assert_eq!(code, 0, "{err}");
    }

    // Whole tensors named as the ONNX initializers, the checkpoint's values.
    let original = autopar_import::onnx::load_model(Path::new(GPT2_TINY)).unwrap();
    let bytes = std::fs::read(&st).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = file.names().into_iter().map(String::from).collect();
    names.sort();
    let mut params: Vec<String> = original
        .tensors()
        .filter(|(_, t)| t.role == Role::Parameter)
        .map(|(_, t)| t.name.clone())
        .collect();
    params.sort();
    assert_eq!(names, params);
    for name in &names {
        let view = file.tensor(name).unwrap();
        let want = restored.weight(name).unwrap();
        assert_eq!(view.shape(), want.shape.as_slice(), "{name}");
        assert_eq!(view.data(), want.to_le_bytes().as_slice(), "{name}");
    }

    // The ONNX file: the same graph, every initializer that reads a
    // parameter trained (the tied head's transposed copy included), so it
    // computes what the trained model computes.
    let trained = autopar_import::onnx::load_model(&onnx).unwrap();
    assert_eq!(trained.node_count(), original.node_count());
    for (_, t) in trained.tensors().filter(|(_, t)| t.role == Role::Parameter) {
        let want = restored.weight(&t.name).unwrap();
        assert_eq!(t.data.as_deref(), Some(want), "{}", t.name);
    }
    let exported = std::fs::read(&onnx).unwrap();
    let model =
        <autopar_import::onnx::proto::ModelProto as prost::Message>::decode(exported.as_slice()).unwrap();
    let initializers = model.graph.unwrap().initializer.len();
    let before = std::fs::read(GPT2_TINY).unwrap();
    let model =
        <autopar_import::onnx::proto::ModelProto as prost::Message>::decode(before.as_slice()).unwrap();
    assert_eq!(initializers, model.graph.unwrap().initializer.len());
    assert_eq!(exported.len(), before.len(), "same tensors, same sizes");
}

#[test]
fn replan_plans_the_checkpoint_for_the_gpus_left() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    run_json(&[
        ZOO,
        "--plan",
        "auto",
        "--ranks",
        "4",
        "--steps",
        "2",
        "--save",
        path(&ck),
    ]);
    let plan = dir.path().join("plan2.json");
    let (code, _, err) = autopar(&["replan", path(&ck), "--gpus", "2", "-o", path(&plan)]);
    assert_eq!(code, 0, "{err}");
    let resumed = run_json(&[path(&plan), "--ranks", "2", "--steps", "4", "--resume", path(&ck)]);
    assert_eq!(resumed["ranks"], 2);
    assert_eq!(resumed["resumed_from_step"], 2);
    let four = run_json(&[ZOO, "--plan", "auto", "--ranks", "4", "--steps", "4"]);
    for (a, b) in losses(&resumed).iter().zip(&losses(&four)[2..]) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{resumed} vs {four}");
    }
}

/// A damaged checkpoint is one clear error naming the file, never a panic
/// or a silent fresh start.
#[test]
fn a_damaged_checkpoint_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    run_json(&[
        ZOO,
        "--plan",
        "auto",
        "--ranks",
        "2",
        "--steps",
        "1",
        "--save",
        path(&ck),
    ]);
    let step = ck.join("step-1");
    let resume = |needles: &[&str]| {
        let (code, _, err) = autopar(&[
            "run",
            ZOO,
            "--plan",
            "auto",
            "--ranks",
            "2",
            "--steps",
            "2",
            "--resume",
            path(&ck),
        ]);
        assert_eq!(code, 2, "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        for n in needles {
            assert!(err.contains(n), "{n}: {err}");
        }
    };
    let rank1 = step.join("rank-1.safetensors");
    let whole = std::fs::read(&rank1).unwrap();
    std::fs::write(&rank1, &whole[..whole.len() / 2]).unwrap();
    resume(&["rank-1.safetensors"]);
    std::fs::write(&rank1, &whole).unwrap();
    let index = step.join("index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, &text[..text.len() / 2]).unwrap();
    resume(&["index.json"]);
    std::fs::write(&index, text.replace("\"version\": 1", "\"version\": 99")).unwrap();
    resume(&["index.json", "version 99"]);
    std::fs::write(ck.join("latest"), "step-7\n").unwrap();
    resume(&["step-7"]);
}
