//! The core: everything a lock needs that no backend has to know about —
//! the acquisition pipeline, in-process arbitration, waiting, guards, loss
//! tokens, the task's scope stack. It knows no backend: a backend plugs in
//! by implementing [`backend::Backend`].

pub(crate) mod arbiter;
pub(crate) mod backend;
pub(crate) mod detach;
pub(crate) mod guard;
pub(crate) mod loss;
pub(crate) mod pipeline;
pub(crate) mod scope;
pub(crate) mod wait;
