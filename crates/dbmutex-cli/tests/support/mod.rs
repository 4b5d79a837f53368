//! Shared by the CLI's generated-input tests (`fuzz_args`, `secrets`): the
//! library tests' generator and hostile passwords, included by path so that
//! the CLI is attacked with the same inputs as the library.
#![allow(dead_code)]

#[path = "../../../dbmutex/tests/common/hostile.rs"]
mod hostile;

pub use hostile::*;
