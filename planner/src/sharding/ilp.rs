//! The integer program: pick one option per choice so that the linear costs
//! of the picks plus the pairwise costs between picks are least, keeping a
//! per-option resource (parameter bytes) under a budget.
//!
//! Pairs are linearised as in Alpa: a continuous `y[k][l]` per pair of
//! options whose row sums equal the first choice's binary `x[k]` and whose
//! column sums equal the second's `x[l]` (the local-marginal polytope, tight
//! on tree-shaped graphs, so branch and bound rarely branches). Before
//! solving, choices with one option and pairs whose cost splits into a part
//! per side fold into linear costs, parallel pairs merge, and each connected
//! component is solved on its own unless the budget binds.

use good_lp::{microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use std::collections::BTreeMap;

/// Costs are solved in microseconds so the solver's tolerances sit well
/// below any real difference.
const SCALE: f64 = 1e6;

/// Tie-break per option index (in microseconds): among equal options the
/// lower index wins, so the same input always gives the same answer.
const TIE: f64 = 1e-5;

/// One decision: options with a linear cost and a resource use each.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub cost: Vec<f64>,
    pub mem: Vec<f64>,
}

/// A cost that depends on the options of two choices: `cost[k][l]` when
/// choice `a` takes `k` and choice `b` takes `l`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub a: usize,
    pub b: usize,
    pub cost: Vec<Vec<f64>>,
}

/// What to solve.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Model {
    pub choices: Vec<Choice>,
    pub pairs: Vec<Pair>,
}

/// The picks and the number of solver variables used.
#[derive(Debug, Clone, PartialEq)]
pub struct Picks {
    pub options: Vec<usize>,
    pub variables: usize,
}

impl Model {
    /// Total `(cost, mem)` of `picks`, pairs included.
    pub fn total(&self, picks: &[usize]) -> (f64, f64) {
        let linear = self.choices.iter().zip(picks);
        let cost: f64 = linear.clone().map(|(c, &k)| c.cost[k]).sum::<f64>()
            + self
                .pairs
                .iter()
                .map(|p| p.cost[picks[p.a]][picks[p.b]])
                .sum::<f64>();
        (cost, linear.map(|(c, &k)| c.mem[k]).sum())
    }
}

/// The reduced problem: linear costs (scaled, tie-breaks added) and the
/// pairs between choices that still have several options.
struct Reduced {
    linear: Vec<Vec<f64>>,
    pairs: Vec<Pair>,
}

fn reduce(model: &Model) -> Reduced {
    let mut linear: Vec<Vec<f64>> = model
        .choices
        .iter()
        .map(|c| {
            let tie = |k: usize| TIE * k as f64;
            c.cost
                .iter()
                .enumerate()
                .map(|(k, v)| v * SCALE + tie(k))
                .collect()
        })
        .collect();
    let mut merged: BTreeMap<(usize, usize), Vec<Vec<f64>>> = BTreeMap::new();
    for p in &model.pairs {
        let (na, nb) = (linear[p.a].len(), linear[p.b].len());
        let at = |k: usize, l: usize| p.cost[k][l] * SCALE;
        if nb == 1 {
            (0..na).for_each(|k| linear[p.a][k] += at(k, 0));
        } else if na == 1 {
            (0..nb).for_each(|l| linear[p.b][l] += at(0, l));
        } else if p.a == p.b {
            (0..na).for_each(|k| linear[p.a][k] += at(k, k));
        } else {
            let key = (p.a.min(p.b), p.a.max(p.b));
            let m = merged.entry(key).or_insert_with(|| {
                let (rows, cols) = (linear[key.0].len(), linear[key.1].len());
                vec![vec![0.0; cols]; rows]
            });
            for k in 0..na {
                for l in 0..nb {
                    let (r, c) = if p.a < p.b { (k, l) } else { (l, k) };
                    m[r][c] += at(k, l);
                }
            }
        }
    }
    let mut pairs = Vec::new();
    for ((a, b), m) in merged {
        // cost[k][l] = row[k] + col[l]: no interaction, two linear costs.
        let row: Vec<f64> = m.iter().map(|r| r[0]).collect();
        let col: Vec<f64> = m[0].iter().map(|&c| c - m[0][0]).collect();
        let separable = m.iter().enumerate().all(|(k, r)| {
            r.iter()
                .enumerate()
                .all(|(l, &v)| (v - row[k] - col[l]).abs() <= 1e-9 * (1.0 + v.abs()))
        });
        if separable {
            linear[a].iter_mut().zip(&row).for_each(|(x, r)| *x += r);
            linear[b].iter_mut().zip(&col).for_each(|(x, c)| *x += c);
        } else {
            pairs.push(Pair { a, b, cost: m });
        }
    }
    Reduced { linear, pairs }
}

/// Connected components of the choices under the pairs, each sorted.
fn components(n: usize, pairs: &[Pair]) -> Vec<Vec<usize>> {
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for p in pairs {
        let (ra, rb) = (root(&mut parent, p.a), root(&mut parent, p.b));
        parent[ra.max(rb)] = ra.min(rb);
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    groups.into_values().collect()
}

/// The cheapest option of a choice with no pairs (lowest index on ties).
fn argmin(costs: &[f64]) -> usize {
    (0..costs.len())
        .min_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b)))
        .unwrap_or(0)
}

/// Picks minimising the model's cost with total `mem` at most `budget`.
/// The caller checks the budget can be met at all.
pub fn solve(model: &Model, budget: Option<f64>) -> Result<Picks, String> {
    let reduced = reduce(model);
    let n = model.choices.len();
    let all: Vec<usize> = (0..n).collect();
    let mut picks = Picks {
        options: vec![0; n],
        variables: 0,
    };
    for group in components(n, &reduced.pairs) {
        if group.len() == 1 {
            picks.options[group[0]] = argmin(&reduced.linear[group[0]]);
        } else {
            solve_group(model, &reduced, &group, None, &mut picks)?;
        }
    }
    if let Some(budget) = budget.filter(|&b| model.total(&picks.options).1 > b) {
        solve_group(model, &reduced, &all, Some(budget), &mut picks)?;
    }
    Ok(picks)
}

/// One ILP over the choices in `group` (sorted), with the budget over them
/// when given; writes their picks.
fn solve_group(
    model: &Model,
    reduced: &Reduced,
    group: &[usize],
    budget: Option<f64>,
    picks: &mut Picks,
) -> Result<(), String> {
    let mut vars = ProblemVariables::new();
    let mut objective = Expression::with_capacity(group.len() * 4);
    let mut x: BTreeMap<usize, Vec<Variable>> = BTreeMap::new();
    for &c in group {
        let xs: Vec<Variable> = reduced.linear[c]
            .iter()
            .map(|_| vars.add(variable().binary()))
            .collect();
        for (&v, &cost) in xs.iter().zip(&reduced.linear[c]) {
            objective.add_mul(cost, v);
        }
        x.insert(c, xs);
    }
    let mut marginals = Vec::new();
    for p in reduced.pairs.iter().filter(|p| x.contains_key(&p.a)) {
        let y: Vec<Vec<Variable>> = p
            .cost
            .iter()
            .map(|row| {
                row.iter()
                    .map(|_| vars.add(variable().min(0.0).max(1.0)))
                    .collect()
            })
            .collect();
        for (row, costs) in y.iter().zip(&p.cost) {
            for (&v, &cost) in row.iter().zip(costs) {
                objective.add_mul(cost, v);
            }
        }
        marginals.push((p, y));
    }
    picks.variables += vars.len();
    let mut problem = vars.minimise(objective).using(microlp);
    for xs in x.values() {
        problem.add_constraint(xs.iter().copied().sum::<Expression>().eq(1.0));
    }
    for (p, y) in &marginals {
        for (k, row) in y.iter().enumerate() {
            problem.add_constraint(row.iter().copied().sum::<Expression>().eq(x[&p.a][k]));
        }
        for (l, &xb) in x[&p.b].iter().enumerate() {
            problem.add_constraint(y.iter().map(|row| row[l]).sum::<Expression>().eq(xb));
        }
    }
    if let Some(budget) = budget {
        let mut used = Expression::with_capacity(group.len() * 4);
        for (&c, xs) in &x {
            for (&v, &m) in xs.iter().zip(&model.choices[c].mem) {
                used.add_mul(m, v);
            }
        }
        problem.add_constraint(used.leq(budget));
    }
    let solution = problem.solve().map_err(|e| e.to_string())?;
    for (&c, xs) in &x {
        let values: Vec<f64> = xs.iter().map(|&v| -solution.value(v)).collect();
        picks.options[c] = argmin(&values);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(cost: &[f64]) -> Choice {
        Choice {
            cost: cost.to_vec(),
            mem: vec![0.0; cost.len()],
        }
    }

    #[test]
    fn pairs_steer_choices_away_from_their_cheapest_option() {
        // Alone each choice would take option 1; switching costs 5.
        let model = Model {
            choices: vec![choice(&[1.0, 0.0]), choice(&[0.0, 3.0]), choice(&[2.0, 0.0])],
            pairs: vec![
                Pair {
                    a: 0,
                    b: 1,
                    cost: vec![vec![0.0, 5.0], vec![5.0, 0.0]],
                },
                Pair {
                    a: 2,
                    b: 1,
                    cost: vec![vec![0.0, 5.0], vec![5.0, 0.0]],
                },
            ],
        };
        let picks = solve(&model, None).unwrap();
        assert_eq!(picks.options, [0, 0, 0]);
        assert_eq!(model.total(&picks.options).0, 3.0);
        assert!(picks.variables > 0);
    }

    #[test]
    fn separable_pairs_and_single_options_need_no_solver() {
        let model = Model {
            choices: vec![choice(&[0.0, 1.0]), choice(&[4.0]), choice(&[0.0, 0.0])],
            pairs: vec![
                Pair {
                    a: 0,
                    b: 1,
                    cost: vec![vec![3.0], vec![0.0]],
                },
                Pair {
                    a: 0,
                    b: 2,
                    cost: vec![vec![1.0, 2.0], vec![1.0, 2.0]],
                },
            ],
        };
        let picks = solve(&model, None).unwrap();
        assert_eq!((picks.options, picks.variables), (vec![1, 0, 0], 0));
    }

    #[test]
    fn a_budget_trades_cost_for_memory() {
        let mut a = choice(&[0.0, 1.0]);
        a.mem = vec![10.0, 5.0];
        let mut b = choice(&[0.0, 2.0]);
        b.mem = vec![10.0, 5.0];
        let model = Model {
            choices: vec![a, b],
            pairs: vec![],
        };
        assert_eq!(solve(&model, Some(20.0)).unwrap().options, [0, 0]);
        assert_eq!(solve(&model, Some(15.0)).unwrap().options, [1, 0]);
        assert_eq!(solve(&model, Some(10.0)).unwrap().options, [1, 1]);
    }
}
