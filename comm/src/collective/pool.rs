//! Message vectors kept for reuse. A fresh allocation of tens of MiB costs
//! several times more in page faults than copying data into a warm one, and
//! ring collectives send chunks of the same few sizes over and over, so
//! every vector a collective is done with comes back here.

use super::buffer::Element;
use super::Buffer;
use std::sync::Mutex;

/// Most bytes kept idle; a vector that would exceed it is freed instead.
const IDLE_LIMIT_BYTES: usize = 1 << 30;

/// Idle message vectors of one process's fabric, shared by its ranks and
/// its link readers.
#[derive(Default)]
pub(super) struct Pool {
    idle: Mutex<Idle>,
}

#[derive(Default)]
struct Idle {
    buffers: Vec<Buffer>,
    bytes: usize,
}

impl Pool {
    /// An empty vector with room for `len` elements: the smallest idle one
    /// that fits without wasting more than half of it, else a new one.
    pub(super) fn take<T: Element>(&self, len: usize) -> Vec<T> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |b: &Buffer| {
            let cap = b.capacity_bytes() / std::mem::size_of::<T>();
            (b.dtype_name() == T::NAME && cap >= len && cap <= 2 * len).then_some(cap)
        };
        let best = (idle.buffers.iter().enumerate())
            .filter_map(|(i, b)| fits(b).map(|cap| (cap, i)))
            .min();
        let Some((_, i)) = best else {
            return Vec::with_capacity(len);
        };
        let buffer = idle.buffers.swap_remove(i);
        idle.bytes -= buffer.capacity_bytes();
        let mut v = T::unwrap(buffer).expect("the element type was checked");
        v.clear();
        v
    }

    /// A vector holding a copy of `data`.
    pub(super) fn copy_of<T: Element>(&self, data: &[T]) -> Vec<T> {
        let mut v = self.take(data.len());
        v.extend_from_slice(data);
        v
    }

    /// Keeps `buffer`'s allocation for a later [`Pool::take`], unless the
    /// pool is full.
    pub(super) fn give(&self, buffer: Buffer) {
        let bytes = buffer.capacity_bytes();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if bytes > 0 && idle.bytes + bytes <= IDLE_LIMIT_BYTES {
            idle.bytes += bytes;
            idle.buffers.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_the_smallest_idle_vector_of_the_type_that_fits() {
        let pool = Pool::default();
        let big = Vec::<f32>::with_capacity(100);
        let small = Vec::<f32>::with_capacity(60);
        let (big_ptr, small_ptr) = (big.as_ptr(), small.as_ptr());
        pool.give(Buffer::F32(big));
        pool.give(Buffer::F32(small));
        pool.give(Buffer::F64(Vec::with_capacity(60)));
        let v = pool.take::<f32>(50);
        assert_eq!((v.as_ptr(), v.len()), (small_ptr, 0));
        // 100 elements would waste more than half of a 40-element request.
        let fresh = pool.take::<f32>(40);
        assert_ne!(fresh.as_ptr(), big_ptr);
        let copy = pool.copy_of(&[1.0f32; 80]);
        assert_eq!((copy.as_ptr(), copy.len()), (big_ptr, 80));
        assert_eq!(pool.take::<f64>(50).capacity(), 60);
    }

    #[test]
    fn keeps_at_most_the_idle_limit() {
        let pool = Pool::default();
        let huge = IDLE_LIMIT_BYTES / 8 + 1;
        pool.give(Buffer::F64(Vec::with_capacity(huge)));
        pool.give(Buffer::F32(Vec::new()));
        assert_eq!(pool.idle.lock().unwrap().buffers.len(), 0);
    }
}
