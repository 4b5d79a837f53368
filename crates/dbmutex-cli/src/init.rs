//! `dbmutex init`: creates what fencing tokens need on the server, for
//! deployments whose application role may not create tables, and says which
//! grants that role then needs.

use dbmutex::BackendKind;

use crate::backend::Target;
use crate::cli::Global;
use crate::exit::Failure;
use crate::report::print;

pub async fn init(global: &Global) -> Result<u8, Failure> {
    let target = Target::choose(global)?;
    let locker = target.connect().await?;
    locker.create_fence_table().await?;
    let grant = match target.kind {
        BackendKind::Postgres => "GRANT SELECT, INSERT, UPDATE ON dbmutex_fence TO <role>;",
        BackendKind::Mysql => {
            "GRANT SELECT, INSERT, UPDATE ON <database>.dbmutex_fence TO '<user>'@'<host>';"
        }
        _ => {
            print(&format!(
                "{}: nothing to create; fencing tokens live beside the lock files (<lock file>.fence)\n",
                target.describe()
            ))?;
            return Ok(0);
        }
    };
    print(&format!(
        "dbmutex_fence is ready on {}.\nA role that takes fenced locks (dbmutex run --fence) needs only:\n  {grant}\n",
        target.describe()
    ))?;
    Ok(0)
}
