//! The sizes a plan may hold, declared once for the planner's layer: the
//! plan-file reader refuses larger values naming their field, the search
//! refuses to plan beyond them, and the CLI checks its flags against them
//! before any work. Each lies far above what anyone trains, so only a typo
//! or a damaged file meets one, and it is told so at once instead of
//! allocating or searching for hours.

/// Ranks a plan spans: as many as a cluster may have devices.
pub const MAX_RANKS: usize = autopar_cost_models::MAX_GPUS;

/// Samples in one optimizer step. Published runs step on a few thousand
/// sequences (GPT-3 1,536, Llama 3 2,048), BERT with LAMB on 65,536. A
/// plan's micro-batches number up to this many, and the programs and the
/// simulator walk them one by one.
pub const MAX_GLOBAL_BATCH: usize = 1 << 20;

/// Tokens in one sequence: above the longest contexts trained (a few
/// million tokens); activations and attention grow with it.
pub const MAX_SEQ: usize = 1 << 24;

/// Repeated layers a model may have, and so stages and layer chunks a plan
/// may have: the deepest transformers trained have about 1,000 (DeepNet);
/// the stage split and the programs grow with the count.
pub const MAX_LAYERS: usize = 1024;
