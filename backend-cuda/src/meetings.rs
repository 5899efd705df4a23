//! Where the rank threads of one process meet for a collective between
//! their streams on one GPU: each member leaves what the others need (a
//! buffer's address and an event) and takes everyone's once all have come.
//! Meetings are named by group, call number and phase, so members meet in
//! the same collective whatever else they do in between.
//!
//! A rank that stops (its backend dropped after an error) fails the
//! meetings it never came to at once, instead of leaving its peers waiting;
//! a meeting nobody fails waits at most `timeout`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A meeting: a group, that group's call number, and a phase of the call.
pub(crate) type Key = (Vec<usize>, u64, u8);

/// Why a member left a meeting without everyone's items; `what` names the
/// collective and `group` its ranks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeetingError {
    #[error("rank {rank} is not in the group {group:?} of {what}")]
    NotMember {
        rank: usize,
        group: Vec<usize>,
        what: String,
    },
    /// A rank panicked while it held the meeting place.
    #[error("a rank panicked")]
    Poisoned,
    /// A member that had not come stopped (its backend was dropped).
    #[error("rank {gone} stopped before {what} over ranks {group:?}")]
    Stopped {
        gone: usize,
        what: String,
        group: Vec<usize>,
    },
    #[error("{what} over ranks {group:?}: ranks {waiting:?} did not come within {timeout:?}")]
    TimedOut {
        what: String,
        group: Vec<usize>,
        waiting: Vec<usize>,
        timeout: Duration,
    },
}

/// The meeting place of one process's ranks.
pub(crate) struct Meetings<T> {
    state: Mutex<State<T>>,
    arrived: Condvar,
    timeout: Duration,
}

struct State<T> {
    open: HashMap<Key, Meeting<T>>,
    /// Ranks whose backends have gone.
    gone: BTreeSet<usize>,
}

struct Meeting<T> {
    /// What each member left, by its place in the group.
    left: Vec<Option<T>>,
    /// Members that have taken everyone's; the last one closes the meeting.
    taken: usize,
}

impl<T: Clone> Meetings<T> {
    pub fn new(timeout: Duration) -> Meetings<T> {
        Meetings {
            state: Mutex::new(State {
                open: HashMap::new(),
                gone: BTreeSet::new(),
            }),
            arrived: Condvar::new(),
            timeout,
        }
    }

    /// Leaves `item` as rank `me` at meeting `key` (whose group is
    /// `key.0`) and returns every member's, in group order, once all have
    /// come. `what` names the collective in errors.
    pub fn meet(&self, key: Key, me: usize, item: T, what: &str) -> Result<Vec<T>, MeetingError> {
        let group = key.0.clone();
        let place = group
            .iter()
            .position(|&r| r == me)
            .ok_or_else(|| MeetingError::NotMember {
                rank: me,
                group: group.clone(),
                what: what.to_string(),
            })?;
        let deadline = Instant::now() + self.timeout;
        let mut state = self.state.lock().map_err(|_| MeetingError::Poisoned)?;
        let meeting = state.open.entry(key.clone()).or_insert_with(|| Meeting {
            left: vec![None; group.len()],
            taken: 0,
        });
        meeting.left[place] = Some(item);
        self.arrived.notify_all();
        loop {
            let meeting = &state.open[&key];
            if meeting.left.iter().all(Option::is_some) {
                break;
            }
            let missing = group
                .iter()
                .zip(&meeting.left)
                .filter(|(_, left)| left.is_none())
                .map(|(&r, _)| r);
            if let Some(gone) = missing.clone().find(|r| state.gone.contains(r)) {
                let what = what.to_string();
                return Err(MeetingError::Stopped { gone, what, group });
            }
            let now = Instant::now();
            if now >= deadline {
                let waiting = missing.collect();
                return Err(MeetingError::TimedOut {
                    what: what.to_string(),
                    group,
                    waiting,
                    timeout: self.timeout,
                });
            }
            state = self
                .arrived
                .wait_timeout(state, deadline - now)
                .map_err(|_| MeetingError::Poisoned)?
                .0;
        }
        let meeting = state.open.get_mut(&key).expect("checked above");
        let all = meeting.left.iter().flatten().cloned().collect();
        meeting.taken += 1;
        if meeting.taken == group.len() {
            state.open.remove(&key);
        }
        Ok(all)
    }

    /// Marks rank `rank` as gone: meetings it has not come to fail.
    pub fn leave(&self, rank: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.gone.insert(rank);
        }
        self.arrived.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_get_everyone_in_group_order_whatever_the_arrival() {
        let meetings = Meetings::new(Duration::from_secs(5));
        let group = vec![1, 3, 4];
        let got: Vec<Vec<usize>> = std::thread::scope(|s| {
            let members: Vec<_> = group
                .iter()
                .rev()
                .map(|&r| {
                    let (meetings, key) = (&meetings, (group.clone(), 0, 0));
                    s.spawn(move || meetings.meet(key, r, r * 10, "a test").unwrap())
                })
                .collect();
            members.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got.iter().all(|all| all == &[10, 30, 40]), "{got:?}");
        assert!(
            meetings.state.lock().unwrap().open.is_empty(),
            "closed once all took theirs"
        );
    }

    /// Meetings are told apart by call and phase: a member may be ahead.
    #[test]
    fn calls_and_phases_are_separate_meetings() {
        let meetings = Meetings::new(Duration::from_secs(5));
        let group = vec![0, 1];
        std::thread::scope(|s| {
            let ahead = s.spawn(|| {
                (0..3u64)
                    .flat_map(|call| (0..2u8).map(move |phase| (call, phase)))
                    .map(|(call, phase)| {
                        meetings
                            .meet((group.clone(), call, phase), 0, call, "a test")
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            });
            for call in 0..3u64 {
                for phase in 0..2u8 {
                    let all = meetings
                        .meet((group.clone(), call, phase), 1, 100 + call, "a test")
                        .unwrap();
                    assert_eq!(all, [call, 100 + call]);
                }
            }
            assert_eq!(ahead.join().unwrap().len(), 6);
        });
    }

    #[test]
    fn a_rank_that_stopped_fails_the_meetings_it_missed_at_once() {
        let meetings = Meetings::new(Duration::from_secs(60));
        let began = Instant::now();
        let err = std::thread::scope(|s| {
            let waiting = s.spawn(|| meetings.meet((vec![0, 2], 7, 0), 0, 1.0, "the all-reduce"));
            std::thread::sleep(Duration::from_millis(20));
            meetings.leave(2);
            waiting.join().unwrap().unwrap_err()
        });
        assert_eq!(
            err.to_string(),
            "rank 2 stopped before the all-reduce over ranks [0, 2]"
        );
        assert!(matches!(err, MeetingError::Stopped { gone: 2, .. }), "{err:?}");
        assert!(began.elapsed() < Duration::from_secs(10));
        // A meeting it came to before it left still completes.
        let meetings = Meetings::new(Duration::from_secs(5));
        std::thread::scope(|s| {
            let early = s.spawn(|| meetings.meet((vec![0, 1], 0, 0), 1, 'b', "x"));
            while meetings.state.lock().unwrap().open.is_empty() {
                std::thread::yield_now();
            }
            meetings.leave(1);
            assert_eq!(
                meetings.meet((vec![0, 1], 0, 0), 0, 'a', "x").unwrap(),
                ['a', 'b']
            );
            assert_eq!(early.join().unwrap().unwrap(), ['a', 'b']);
        });
    }

    #[test]
    fn nobody_coming_times_out_naming_who() {
        let meetings = Meetings::new(Duration::from_millis(50));
        let err = meetings
            .meet((vec![0, 1, 2], 0, 0), 1, (), "the gather")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the gather over ranks [0, 1, 2]: ranks [0, 2] did not come within 50ms"
        );
        let err = meetings
            .meet((vec![0, 2], 0, 0), 1, (), "the gather")
            .unwrap_err();
        assert_eq!(
            err,
            MeetingError::NotMember {
                rank: 1,
                group: vec![0, 2],
                what: "the gather".into()
            }
        );
    }
}
