//! Lock names and the database keys they map to.
//!
//! The mapping is part of dbmutex's public contract: it is documented here,
//! tested with fixed vectors, and never changed silently. It follows the Ruby
//! gem `with_advisory_lock`, so a Rust worker and a Rails worker that lock the
//! same name exclude each other.
//!
//! # PostgreSQL
//!
//! | name | key | lock call |
//! |---|---|---|
//! | string `s` | `k1 = crc32(utf8(s)) & 0x7fffffff`, `k2 = prefix & 0x7fffffff` | `pg_*_advisory_lock(k1, k2)` (two `int4`) |
//! | integer `n` | `k1 = n & 0x7fffffff`, `k2 = prefix & 0x7fffffff` | `pg_*_advisory_lock(k1, k2)` |
//! | [`LockName::raw_i64`] | the `bigint` as given | `pg_*_advisory_lock(k)` (one `int8`) |
//! | [`LockName::raw_pair`] | the two `int4` as given | `pg_*_advisory_lock(a, b)` |
//!
//! `crc32` is zlib's (IEEE 802.3) CRC-32, as Ruby's `Zlib.crc32`. The prefix
//! comes from the API, else from the environment variable
//! `WITH_ADVISORY_LOCK_PREFIX`, read as Ruby's `String#to_i` reads it (leading
//! decimal digits; anything non-numeric is `0`).
//!
//! **Collisions.** `k1` has 31 bits, so two different names share a lock with
//! probability 2⁻³¹ per pair: with 1,000 names in use the chance that *some*
//! pair collides is about 0.02 %, with 10,000 names about 2.3 %. A collision
//! never breaks safety (two names that collide just exclude each other more
//! than needed), but it can make unrelated work wait. Use raw keys when you
//! manage a key space yourself. `bigint` keys and `int4` pairs are separate
//! lock spaces in PostgreSQL: `raw_i64(1)` and `raw_pair(0, 1)` never conflict.
//!
//! # MySQL and MariaDB
//!
//! The lock string is `prefix + name` (the prefix as written in the
//! environment variable, as the gem does) — exactly what the gem sends to
//! `GET_LOCK` — wherever the server accepts it:
//!
//! | server ([`MysqlFlavour`], read from `VERSION()` at connect) | passed unchanged when `prefix + name` has |
//! |---|---|
//! | MariaDB (limit measured on 10.11: 192 bytes; 193 fails with error 1059) | at most 192 bytes |
//! | MySQL (limit from MySQL 8's documentation, not measured: 64 characters, error 3057) | at most 64 characters and at most 192 bytes |
//!
//! Only a string the server would reject — where the gem itself fails — is
//! mapped, deterministically and the same way on both servers, to exactly
//! 64 characters: its first 47 characters (fewer if those pass 175 bytes),
//! `#`, and the first 16 hex digits of the SHA-256 of the whole string (see
//! [`mysql_lock_string_for`]). So on MariaDB a Rails worker and a Rust worker
//! share every name the gem can lock at all. The extra 192-byte cap on MySQL
//! (reached only by names with 4-byte characters) is a precaution, unmeasured;
//! it keeps the MySQL mapping what it was before dbmutex told the servers
//! apart. Integer names use their decimal form.
//!
//! Fixed vectors (unit tests `mysql_vectors`):
//!
//! | `prefix + name` | MariaDB | MySQL |
//! |---|---|---|
//! | `"a" × 64` | unchanged | unchanged |
//! | `"a" × 65` | unchanged | `"a" × 47 + "#635361c48bb9eab1"` |
//! | `"a" × 192` | unchanged | `"a" × 47 + "#7cee24628d290c16"` |
//! | `"a" × 193` | `"a" × 47 + "#33f93a9879ef18f9"` | the same |
//! | `"é" × 96` (96 characters, 192 bytes) | unchanged | `"é" × 47 + "#25187876b1179826"` |
//! | `"é" × 97` (194 bytes) | `"é" × 47 + "#6150e9b6b371f2b0"` | the same |
//! | `"😀" × 48` (48 characters, 192 bytes) | unchanged | unchanged |
//! | `"😀" × 49` (196 bytes) | `"😀" × 43 + "#2f4c9a2f211fb1e1"` (189 bytes) | the same |
//!
//! A mapped string cannot be turned back into its name;
//! [`Locker::list`](crate::Locker::list) shows the name for locks its own locker holds and
//! `None` for other holders' mapped strings (whose key still starts with the
//! name's first characters). Names are compared case-sensitively by MariaDB
//! and case-insensitively by MySQL 8: on MySQL 8, `Report` and `report` are
//! one lock.
//!
//! # Local backend
//!
//! One lock file per name: `<dir>/<head>-<hash>.lock`, where `head` is up to
//! 32 characters of the name made file-safe and `hash` the first 32 hex digits
//! of the SHA-256 of `prefix + name`.
//!
//! # etcd
//!
//! One lock is a queue of keys under one prefix (see [`etcd_lock_prefix`]):
//! `root/escaped/`, where `root` is the URL's path (`etcd://h:2379/team/locks`
//! → `team/locks`; [`ETCD_DEFAULT_ROOT`], `dbmutex`, when it has none) and
//! `escaped` is `prefix + name` with `%`, `/` and control characters written
//! as `%XX` (per UTF-8 byte), everything else unchanged. Integer names use
//! their decimal form. Each acquisition puts `root/escaped/<lease>-<n>`
//! (its session's lease id and a counter, in hex) with its lease; the key
//! with the lowest create revision holds the lock, as in etcd's own
//! `concurrency.Mutex` (so `etcdctl lock root/escaped` takes the same lock).
//!
//! | name | prefix | root | queue prefix |
//! |---|---|---|---|
//! | `job` | none | default | `dbmutex/job/` |
//! | `a/b%c` | none | default | `dbmutex/a%2Fb%25c/` |
//! | `42` (integer) | none | default | `dbmutex/42/` |
//! | `x` | `app:` | `team/locks` | `team/locks/app:x/` |
//!
//! # Slots
//!
//! Slot `i` of a semaphore `s` ([`LockName::Slot`], taken by
//! [`Locker::acquire_slot`](crate::Locker::acquire_slot)) is a lock of its
//! own. Its text `t` is `s`, a NUL byte, `slot ` and `i` in decimal — a NUL,
//! which no string name has, so no string or integer name maps to it:
//!
//! | backend | key of slot `i` of `s` |
//! |---|---|
//! | PostgreSQL | `k1 = crc32(utf8(t)) & 0x7fffffff`, `k2 = -1 - (prefix & 0x7fffffff)`: negative, where every string and integer name's `k2` is not |
//! | MySQL / MariaDB | always the mapped form: the first 47 characters of `prefix + s`, `#`, 16 hex digits of SHA-256(`prefix + t`) (the servers end a lock string at a NUL, so none is sent) |
//! | local | `<head>-<hash>.lock`, the hash over `prefix + t` |
//! | etcd | `root/` + `prefix + t` escaped (the NUL as `%00`) + `/`: `dbmutex/pool%00slot 3/` |
//!
//! Indices from [`SLOT_MARKERS`](crate::SLOT_MARKERS) (2^20) up are not
//! slots but the markers by which holders say how many slots they count
//! (see [`Locker::acquire_slot`](crate::Locker::acquire_slot), "Counts");
//! `list` shows them as it shows slots (`NAME [slot N]` on the local
//! backend, by key only on PostgreSQL and MySQL/MariaDB).

mod etcd;
mod local;
mod mysql;
mod name;
mod pg;

#[cfg(feature = "etcd")]
pub(crate) use etcd::etcd_name_of;
pub use etcd::{etcd_lock_prefix, ETCD_DEFAULT_ROOT};
pub use local::local_file_name;
pub(crate) use local::local_name_from_note;
#[cfg(feature = "mysql")]
pub(crate) use mysql::{mysql_as_listed, mysql_maybe_cut, mysql_name_of};
pub use mysql::{mysql_lock_string, mysql_lock_string_for, MysqlFlavour, MYSQL_MAX_BYTES, MYSQL_MAX_CHARS};
#[cfg(feature = "postgres")]
pub(crate) use pg::name_from_comments;
pub use pg::{gem_hash, pg_key, sql_comment, PgKey};

pub use name::{LockName, Prefix, MAX_NAME_BYTES, PREFIX_ENV};
