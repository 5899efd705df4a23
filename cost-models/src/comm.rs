//! Communication model: bytes each rank sends and alpha-beta times for the
//! collectives the runtime lowers to, over the link levels a group spans.
//!
//! Conventions: `bytes` is the size of the whole logical buffer — the tensor
//! each rank holds for all-reduce and broadcast, the full input of a
//! reduce-scatter, the full output of an all-gather, each rank's whole send
//! buffer for all-to-all, the message for point-to-point. Times assume each
//! rank sends and receives at once at its link's per-direction bandwidth.

use crate::Cluster;

/// A collective (or point-to-point) operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
    Broadcast,
    SendRecv,
}

/// How a collective is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring (bandwidth-optimal; all-to-all as pairwise exchange).
    Ring,
    /// Binary tree in heap order, rank 0 the root (latency-optimal all-reduce
    /// and broadcast).
    Tree,
    /// Rank 0 serves: every other rank pushes its buffer to it and pulls the
    /// reduced result (all-reduce only).
    ParameterServer,
}

crate::config::keyword_enum!(Algorithm, "reduction algorithm", "ring" => Algorithm::Ring, "tree" => Algorithm::Tree, "parameter-server" => Algorithm::ParameterServer);

/// Why a collective cannot be priced.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CommError {
    #[error("{algorithm:?} does not implement {collective:?}")]
    Unsupported {
        collective: Collective,
        algorithm: Algorithm,
    },
    #[error("a communication group needs at least one rank")]
    EmptyGroup,
}

/// The collective a graph's comm op runs (`None`: it moves nothing
/// between ranks, a rank's slice or an identity).
pub fn of_comm(kind: autopar_ir::CommKind) -> Option<Collective> {
    use autopar_ir::CommKind;
    match kind {
        CommKind::AllReduce => Some(Collective::AllReduce),
        CommKind::AllGather | CommKind::GatherForCompute => Some(Collective::AllGather),
        CommKind::ReduceScatter => Some(Collective::ReduceScatter),
        CommKind::AllToAll | CommKind::Dispatch | CommKind::Combine => Some(Collective::AllToAll),
        CommKind::Copy | CommKind::Slice => None,
    }
}

/// Whether a graph's comm op is priced by its output rather than its input:
/// the full tensor an all-gather assembles, and the packed rows a
/// `Combine` returns (its input is a dispatch's padded blocks). Bytes are
/// [`bytes_sent`] of that tensor; for the counted exchanges this is the
/// volume routed evenly, the planner's expectation of a data-dependent one.
pub fn priced_by_output(kind: autopar_ir::CommKind) -> bool {
    use autopar_ir::CommKind;
    matches!(
        kind,
        CommKind::AllGather | CommKind::GatherForCompute | CommKind::Combine
    )
}

/// Bytes each of the `n` ranks sends (index = position in the group).
pub fn bytes_sent(
    collective: Collective,
    algorithm: Algorithm,
    n: usize,
    bytes: f64,
) -> Result<Vec<f64>, CommError> {
    use Algorithm::*;
    use Collective::*;
    if n == 0 {
        return Err(CommError::EmptyGroup);
    }
    let nf = n as f64;
    let chunk = bytes / nf;
    Ok(match (collective, algorithm) {
        (_, _) if n == 1 && collective != SendRecv => vec![0.0],
        (AllReduce, Ring) => vec![2.0 * (nf - 1.0) * chunk; n],
        (ReduceScatter | AllGather | AllToAll, Ring) => vec![(nf - 1.0) * chunk; n],
        (Broadcast, Ring) => (0..n).map(|r| if r + 1 < n { bytes } else { 0.0 }).collect(),
        (SendRecv, _) => vec![bytes],
        (AllReduce, Tree) => (0..n)
            .map(|r| (if r == 0 { 0.0 } else { bytes }) + tree_children(r, n) as f64 * bytes)
            .collect(),
        (Broadcast, Tree) => (0..n).map(|r| tree_children(r, n) as f64 * bytes).collect(),
        (AllReduce, ParameterServer) => (0..n)
            .map(|r| if r == 0 { (nf - 1.0) * bytes } else { bytes })
            .collect(),
        (collective, algorithm) => {
            return Err(CommError::Unsupported {
                collective,
                algorithm,
            })
        }
    })
}

/// Children of `r` in a heap-ordered binary tree of `n` ranks.
fn tree_children(r: usize, n: usize) -> usize {
    [2 * r + 1, 2 * r + 2].iter().filter(|&&c| c < n).count()
}

/// Where a group's ranks sit: `per_node` members on each of `nodes` nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub per_node: usize,
    pub nodes: usize,
}

impl Span {
    /// The span of `ranks` on `cluster` (ranks fill nodes in order). Groups
    /// that are uneven across nodes are priced by their fullest node.
    pub fn of(cluster: &Cluster, ranks: &[usize]) -> Result<Span, CommError> {
        if ranks.is_empty() {
            return Err(CommError::EmptyGroup);
        }
        let mut per_node = std::collections::BTreeMap::new();
        for &r in ranks {
            *per_node.entry(cluster.node_of(r)).or_insert(0usize) += 1;
        }
        Ok(Span {
            per_node: per_node.values().copied().max().unwrap_or(1),
            nodes: per_node.len(),
        })
    }

    /// Members in all.
    pub fn ranks(&self) -> usize {
        self.per_node * self.nodes
    }
}

/// Alpha-beta time of one collective over one link level.
fn flat_time(
    collective: Collective,
    algorithm: Algorithm,
    n: usize,
    bytes: f64,
    link: crate::Link,
) -> Result<f64, CommError> {
    use Algorithm::*;
    use Collective::*;
    if n <= 1 && collective != SendRecv {
        return Ok(0.0);
    }
    let nf = n as f64;
    let (alpha, beta) = (link.latency, link.bandwidth);
    let depth = (usize::BITS - n.leading_zeros()) as f64; // ⌈log2(n + 1)⌉ levels
    Ok(match (collective, algorithm) {
        (AllReduce, Ring) => 2.0 * (nf - 1.0) * (alpha + bytes / nf / beta),
        (ReduceScatter | AllGather | AllToAll, Ring) => (nf - 1.0) * (alpha + bytes / nf / beta),
        // Pipelined in chunks: the message streams through the chain once.
        (Broadcast, Ring) => (nf - 1.0) * alpha + bytes / beta,
        (SendRecv, _) => alpha + bytes / beta,
        // Reduce up then broadcast down, each pipelined; a parent sends to two children.
        (AllReduce, Tree) => 2.0 * depth * alpha + 3.0 * bytes / beta,
        (Broadcast, Tree) => depth * alpha + 2.0 * bytes / beta,
        // The server's link carries every push and every pull.
        (AllReduce, ParameterServer) => 2.0 * alpha + 2.0 * (nf - 1.0) * bytes / beta,
        (collective, algorithm) => {
            return Err(CommError::Unsupported {
                collective,
                algorithm,
            })
        }
    })
}

/// Time of a collective over a group spanning `span` on `cluster`. Inside
/// one node it runs on the intra-node link; one rank per node runs on the
/// inter-node link; otherwise ring collectives run hierarchically (inside
/// nodes on the intra-node link, the `1/per_node` share across nodes on the
/// inter-node link, the nodes' rings in parallel), and other algorithms run
/// flat at the inter-node link.
pub fn time(
    cluster: &Cluster,
    span: Span,
    collective: Collective,
    algorithm: Algorithm,
    bytes: f64,
) -> Result<f64, CommError> {
    use Collective::*;
    let (g, k) = (span.per_node, span.nodes);
    if k <= 1 {
        return flat_time(collective, algorithm, g, bytes, cluster.intra_node);
    }
    if g <= 1 || algorithm != Algorithm::Ring {
        return flat_time(collective, algorithm, span.ranks(), bytes, cluster.inter_node);
    }
    let intra = |c| flat_time(c, algorithm, g, bytes, cluster.intra_node);
    let inter = |c| flat_time(c, algorithm, k, bytes / g as f64, cluster.inter_node);
    Ok(match collective {
        AllReduce => intra(ReduceScatter)? + inter(AllReduce)? + intra(AllGather)?,
        ReduceScatter => intra(ReduceScatter)? + inter(ReduceScatter)?,
        AllGather => inter(AllGather)? + intra(AllGather)?,
        // The whole buffer crosses to every node, then spreads inside each.
        Broadcast => flat_time(Broadcast, algorithm, k, bytes, cluster.inter_node)? + intra(Broadcast)?,
        // Of each rank's buffer, the share bound for other nodes crosses the
        // inter-node link; the rest stays inside the node.
        AllToAll => {
            let n = span.ranks() as f64;
            let remote = bytes * (n - g as f64) / n;
            let local = bytes * (g as f64 - 1.0) / n;
            (n - 1.0) * cluster.inter_node.latency
                + (remote / cluster.inter_node.bandwidth).max(local / cluster.intra_node.bandwidth)
        }
        SendRecv => flat_time(SendRecv, algorithm, 2, bytes, cluster.inter_node)?,
    })
}

/// Gradient buckets, the one rule lowering emits and the estimate counts:
/// gradients join the open bucket in the order the backward pass completes
/// them, and the bucket is issued as one collective as soon as it holds at
/// least `cap` bytes (PyTorch DDP's `bucket_cap_mb`, Megatron-LM's
/// `bucket_size`); what remains is issued when nothing more can join it.
/// A `cap` of 0 issues every gradient on its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketFill {
    cap: f64,
    bytes: f64,
    members: usize,
}

impl BucketFill {
    /// An empty bucket issued at `cap` bytes.
    pub fn new(cap: f64) -> BucketFill {
        BucketFill {
            cap,
            bytes: 0.0,
            members: 0,
        }
    }

    /// Adds a gradient of `bytes`; true when that fills the bucket, which
    /// is then issued (and this one starts empty again).
    pub fn add(&mut self, bytes: f64) -> bool {
        self.bytes += bytes;
        self.members += 1;
        let full = self.bytes >= self.cap;
        if full {
            *self = BucketFill::new(self.cap);
        }
        full
    }

    /// Whether gradients wait in the bucket (to be issued when nothing more
    /// can join it).
    pub fn is_open(&self) -> bool {
        self.members > 0
    }
}

/// The collectives that reduce gradients of `sizes` bytes (in the order
/// the backward pass completes them) in buckets of `cap` bytes
/// ([`BucketFill`]).
pub fn buckets<'a>(sizes: impl IntoIterator<Item = &'a f64>, cap: f64) -> usize {
    let mut fill = BucketFill::new(cap);
    let full = sizes.into_iter().filter(|&&bytes| fill.add(bytes)).count();
    full + usize::from(fill.is_open())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Algorithm::*;
    use Collective::*;

    fn a100(gpus: usize) -> Cluster {
        Cluster::preset("dgx-a100-80g").unwrap().with_gpus(gpus).unwrap()
    }

    #[test]
    fn ring_bytes_per_rank_are_the_textbook_ones() {
        // 4 ranks, 400 bytes: all-reduce sends 2·3/4·400 = 600 per rank.
        assert_eq!(bytes_sent(AllReduce, Ring, 4, 400.0).unwrap(), vec![600.0; 4]);
        assert_eq!(bytes_sent(ReduceScatter, Ring, 4, 400.0).unwrap(), vec![300.0; 4]);
        assert_eq!(bytes_sent(AllGather, Ring, 4, 400.0).unwrap(), vec![300.0; 4]);
        assert_eq!(bytes_sent(AllToAll, Ring, 4, 400.0).unwrap(), vec![300.0; 4]);
        assert_eq!(
            bytes_sent(Broadcast, Ring, 3, 10.0).unwrap(),
            vec![10.0, 10.0, 0.0]
        );
        assert_eq!(bytes_sent(AllReduce, Ring, 1, 10.0).unwrap(), vec![0.0]);
    }

    #[test]
    fn tree_and_parameter_server_bytes() {
        // Heap tree of 5: 0→{1,2}, 1→{3,4}.
        assert_eq!(
            bytes_sent(AllReduce, Tree, 5, 1.0).unwrap(),
            vec![2.0, 3.0, 1.0, 1.0, 1.0]
        );
        assert_eq!(
            bytes_sent(Broadcast, Tree, 5, 1.0).unwrap(),
            vec![2.0, 2.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(
            bytes_sent(AllReduce, ParameterServer, 4, 8.0).unwrap(),
            vec![24.0, 8.0, 8.0, 8.0]
        );
        assert_eq!(
            bytes_sent(AllGather, ParameterServer, 4, 8.0),
            Err(CommError::Unsupported {
                collective: AllGather,
                algorithm: ParameterServer
            })
        );
    }

    #[test]
    fn more_ranks_in_a_ring_never_send_fewer_bytes_per_rank() {
        for c in [AllReduce, ReduceScatter, AllGather, AllToAll] {
            let mut last = 0.0;
            for n in 1..=64 {
                let b = bytes_sent(c, Ring, n, 1e6).unwrap()[0];
                assert!(b >= last, "{c:?} n={n}");
                last = b;
            }
        }
    }

    #[test]
    fn intra_node_ring_all_reduce_by_hand() {
        // 8 ranks in one node, 1 GB: 2·7·(2 µs + 1e9/8/300e9 s).
        let c = a100(8);
        let span = Span::of(&c, &(0..8).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            span,
            Span {
                per_node: 8,
                nodes: 1
            }
        );
        let t = time(&c, span, AllReduce, Ring, 1e9).unwrap();
        let want = 14.0 * (2e-6 + 1e9 / 8.0 / 300e9);
        assert!((t - want).abs() < 1e-12, "{t} vs {want}");
    }

    #[test]
    fn hierarchical_all_reduce_by_hand() {
        // 16 ranks on 2 nodes: RS + AG inside (8 ranks, 1 GB), AR across 2 nodes on 1/8 GB.
        let c = a100(16);
        let span = Span::of(&c, &(0..16).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            span,
            Span {
                per_node: 8,
                nodes: 2
            }
        );
        let intra = 7.0 * (2e-6 + 1e9 / 8.0 / 300e9);
        let inter = 2.0 * (5e-6 + 1e9 / 8.0 / 2.0 / 25e9);
        let t = time(&c, span, AllReduce, Ring, 1e9).unwrap();
        assert!((t - (2.0 * intra + inter)).abs() < 1e-12);
        // One rank per node: a flat ring on the inter-node link.
        let across = Span::of(&c, &[0, 8]).unwrap();
        let t = time(&c, across, AllReduce, Ring, 1e9).unwrap();
        assert!((t - 2.0 * (5e-6 + 0.5e9 / 25e9)).abs() < 1e-12);
    }

    #[test]
    fn every_other_collective_by_hand() {
        let c = a100(16);
        let node = Span {
            per_node: 8,
            nodes: 1,
        };
        let two_nodes = Span {
            per_node: 8,
            nodes: 2,
        };
        let bytes = 8e8;
        let close =
            |got: f64, want: f64| assert!((got - want).abs() < 1e-12 * want.max(1.0), "{got} vs {want}");
        let step = 2e-6 + bytes / 8.0 / 300e9;
        close(time(&c, node, ReduceScatter, Ring, bytes).unwrap(), 7.0 * step);
        close(time(&c, node, AllGather, Ring, bytes).unwrap(), 7.0 * step);
        close(time(&c, node, AllToAll, Ring, bytes).unwrap(), 7.0 * step);
        close(
            time(&c, node, Broadcast, Ring, bytes).unwrap(),
            7.0 * 2e-6 + bytes / 300e9,
        );
        // A heap-ordered tree of 8 has 4 levels.
        close(
            time(&c, node, Broadcast, Tree, bytes).unwrap(),
            4.0 * 2e-6 + 2.0 * bytes / 300e9,
        );
        close(
            time(&c, node, AllReduce, Tree, bytes).unwrap(),
            8.0 * 2e-6 + 3.0 * bytes / 300e9,
        );
        let pair = Span {
            per_node: 1,
            nodes: 2,
        };
        close(
            time(&c, pair, SendRecv, Ring, bytes).unwrap(),
            5e-6 + bytes / 25e9,
        );
        close(
            time(
                &c,
                Span {
                    per_node: 2,
                    nodes: 1,
                },
                SendRecv,
                Ring,
                bytes,
            )
            .unwrap(),
            2e-6 + bytes / 300e9,
        );
        // Hierarchical: inside each node on the whole buffer, across on an eighth.
        let across = |n: f64| 5e-6 + bytes / 8.0 / n / 25e9;
        close(
            time(&c, two_nodes, ReduceScatter, Ring, bytes).unwrap(),
            7.0 * step + across(2.0),
        );
        close(
            time(&c, two_nodes, AllGather, Ring, bytes).unwrap(),
            across(2.0) + 7.0 * step,
        );
        close(
            time(&c, two_nodes, Broadcast, Ring, bytes).unwrap(),
            (5e-6 + bytes / 25e9) + (7.0 * 2e-6 + bytes / 300e9),
        );
        // All-to-all over 16: half of each buffer leaves the node, 7/16 stays.
        close(
            time(&c, two_nodes, AllToAll, Ring, bytes).unwrap(),
            15.0 * 5e-6 + (bytes * 8.0 / 16.0 / 25e9).max(bytes * 7.0 / 16.0 / 300e9),
        );
        // Tree and parameter server run flat on the slower link across nodes.
        close(
            time(&c, two_nodes, AllReduce, Tree, bytes).unwrap(),
            2.0 * 5.0 * 5e-6 + 3.0 * bytes / 25e9,
        );
    }

    #[test]
    fn crossing_nodes_is_slower_than_staying_inside() {
        let c = a100(16);
        let inside = Span::of(&c, &[0, 1]).unwrap();
        let across = Span::of(&c, &[0, 8]).unwrap();
        for coll in [AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, SendRecv] {
            let a = time(&c, inside, coll, Ring, 1e8).unwrap();
            let b = time(&c, across, coll, Ring, 1e8).unwrap();
            assert!(b > a, "{coll:?}");
        }
    }

    #[test]
    fn parameter_server_is_bound_by_the_server_link() {
        let c = a100(8);
        let span = Span::of(&c, &(0..8).collect::<Vec<_>>()).unwrap();
        let ps = time(&c, span, AllReduce, ParameterServer, 1e9).unwrap();
        let ring = time(&c, span, AllReduce, Ring, 1e9).unwrap();
        assert!((ps - (4e-6 + 14.0 * 1e9 / 300e9)).abs() < 1e-12);
        assert!(ps > ring);
    }

    #[test]
    fn buckets_close_at_the_cap_and_issue_the_rest_at_the_end() {
        assert_eq!(buckets(&[], 10.0), 0);
        assert_eq!(buckets(&[4.0, 4.0, 4.0, 4.0, 1.0], 8.0), 3);
        assert_eq!(buckets(&[9.0, 1.0], 8.0), 2);
        assert_eq!(buckets(&[1.0, 1.0, 1.0], 100.0), 1);
        // 0: one collective per tensor, an empty one included.
        assert_eq!(buckets(&[3.0, 0.0, 5.0], 0.0), 3);
        let mut fill = BucketFill::new(8.0);
        assert!(!fill.is_open());
        assert!(!fill.add(5.0) && fill.is_open());
        assert!(fill.add(3.0) && !fill.is_open());
    }
}
