//! The library tests' private servers (a server of its own for one test),
//! included by path.

#[path = "../../../dbmutex/tests/common/private.rs"]
pub mod private;
#[path = "../../../dbmutex/tests/common/private_mariadb.rs"]
pub mod private_mariadb;
