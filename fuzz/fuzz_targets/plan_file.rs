//! Any text given to the plan-file reader yields a plan or an error, never
//! a panic or an allocation beyond the reader's limits; a plan it accepts
//! is read on as lowering reads it (its strategy, layer placement) and
//! priced as the estimate prices it (its training configuration).
#![no_main]

use autopar_lower::Strategy;
use autopar_planner::Plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = Plan::from_json(text) else {
        return;
    };
    let _ = plan.training_config();
    if let Ok(strategy) = Strategy::from_plan(&plan) {
        let _ = (strategy.world(), strategy.global_batch());
        let _ = strategy.layer_virtual_stages();
    }
});
