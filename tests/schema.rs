//! The committed JSON Schema of the graph format matches the types.

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
