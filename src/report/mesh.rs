//! The mesh on the cluster: which GPUs form each tensor, context, expert,
//! data-parallel and pipeline group, whether a group stays inside a node,
//! and a map of every node's GPUs coloured by pipeline stage.

use super::page::{esc, legend, open_section};
use crate::plan::{mesh_axes, rank_ranges};
use autopar_cost_models::{Cluster, Link};
use autopar_ir::CommGroup;
use autopar_lower::{Coord, Strategy};
use autopar_planner::Plan;
use std::collections::BTreeSet;
use std::fmt::Write;

/// A stage's colour, the same in every section: neighbours far apart on the wheel.
pub(super) fn stage_colour(stage: usize) -> String {
    format!("hsl({:.0},58%,60%)", (stage as f64 * 137.508) % 360.0)
}

/// One kind of group, summarised over all of its groups.
struct GroupKind<'a> {
    name: &'a str,
    what: &'a str,
    size: usize,
    groups: usize,
    inside_node: usize,
    most_nodes: usize,
    example: Vec<usize>,
}

/// Every group of one kind, from the rank's group function: each rank once.
fn kind<'a>(
    name: &'a str,
    what: &'a str,
    s: &Strategy,
    place_of: &[(usize, usize)],
    group: impl Fn(Coord) -> Vec<usize>,
) -> GroupKind<'a> {
    let mut seen = vec![false; s.ranks.len()];
    let mut k = GroupKind {
        name,
        what,
        size: 0,
        groups: 0,
        inside_node: 0,
        most_nodes: 0,
        example: Vec::new(),
    };
    for (rank, &coord) in s.ranks.iter().enumerate() {
        if seen[rank] {
            continue;
        }
        let g = group(coord);
        for &r in &g {
            seen[r] = true;
        }
        let nodes: BTreeSet<usize> = g.iter().map(|&r| place_of[r].0).collect();
        k.groups += 1;
        k.size = k.size.max(g.len());
        k.inside_node += usize::from(nodes.len() == 1);
        k.most_nodes = k.most_nodes.max(nodes.len());
        if k.example.is_empty() {
            k.example = g;
        }
    }
    k
}

/// A link's figure for people: `450 GB/s per GPU`.
fn link_text(link: &Link) -> String {
    format!("{:.0} GB/s per GPU", link.bandwidth / 1e9)
}

/// `cluster` (the plan's, when its preset or file is still there) names
/// the links a group's traffic crosses.
pub(super) fn section(out: &mut String, plan: &Plan, s: &Strategy, cluster: Option<&Cluster>) {
    let c = &plan.inputs.cluster;
    // Each rank's (node, GPU), by rank.
    let mut place_of = vec![(0, 0); s.ranks.len()];
    for place in &plan.mesh.ranks {
        if let Some(p) = place_of.get_mut(place.rank) {
            *p = (place.node, place.gpu);
        }
    }
    open_section(
        out,
        "mesh",
        "Mesh on the cluster",
        &format!(
            "{} ranks on {} nodes of {} GPUs; axes {} (fastest-varying first; ranks fill nodes in order). Each row below is one kind of group, as lowering forms it for its collectives.",
            s.ranks.len(),
            c.nodes,
            c.gpus_per_node,
            mesh_axes(plan)
        ),
    );
    type GroupOf<'s> = Box<dyn Fn(Coord) -> Vec<usize> + 's>;
    let all: [(usize, &str, &str, GroupOf); 6] = [
        (
            s.tp,
            "tensor",
            "split each layer's weights; all-reduce or gather activations every layer",
            Box::new(|x| s.comm_group(CommGroup::Tensor, x)),
        ),
        (
            s.cp,
            "context",
            "split the sequence; exchange keys and values in attention",
            Box::new(|x| s.comm_group(CommGroup::Context, x)),
        ),
        (
            s.ep,
            "expert",
            "split the experts; all-to-all the routed tokens",
            Box::new(|x| s.comm_group(CommGroup::Expert, x)),
        ),
        (
            s.dp * s.cp,
            "data (replicas)",
            "hold copies of the same weights; reduce gradients once a step",
            Box::new(|x| s.replica_group(false, x)),
        ),
        (
            // Experts split over an expert group have fewer copies.
            if s.ep > 1 { s.dp * s.cp / s.ep } else { 1 },
            "data (expert replicas)",
            "hold copies of the same experts; reduce their gradients once a step",
            Box::new(|x| s.replica_group(true, x)),
        ),
        (
            s.pp,
            "pipeline",
            "one rank per stage; pass activations and gradients between neighbours",
            Box::new(|x| s.pipeline_group(x)),
        ),
    ];
    let kinds: Vec<GroupKind> = all
        .into_iter()
        .filter(|(degree, ..)| *degree > 1)
        .map(|(_, name, what, group)| kind(name, what, s, &place_of, group))
        .collect();
    out.push_str(
        "<table id=\"groups\"><tr><th>group</th><th class=\"n\">size</th><th class=\"n\">groups</th><th>placement</th><th>first group's ranks</th><th>what it does</th></tr>",
    );
    if kinds.is_empty() {
        out.push_str("<tr><td colspan=\"6\">one rank: no groups</td></tr>");
    }
    for k in &kinds {
        let (intra, inter) = match cluster {
            Some(c) => (
                format!(" ({})", link_text(&c.intra_node)),
                format!(" ({})", link_text(&c.inter_node)),
            ),
            None => (String::new(), String::new()),
        };
        let placement = if k.inside_node == k.groups {
            format!("each inside one node{intra}")
        } else if k.inside_node == 0 {
            format!("each across up to {} nodes{inter}", k.most_nodes)
        } else {
            format!(
                "{} inside one node{intra}, {} across up to {} nodes{inter}",
                k.inside_node,
                k.groups - k.inside_node,
                k.most_nodes
            )
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            k.name,
            k.size,
            k.groups,
            esc(&placement),
            esc(&rank_ranges(&k.example)),
            k.what
        );
    }
    out.push_str("</table>");
    grid(out, plan, s, &place_of);
}

/// Where each node's block of GPUs sits in the map.
struct Geometry {
    gpus_per_node: usize,
    cell: usize,
    gap: usize,
    per_row: usize,
}

impl Geometry {
    fn new(nodes: usize, gpus_per_node: usize) -> Geometry {
        let gpus_per_node = gpus_per_node.max(1);
        let cell = if gpus_per_node <= 8 { 11 } else { 7 };
        let gap = 6;
        let per_row = ((1100 + gap) / (gpus_per_node * cell + gap)).clamp(1, nodes.max(1));
        Geometry {
            gpus_per_node,
            cell,
            gap,
            per_row,
        }
    }

    /// The top-left corner of `gpu` on `node`.
    fn at(&self, node: usize, gpu: usize) -> (usize, usize) {
        let block = self.gpus_per_node * self.cell + self.gap;
        (
            (node % self.per_row) * block + gpu * self.cell,
            (node / self.per_row) * (self.cell + self.gap),
        )
    }

    fn size(&self, nodes: usize) -> (usize, usize) {
        (
            self.per_row * (self.gpus_per_node * self.cell + self.gap),
            nodes.div_ceil(self.per_row) * (self.cell + self.gap),
        )
    }
}

/// Every node as a block of its GPUs, each coloured by its rank's pipeline
/// stage and outlined by tensor-parallel group; hovering names the rank.
fn grid(out: &mut String, plan: &Plan, s: &Strategy, place_of: &[(usize, usize)]) {
    let c = &plan.inputs.cluster;
    let geo = Geometry::new(c.nodes, c.gpus_per_node);
    let (width, height) = geo.size(c.nodes);
    let gpn = geo.gpus_per_node;
    let side = geo.cell - 1;
    let mut rank_at = vec![None; c.nodes * gpn];
    for place in &plan.mesh.ranks {
        if let Some(slot) = rank_at.get_mut(place.node * gpn + place.gpu) {
            *slot = Some(place);
        }
    }
    let stages = s.pp.max(1);
    out.push_str("<style>");
    for k in 0..stages {
        let _ = write!(out, ".s{k}{{fill:{}}}", stage_colour(k));
    }
    out.push_str(".spare{fill:#d6dbe3}.tpg{fill:none;stroke:#1d2433;stroke-width:1.2}</style>");
    let mut entries: Vec<(String, String)> = (0..stages.min(12))
        .map(|k| (stage_colour(k), format!("stage {k}")))
        .collect();
    if stages > 12 {
        entries.push(("#fff".into(), format!("… {stages} stages in all")));
    }
    entries.push(("#d6dbe3".into(), "idle (spare)".into()));
    if s.tp > 1 {
        entries.push(("#1d2433".into(), "outline: a tensor-parallel group".into()));
    }
    legend(out, &entries);
    let _ = write!(
        out,
        "<svg id=\"mesh-grid\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">"
    );
    for node in 0..c.nodes {
        for gpu in 0..gpn {
            let (x, y) = geo.at(node, gpu);
            let _ = match rank_at[node * gpn + gpu] {
                Some(p) => write!(
                    out,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{side}\" height=\"{side}\" class=\"s{}\"><title>rank {} · node {node} GPU {gpu} · tp {} cp {} dp {} stage {}</title></rect>",
                    p.pp, p.rank, p.tp, p.cp, p.dp, p.pp
                ),
                None => write!(
                    out,
                    "<rect x=\"{x}\" y=\"{y}\" width=\"{side}\" height=\"{side}\" class=\"spare\"><title>node {node} GPU {gpu}: idle</title></rect>"
                ),
            };
        }
    }
    if s.tp > 1 {
        tensor_outlines(out, s, place_of, &geo);
    }
    out.push_str("</svg>");
}

/// An outline around each tensor-parallel group that sits on one node's
/// consecutive GPUs (the groups table tells of the others).
fn tensor_outlines(out: &mut String, s: &Strategy, place_of: &[(usize, usize)], geo: &Geometry) {
    for (rank, coord) in s.ranks.iter().enumerate() {
        if coord.tp != 0 {
            continue;
        }
        let g = s.comm_group(CommGroup::Tensor, *coord);
        let node = place_of[rank].0;
        let gpus: Vec<usize> = g.iter().map(|&r| place_of[r].1).collect();
        let first = gpus.iter().copied().min().unwrap_or(0);
        let contiguous = g.iter().all(|&r| place_of[r].0 == node)
            && gpus.iter().copied().max() == Some(first + g.len() - 1);
        if !contiguous {
            continue;
        }
        let (x, y) = geo.at(node, first);
        let _ = write!(
            out,
            "<rect class=\"tpg\" x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\"/>",
            g.len() * geo.cell - 1,
            geo.cell - 1
        );
    }
}
