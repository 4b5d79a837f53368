//! The core: everything a lock needs that no backend has to know about —
//! the acquisition pipeline, in-process arbitration, waiting, guards, loss
//! tokens, the task's scope stack. It knows no backend: a backend plugs in
//! by implementing [`backend::Backend`].

// The core serves whichever backends are built in: in a build without some
// of them (say `--no-default-features`, local only), the parts only a
// database backend uses (server waits, tickets, idle pools, nested scopes)
// have no caller. Every feature combination builds without warnings.
#![cfg_attr(not(all(feature = "postgres", feature = "mysql")), allow(dead_code))]

/// The hash map of the maps on the hot path (held names, in-process
/// slots, prepared statements): foldhash, randomly seeded per process, at
/// a tenth of SipHash's cost for these small keys.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub(crate) mod arbiter;
pub(crate) mod backend;
#[allow(unsafe_code)]
pub(crate) mod clock;
pub(crate) mod delay;
pub(crate) mod detach;
pub(crate) mod guard;
pub(crate) mod idle;
pub(crate) mod loss;
pub(crate) mod metrics;
pub(crate) mod permits;
pub(crate) mod pipeline;
pub(crate) mod queue;
#[allow(unsafe_code)]
pub(crate) mod reuse;
pub(crate) mod scope;
pub(crate) mod scoped;
pub(crate) mod settle;
pub(crate) mod timers;
pub(crate) mod upgradable;
pub(crate) mod upgrade;
pub(crate) mod wait;
