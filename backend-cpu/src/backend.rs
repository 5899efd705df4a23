//! The reference backend: the rank interpreter's tensors are host values
//! and every kernel is the op's reference kernel (`Op::eval`), widened to
//! `f64` in an `f64` run.

use autopar_exec::train::{Optimizer, State};
use autopar_exec::{Backend, BackendError};
use autopar_ir::interp::{widen_op, Precision};
use autopar_ir::{Data, Op, Value};
use std::ops::Range;
use std::sync::Arc;

/// The reference backend: host values, `Op::eval`.
pub struct CpuBackend {
    pub precision: Precision,
}

impl Backend for CpuBackend {
    type Tensor = Arc<Value>;
    type State = State;

    fn upload(&mut self, v: Value) -> Result<Arc<Value>, BackendError> {
        Ok(Arc::new(v))
    }

    fn download(&mut self, x: &Arc<Value>) -> Result<Arc<Value>, BackendError> {
        Ok(x.clone())
    }

    fn bytes(&self, x: &Arc<Value>) -> u64 {
        let per = match x.data {
            Data::F64(_) | Data::I64(_) => 8,
            Data::F32(_) => 4,
            _ => 1,
        };
        (x.numel() * per) as u64
    }

    fn numel(&self, x: &Arc<Value>) -> usize {
        x.numel()
    }

    fn eval(
        &mut self,
        node: &str,
        op: &Op,
        args: &[Option<&Arc<Value>>],
    ) -> Result<Vec<Arc<Value>>, BackendError> {
        let refs: Vec<Option<&Value>> = args.iter().map(|a| a.map(|v| &**v)).collect();
        let outs = widen_op(op, self.precision)
            .eval(&refs)
            .map_err(|e| BackendError::Node {
                node: node.to_string(),
                message: e.to_string(),
            })?;
        Ok(outs.into_iter().map(Arc::new).collect())
    }

    /// The same buffer, shared: every in-place update here goes through
    /// `Arc::make_mut`, which copies a shared buffer first, so the copy is
    /// made only if one of them is updated while the other lives (a
    /// gradient's first micro-batch is moved into its accumulator free).
    fn duplicate(&mut self, x: &Arc<Value>) -> Result<Arc<Value>, BackendError> {
        Ok(Arc::clone(x))
    }

    fn accumulate(&mut self, acc: &mut Arc<Value>, g: &Arc<Value>) -> Result<(), BackendError> {
        match (&mut Arc::make_mut(acc).data, &g.data) {
            (Data::F32(a), Data::F32(b)) if a.len() == b.len() => {
                a.iter_mut().zip(b).for_each(|(a, b)| *a += b)
            }
            (Data::F64(a), Data::F64(b)) if a.len() == b.len() => {
                a.iter_mut().zip(b).for_each(|(a, b)| *a += b)
            }
            _ => return Err(BackendError::GradientShapes),
        }
        Ok(())
    }

    fn new_state(&mut self, optimizer: &Optimizer, len: usize) -> Result<State, BackendError> {
        Ok(State::new(optimizer, len, self.precision))
    }

    fn save_state(&mut self, state: &State) -> Result<Vec<Value>, BackendError> {
        Ok(state.to_values())
    }

    fn load_state(&mut self, optimizer: &Optimizer, slots: &[Value]) -> Result<State, BackendError> {
        State::from_values(optimizer, slots, self.precision).ok_or_else(|| BackendError::StateSlots {
            slots: slots.len(),
            what: slots.first().map_or("nothing".into(), |v| {
                format!("{} {:?} elements", v.numel(), v.dtype)
            }),
            want: optimizer.state_slots(),
        })
    }

    fn update(
        &mut self,
        optimizer: &Optimizer,
        state: &mut State,
        step: u64,
        weight: &mut Arc<Value>,
        w: Range<usize>,
        grad: &Arc<Value>,
        g: Range<usize>,
    ) -> Result<(), BackendError> {
        let result = match (&mut Arc::make_mut(weight).data, &grad.data) {
            (Data::F32(wv), Data::F32(gv)) => optimizer.step_f32(state, step, &mut wv[w], &gv[g]),
            (Data::F64(wv), Data::F64(gv)) => optimizer.step_f64(state, step, &mut wv[w], &gv[g]),
            _ => return Err(BackendError::UpdateTypes),
        };
        Ok(result?)
    }
}
