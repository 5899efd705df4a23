//! Cluster descriptions and cost models (compute, communication, memory); filled in by the cost-model work.
