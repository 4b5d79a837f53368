//! Data types every layer shares: which backend, what it can do, who holds
//! a lock. They import nothing of the layers above them.

use crate::{LockName, Mode};

/// Which backend a [`Locker`](crate::Locker) talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// PostgreSQL advisory locks.
    Postgres,
    /// MySQL / MariaDB `GET_LOCK`.
    Mysql,
    /// Lock files on this host, plus in-process arbitration.
    Local,
    /// etcd leases and revisions (feature `etcd`).
    Etcd,
}

impl BackendKind {
    /// `"postgres"`, `"mysql"`, `"local"` or `"etcd"`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Postgres => "postgres",
            BackendKind::Mysql => "mysql",
            BackendKind::Local => "local",
            BackendKind::Etcd => "etcd",
        }
    }

    /// The backend a URL's scheme names, whatever its case:
    /// `postgres://` and `postgresql://`, `mysql://` and `mariadb://`,
    /// `file://` (the local backend), `etcd://`. `None` for anything else. The one
    /// table of schemes: [`Locker::connect`](crate::Locker::connect) and the
    /// `dbmutex` command line both read it.
    ///
    /// ```
    /// use dbmutex::BackendKind;
    /// assert_eq!(BackendKind::from_url("mariadb://root@127.0.0.1/test"), Some(BackendKind::Mysql));
    /// assert_eq!(BackendKind::from_url("file:///run/lock/dbmutex"), Some(BackendKind::Local));
    /// assert_eq!(BackendKind::from_url("redis://127.0.0.1"), None);
    /// ```
    pub fn from_url(url: &str) -> Option<BackendKind> {
        let (scheme, _) = split_scheme(url)?;
        Self::from_scheme(&scheme)
    }

    /// The backend a lowercased scheme names.
    pub(crate) fn from_scheme(scheme: &str) -> Option<BackendKind> {
        match scheme {
            "postgres" | "postgresql" => Some(BackendKind::Postgres),
            "mysql" | "mariadb" => Some(BackendKind::Mysql),
            "file" => Some(BackendKind::Local),
            "etcd" => Some(BackendKind::Etcd),
            _ => None,
        }
    }

    /// What this backend can do: the one capability table (README's
    /// comparison table says the same in words).
    pub fn capabilities(self) -> Capabilities {
        match self {
            BackendKind::Postgres => Capabilities {
                shared: true,
                transaction: true,
                server_wait: true,
                can_lose: true,
                session_locks: true,
                fencing: true,
                upgrade: true,
            },
            BackendKind::Mysql => Capabilities {
                shared: false,
                transaction: false,
                server_wait: true,
                can_lose: true,
                session_locks: true,
                fencing: true,
                upgrade: false,
            },
            BackendKind::Local => Capabilities {
                shared: true,
                transaction: false,
                server_wait: false,
                can_lose: false,
                session_locks: true,
                fencing: true,
                upgrade: false,
            },
            BackendKind::Etcd => Capabilities {
                shared: false,
                transaction: false,
                server_wait: true,
                can_lose: true,
                session_locks: true,
                fencing: true,
                upgrade: false,
            },
        }
    }
}

/// What a backend can do (see [`BackendKind::capabilities`]); an option it
/// cannot honour is refused with [`Error::Unsupported`](crate::Error::Unsupported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Shared (read) locks beside exclusive ones.
    pub shared: bool,
    /// Transaction-level locks ([`LockOptions::transaction`](crate::LockOptions::transaction)).
    pub transaction: bool,
    /// Waits in the server, with the server's deadlock detection; without
    /// it, waits poll.
    pub server_wait: bool,
    /// A held lock can be lost (its server connection can end); the local
    /// backend's locks live as long as the process.
    pub can_lose: bool,
    /// Locks held until released (not only until a transaction ends).
    /// Always true of a backend; false on a [`Locker`](crate::Locker)
    /// whose PostgreSQL server sits behind a transaction pooler (see
    /// [`Locker::capabilities`](crate::Locker::capabilities)).
    pub session_locks: bool,
    /// Fencing tokens ([`LockOptions::fenced`](crate::LockOptions::fenced)).
    pub fencing: bool,
    /// Upgrade inside one task: a nested scoped exclusive call inside a
    /// scoped shared one for the same name takes it exclusive without
    /// letting the shared lock go (see
    /// [`Locker::with_lock`](crate::Locker::with_lock)). The local backend
    /// cannot (`flock(2)` drops the shared lock to convert it), MySQL has no
    /// shared locks.
    pub upgrade: bool,
}

/// Who holds a lock, as the server reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// Who holds it, labelled with what the number is: see [`HolderId`].
    pub id: HolderId,
    /// The number in [`Holder::id`] (0 where unknown): PostgreSQL's
    /// backend process id, MySQL's connection id or, on the local backend,
    /// the holding process's id, on etcd the holding process's id from the
    /// key's note, else the key's lease id. Prefer `id`, which says which.
    pub pid: i64,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The holder's `application_name` (PostgreSQL), or program name.
    pub application: Option<String>,
    /// The database user.
    pub user: Option<String>,
    /// The holder's client address (`host:port` or `local`).
    pub client: Option<String>,
    /// Since when, in RFC 3339 UTC with microseconds
    /// (`2026-12-02T14:56:37.541500Z`) on every backend: on PostgreSQL the
    /// holder's transaction start, else its connection start; on MariaDB
    /// the lock's age where the server tells it (`metadata_lock_info`),
    /// else the start of the holder connection's current command (whole
    /// seconds); on the local backend the holder's note, when it wrote one;
    /// on etcd the note in the holder's key (when dbmutex put it).
    pub since: Option<String>,
}

/// Who holds a lock, in its backend's terms (see [`Holder::id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HolderId {
    /// PostgreSQL: the holding session's server process id
    /// (`pg_stat_activity.pid`, what `pg_terminate_backend` takes); not a
    /// process of the client's host.
    BackendPid(i64),
    /// MySQL/MariaDB: the holding connection's id (`CONNECTION_ID()`,
    /// what `KILL` takes).
    ConnectionId(i64),
    /// Local backend: the holding process's id, on this host; etcd: the
    /// holding process's id (on its host) from the key's note.
    ClientPid(i64),
    /// etcd: the lease the holder's key is attached to (what `etcdctl lease
    /// revoke` takes), for a key without dbmutex's note (`etcdctl lock`);
    /// a dbmutex holder is its [`HolderId::ClientPid`].
    LeaseId(i64),
    /// Local backend: a holder whose process could not be told (a shared
    /// holder when `/proc/locks` cannot be read).
    Unknown,
}

impl HolderId {
    /// The label of the number: `backend_pid`, `connection_id`,
    /// `client_pid` (also for [`HolderId::Unknown`], whose value is none).
    pub fn label(self) -> &'static str {
        match self {
            HolderId::BackendPid(_) => "backend_pid",
            HolderId::ConnectionId(_) => "connection_id",
            HolderId::LeaseId(_) => "lease_id",
            HolderId::ClientPid(_) | HolderId::Unknown => "client_pid",
        }
    }

    /// The number, where known.
    pub fn value(self) -> Option<i64> {
        match self {
            HolderId::BackendPid(n)
            | HolderId::ConnectionId(n)
            | HolderId::ClientPid(n)
            | HolderId::LeaseId(n) => Some(n),
            HolderId::Unknown => None,
        }
    }
}

/// One lock in [`Locker::list`](crate::Locker::list).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedLock {
    /// The lock's name, where it can be known (PostgreSQL: from the lock
    /// statement's SQL comment, which the gem writes too). `None` (`name:
    /// null` in `dbmutex list --json`) where it cannot: on PostgreSQL, a
    /// name containing `/*` or `*/` (it cannot ride in a comment), a key
    /// taken without a comment (raw keys, psql) or a session whose last
    /// statement was another; on MariaDB, a name over 64 bytes (the
    /// server's lock list does not show it whole). The lock itself still
    /// excludes as any other.
    pub name: Option<String>,
    /// The database key: `k1 k2` or `k` (PostgreSQL), the lock string (MySQL),
    /// the lock file name (local), the queue's key prefix (etcd).
    pub key: String,
    /// Who holds it.
    pub holder: Holder,
}

/// A lock held by the current task through [`Locker::with_lock`](crate::Locker::with_lock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// The lock's name.
    pub name: LockName,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The backend that holds it.
    pub backend: BackendKind,
    /// The fencing token it was acquired with
    /// ([`LockOptions::fenced`](crate::LockOptions::fenced)), else `None`:
    /// how a scoped call's closure reads its token.
    pub fence: Option<u64>,
    pub(crate) locker_id: u64,
}

impl HeldLock {
    /// Whether this held lock already grants `other` (whatever its token):
    /// the same name on the same locker, in the same mode or exclusive
    /// (which covers shared). A nested scoped call for it is re-entrant.
    pub(crate) fn is_same_lock(&self, other: &HeldLock) -> bool {
        (self.mode == other.mode || self.mode == Mode::Exclusive)
            && (&self.name, self.backend, self.locker_id) == (&other.name, other.backend, other.locker_id)
    }

    /// A shared lock that a nested exclusive call for the same name, on the
    /// same locker, upgrades.
    pub(crate) fn is_upgraded_by(&self, other: &HeldLock) -> bool {
        self.mode == Mode::Shared
            && other.mode == Mode::Exclusive
            && (&self.name, self.backend, self.locker_id) == (&other.name, other.backend, other.locker_id)
    }
}

/// The result of a scoped call: the closure's value, or "not acquired".
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// The lock was acquired and the closure returned this value.
    Acquired(T),
    /// The lock was not acquired within the wait; the closure did not run.
    NotAcquired,
}

impl<T> Outcome<T> {
    /// `Some(value)` if the closure ran.
    pub fn acquired(self) -> Option<T> {
        match self {
            Outcome::Acquired(v) => Some(v),
            Outcome::NotAcquired => None,
        }
    }

    /// True if the closure ran.
    pub fn was_acquired(&self) -> bool {
        matches!(self, Outcome::Acquired(_))
    }
}

impl<T, E> Outcome<std::result::Result<T, E>> {
    /// `Outcome<Result<T, E>>` as `Result<Outcome<T>, E>`: the closure's
    /// error comes out, "not acquired" stays an outcome.
    pub fn transpose(self) -> std::result::Result<Outcome<T>, E> {
        match self {
            Outcome::Acquired(r) => r.map(Outcome::Acquired),
            Outcome::NotAcquired => Ok(Outcome::NotAcquired),
        }
    }
}

/// The URL's scheme, lowercased, and what follows `://`; `None` unless the
/// text before `://` is a well-formed scheme (RFC 3986: a letter, then
/// letters, digits, `+`, `-`, `.`), so a malformed string's text is never
/// shown as its "scheme".
pub(crate) fn split_scheme(url: &str) -> Option<(String, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && scheme.len() <= 32;
    ok.then(|| (scheme.to_ascii_lowercase(), rest))
}
