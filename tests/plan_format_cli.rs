//! Plan files through the real binary: `run`, `explain` and `simulate`
//! refuse a knob value they do not know with exit code 2, naming the file,
//! the field and the values allowed; a version-1 file still reads; an
//! unsupported version is refused naming it.

use std::path::PathBuf;
use std::process::Command;

/// A plan `autopar plan` wrote in format version 1.
const V1: &str = include_str!("../fixtures/plans/v1.json");

fn autopar(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_autopar"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The version-1 plan with `edit` applied, written to a scratch file.
fn plan_file(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("autopar-plan-format-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(V1).unwrap();
    edit(&mut v);
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    path
}

#[test]
fn an_unknown_mesh_order_is_refused_naming_the_file_field_and_values() {
    let path = plan_file("bogus-mesh-order.json", |v| {
        v["parallel"]["mesh_order"] = "bogus".into()
    });
    let file = path.to_str().unwrap();
    for args in [
        vec!["run", file, "--ranks", "8", "--steps", "1"],
        vec!["explain", file],
        vec!["simulate", file],
    ] {
        let (code, _, err) = autopar(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("bogus-mesh-order.json"), "{args:?}: {err}");
        assert!(
            err.contains(
                "plan field 'parallel.mesh_order': unknown mesh order 'bogus' (expected dp-inner, pp-inner)"
            ),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn an_unknown_schedule_in_the_runners_up_is_named_by_its_path() {
    let path = plan_file("bogus-schedule.json", |v| {
        v["search"]["top"][1]["parallel"]["schedule"] = "2f2b".into()
    });
    let (code, _, err) = autopar(&["explain", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("plan field 'search.top[1].parallel.schedule': unknown schedule '2f2b' (expected gpipe, 1f1b, interleaved)"),
        "{err}"
    );
}

#[test]
fn a_version_1_plan_still_reads_and_version_99_is_refused() {
    let v1 = plan_file("v1.json", |_| {});
    let (code, text, err) = autopar(&["explain", v1.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("1f1b schedule"), "{text}");
    let v99 = plan_file("v99.json", |v| v["version"] = 99.into());
    let (code, _, err) = autopar(&["explain", v99.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("v99.json"), "{err}");
    assert!(
        err.contains("plan format version 99 is not supported (this autopar reads versions 1, 2)"),
        "{err}"
    );
}
