//! The chaos run on etcd (`scripts/chaos.sh --etcd`): the workers lock
//! through `DBMUTEX_CHAOS_LOCK_URL` (a private 3-member cluster the script
//! starts) while the marks stay in the private PostgreSQL, which is then
//! never restarted. The faults on the server side are a lease revoke of a
//! random holder (etcd's `pg_terminate_backend`: the holder must report the
//! loss) and member kills with restarts, the leader every other time
//! (`DBMUTEX_CHAOS_MEMBER_CMD leader|random`), which must cost no lock.

use std::process::Command;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The etcd URL the workers lock through, if this is an etcd run.
pub fn lock_url() -> Option<String> {
    std::env::var("DBMUTEX_CHAOS_LOCK_URL").ok()
}

/// `etcdctl` (v3) against the members of [`lock_url`]; its stdout.
fn etcdctl(args: &[&str]) -> Result<String, BoxError> {
    let url = lock_url().ok_or("not an etcd run")?;
    let hosts = url
        .trim_start_matches("etcd://")
        .split('/')
        .next()
        .unwrap_or_default();
    let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--command-timeout=3s")
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One lock key of the run: the key, its lease (hex), the worker whose
/// note it carries (`dbmutex-chaos-<run>-w<id>`), and whether it heads
/// its queue (holds the lock).
pub struct Key {
    pub lease: String,
    pub worker: u32,
    pub head: bool,
}

/// Every key under the run's lock names, oldest first.
pub fn keys(run: i64) -> Result<Vec<Key>, BoxError> {
    let prefix = format!("dbmutex/chaos-{run}-");
    let out = etcdctl(&["get", "--prefix", &prefix, "--sort-by=CREATE", "--order=ASCEND"])?;
    let lines: Vec<&str> = out.lines().collect();
    let mut seen = std::collections::HashSet::new();
    Ok(lines
        .chunks(2)
        .filter_map(|kv| {
            let (key, value) = (kv.first()?, kv.get(1).copied().unwrap_or(""));
            let (queue, last) = key.rsplit_once('/')?;
            Some(Key {
                lease: last.split('-').next()?.to_owned(),
                worker: value
                    .rsplit_once("-w")
                    .and_then(|(_, w)| w.parse().ok())
                    .unwrap_or(0),
                head: seen.insert(queue.to_owned()),
            })
        })
        .collect())
}

/// Revokes `lease` (hex), as an operator's `etcdctl lease revoke` would.
pub fn revoke(lease: &str) -> Result<(), BoxError> {
    etcdctl(&["lease", "revoke", lease]).map(drop)
}

/// The command that kills member `which` (`leader` or `random`) with
/// SIGKILL and starts it again, returning once the cluster is healthy.
pub fn member_command(which: &str) -> Result<Command, BoxError> {
    let cmd = std::env::var("DBMUTEX_CHAOS_MEMBER_CMD")
        .map_err(|_| "set DBMUTEX_CHAOS_MEMBER_CMD (scripts/chaos.sh --etcd does)")?;
    let mut c = Command::new("sh");
    c.args(["-c", &format!("{cmd} {which}")]);
    Ok(c)
}
