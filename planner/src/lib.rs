//! Parallel-plan search; filled in by the planner work.
