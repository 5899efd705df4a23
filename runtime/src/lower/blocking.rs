//! Whether per-rank programs finish when each collective holds its rank
//! until every member reaches the same collective — as a GPU stream runs
//! NCCL calls, in program order. The fabric's collectives match by tag, so
//! programs whose members meet their collectives in different orders can
//! still finish on the CPU, and would hang on NCCL; this check replays the
//! programs' communication without data and finds that before anything
//! runs. Sends are buffered (they stay host-staged): a receive waits only
//! for its send.

use super::{Instr, Program};
use std::collections::{BTreeMap, BTreeSet};

/// How one instruction meets other ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Meet {
    /// Every member of `group` must be at this collective (same `what`).
    Collective { group: Vec<usize>, what: String },
    /// Buffered: never waits.
    Send { to: usize, what: String },
    /// Waits for the matching send.
    Recv { from: usize, what: String },
}

/// Where the replay stopped: each unfinished rank and what it waits at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ranks wait on each other: {}", waiting.iter().map(|(r, w)| format!("rank {r} at {w}")).collect::<Vec<_>>().join(", "))]
pub struct Deadlock {
    pub waiting: Vec<(usize, String)>,
}

/// Replays `programs`' communication under blocking collectives; `Err`
/// names the ranks that would wait forever.
pub fn check_blocking(programs: &[Program]) -> Result<(), Deadlock> {
    let meets: Vec<Vec<Meet>> = programs
        .iter()
        .map(|p| p.instructions.iter().filter_map(|i| meet(i, p.rank)).collect())
        .collect();
    let mut at = vec![0usize; meets.len()];
    // Sends posted and not yet received: (from, to, what) → count.
    let mut posted: BTreeMap<(usize, usize, String), usize> = BTreeMap::new();
    loop {
        let mut moved = false;
        for rank in 0..meets.len() {
            // A rank runs ahead through everything that does not wait.
            while let Some(m) = meets[rank].get(at[rank]) {
                match m {
                    Meet::Send { to, what } => {
                        *posted.entry((rank, *to, what.clone())).or_insert(0) += 1;
                    }
                    Meet::Recv { from, what } => match posted.get_mut(&(*from, rank, what.clone())) {
                        Some(n) if *n > 0 => *n -= 1,
                        _ => break,
                    },
                    Meet::Collective { group, what } => {
                        let all_here = group.iter().all(|&r| {
                            matches!(meets.get(r).and_then(|ms| ms.get(at[r])),
                                Some(Meet::Collective { group: g, what: w }) if g == group && w == what)
                        });
                        if !all_here {
                            break;
                        }
                        let members: BTreeSet<usize> = group.iter().copied().collect();
                        for r in members.into_iter().filter(|&r| r != rank) {
                            at[r] += 1;
                        }
                    }
                }
                at[rank] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let waiting: Vec<(usize, String)> = meets
        .iter()
        .enumerate()
        .filter_map(|(r, ms)| ms.get(at[r]).map(|m| (r, describe(m))))
        .collect();
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(Deadlock { waiting })
    }
}

/// What `instr` on `rank` waits for, if it communicates.
fn meet(instr: &Instr, rank: usize) -> Option<Meet> {
    let collective = |group: &Vec<usize>| {
        (group.len() > 1 && group.contains(&rank)).then(|| Meet::Collective {
            group: group.clone(),
            what: instr.describe(),
        })
    };
    match instr {
        Instr::Collective { group, .. }
        | Instr::AllReduceGrad { group, .. }
        | Instr::ReduceScatterGrad { group, .. }
        | Instr::AllGatherParam { group, .. }
        | Instr::GatherParam { group, .. }
        | Instr::SumTiedGrads { group, .. } => collective(group),
        Instr::Send { buf, to } => Some(Meet::Send {
            to: *to,
            what: buf.to_string(),
        }),
        Instr::Recv { buf, from } => Some(Meet::Recv {
            from: *from,
            what: buf.to_string(),
        }),
        Instr::SendParam { param, to } => Some(Meet::Send {
            to: *to,
            what: param.clone(),
        }),
        Instr::RecvParam { param, from } => Some(Meet::Recv {
            from: *from,
            what: param.clone(),
        }),
        _ => None,
    }
}

fn describe(m: &Meet) -> String {
    match m {
        Meet::Collective { group, what } => format!("{what} over ranks {group:?}"),
        Meet::Send { to, what } => format!("send {what} to rank {to}"),
        Meet::Recv { from, what } => format!("recv {what} from rank {from}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{for_strategy, lower, Coord, Reduction, Strategy};
    use autopar_cost_models::Schedule;

    fn programs(s: &Strategy) -> Vec<Program> {
        let g = autopar_ir::zoo::build("gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8").unwrap();
        let t = for_strategy(&g, s, 8).unwrap();
        lower(&t, s).unwrap()
    }

    /// The lowering's plans, across data, tensor and pipeline parallelism,
    /// ZeRO stages and schedules, meet their collectives in one order.
    #[test]
    fn lowered_plans_finish_under_blocking_collectives() {
        for (dp, pp, tp, zero, schedule) in [
            (2, 1, 1, 0, Schedule::OneFOneB),
            (2, 1, 1, 3, Schedule::OneFOneB),
            (1, 1, 2, 0, Schedule::OneFOneB),
            (1, 2, 1, 0, Schedule::Gpipe),
            (2, 2, 2, 1, Schedule::OneFOneB),
            (2, 2, 2, 2, Schedule::Interleaved),
        ] {
            let mut s = Strategy::new(dp, pp, 4, 1, 4).with_tp(tp, false);
            s.zero = zero;
            s.schedule = schedule;
            if schedule == Schedule::Interleaved {
                s.chunks = 2;
            }
            let p = programs(&s);
            assert_eq!(
                check_blocking(&p),
                Ok(()),
                "dp {dp} pp {pp} tp {tp} zero {zero} {schedule:?}"
            );
        }
    }

    fn program(rank: usize, instructions: Vec<Instr>) -> Program {
        Program {
            rank,
            coord: Coord {
                tp: 0,
                cp: 0,
                dp: rank,
                pp: 0,
            },
            params: Vec::new(),
            instructions,
        }
    }

    fn all_reduce(param: &str, group: &[usize]) -> Instr {
        Instr::AllReduceGrad {
            param: param.into(),
            group: group.to_vec(),
            reduction: Reduction::Ring,
        }
    }

    #[test]
    fn collectives_met_in_different_orders_are_a_deadlock() {
        let ps = [
            program(0, vec![all_reduce("a", &[0, 1]), all_reduce("b", &[0, 1])]),
            program(1, vec![all_reduce("b", &[0, 1]), all_reduce("a", &[0, 1])]),
        ];
        let err = check_blocking(&ps).unwrap_err();
        assert_eq!(err.waiting.len(), 2);
        assert!(
            err.to_string().starts_with(
                "ranks wait on each other: rank 0 at all-reduce (Ring) grad of 'a' over ranks [0, 1]"
            ),
            "{err}"
        );
        // Three ranks in a cycle of pairwise groups.
        let ps = [
            program(0, vec![all_reduce("x", &[0, 1]), all_reduce("z", &[0, 2])]),
            program(1, vec![all_reduce("y", &[1, 2]), all_reduce("x", &[0, 1])]),
            program(2, vec![all_reduce("z", &[0, 2]), all_reduce("y", &[1, 2])]),
        ];
        assert_eq!(check_blocking(&ps).unwrap_err().waiting.len(), 3);
        // A receive with no send waits forever; a buffered send does not.
        let recv = Instr::Recv {
            buf: crate::lower::Buf::of("t", 0),
            from: 1,
        };
        let ps = [program(0, vec![recv]), program(1, vec![all_reduce("a", &[1])])];
        assert_eq!(check_blocking(&ps).unwrap_err().waiting.len(), 1);
    }
}
