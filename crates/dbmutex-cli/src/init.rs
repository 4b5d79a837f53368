//! `dbmutex init`: creates the tables fencing tokens and once-per-window
//! runs need on the server, for deployments whose application role may not
//! create tables, and says which grants that role then needs.

use dbmutex::BackendKind;

use crate::backend::Target;
use crate::cli::Global;
use crate::exit::Failure;
use crate::report::print;

pub async fn init(global: &Global) -> Result<u8, Failure> {
    let target = Target::choose(global)?;
    let locker = target.connect().await?;
    locker.create_tables().await?;
    let grant = match target.kind {
        BackendKind::Postgres => "GRANT SELECT, INSERT, UPDATE ON dbmutex_fence, dbmutex_runs TO <role>;",
        BackendKind::Mysql => {
            "GRANT SELECT, INSERT, UPDATE ON <database>.dbmutex_fence TO '<user>'@'<host>';\n  \
             GRANT SELECT, INSERT, UPDATE ON <database>.dbmutex_runs TO '<user>'@'<host>';"
        }
        _ => {
            print(&format!(
                "{}: nothing to create; fencing tokens and run records live beside the lock files \
                 (<lock file>.fence, <lock file>.run)\n",
                target.describe()
            ))?;
            return Ok(0);
        }
    };
    print(&format!(
        "dbmutex_fence and dbmutex_runs are ready on {}.\nA role that takes fenced locks \
         (dbmutex run --fence) or runs once per window (--once-per) needs only:\n  {grant}\n",
        target.describe()
    ))?;
    Ok(0)
}
