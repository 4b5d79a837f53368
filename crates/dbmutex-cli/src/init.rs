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
    if target.kind == BackendKind::Etcd {
        // Nothing kept beside the locks, so nothing to connect for.
        print(&format!(
            "{}: nothing to create; fencing tokens are the lock keys' revisions (once-per-window \
             runs and lock-delay are not kept on etcd)\n",
            target.describe()
        ))?;
        return Ok(0);
    }
    let locker = target.connect().await?;
    locker.create_tables().await?;
    let grant = match target.kind {
        BackendKind::Postgres => "GRANT SELECT, INSERT, UPDATE ON public.dbmutex_fence, dbmutex_runs, public.dbmutex_delay TO <role>;",
        BackendKind::Mysql => {
            "GRANT SELECT, INSERT, UPDATE ON <database>.dbmutex_fence TO '<user>'@'<host>';\n  \
             GRANT SELECT, INSERT, UPDATE ON <database>.dbmutex_runs TO '<user>'@'<host>';\n  \
             GRANT SELECT, INSERT, UPDATE ON <database>.dbmutex_delay TO '<user>'@'<host>';"
        }
        _ => {
            print(&format!(
                "{}: nothing to create; fencing tokens and run records live beside the lock files \
                 (<lock file>.fence, <lock file>.run, <lock file>.delay)\n",
                target.describe()
            ))?;
            return Ok(0);
        }
    };
    print(&format!(
        "dbmutex_fence, dbmutex_runs and dbmutex_delay are ready on {}.\nA role that takes fenced \
         locks (dbmutex run --fence), runs once per window (--once-per) or with a lock-delay \
         (--lock-delay) needs only:\n  {grant}\n",
        target.describe()
    ))?;
    Ok(0)
}
