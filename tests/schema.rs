//! The committed JSON Schemas of the graph and plan formats match the types.

#[test]
fn committed_graph_schema_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/graph.schema.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = autopar_ir::json::graph_schema();
    assert!(
        committed.trim() == generated.trim(),
        "docs/graph.schema.json is stale: regenerate with `cargo run -- schema > docs/graph.schema.json`"
    );
}

#[test]
fn committed_plan_schema_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/plan.schema.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = autopar_planner::Plan::schema();
    assert!(
        committed.trim() == generated.trim(),
        "docs/plan.schema.json is stale: regenerate with `cargo run -- schema --plan > docs/plan.schema.json`"
    );
}
