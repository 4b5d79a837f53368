//! The statement texts, fixed: what the server runs is part of what is
//! reviewed.

use std::time::Duration;

use super::*;

#[test]
fn names() {
    assert_eq!(
        function(Call::Try, false, Mode::Exclusive),
        "pg_try_advisory_lock"
    );
    assert_eq!(
        function(Call::Wait, true, Mode::Shared),
        "pg_advisory_xact_lock_shared"
    );
    assert_eq!(
        function(Call::Unlock, false, Mode::Shared),
        "pg_advisory_unlock_shared"
    );
    let (s, _) = bound(
        Call::Try,
        false,
        Mode::Exclusive,
        &PgKey::Pair(1, 2),
        Some(&"a*/b".into()),
        "ab12",
    );
    assert_eq!(
        s,
        "SELECT pg_try_advisory_lock($1, $2) WHERE current_setting('dbmutex.owner', true) = $3 /* a--b */"
    );
    assert_eq!(
        inline(
            Call::Wait,
            false,
            Mode::Exclusive,
            &PgKey::Big(-5),
            Some(&"x".into()),
            "ab12"
        ),
        "SELECT pg_advisory_lock(-5) WHERE current_setting('dbmutex.owner', true) = 'ab12' /* x */"
    );
    assert_eq!(
        inline(Call::Wait, false, Mode::Exclusive, &PgKey::Big(-5), None, "ab12"),
        "SELECT pg_advisory_lock(-5) WHERE current_setting('dbmutex.owner', true) = 'ab12'",
        "name comments off: no comment"
    );
    assert!(inline(Call::Wait, true, Mode::Exclusive, &PgKey::Big(-5), Some(&"x".into()), "")
            .starts_with("SELECT pg_advisory_xact_lock(-5) WHERE (coalesce(current_setting('dbmutex.owner', true), '') IN ('', '') OR NOT EXISTS"));
}

#[test]
fn prepared_bodies_inline_only_the_token() {
    assert_eq!(
        prepared_body(Call::Try, Mode::Shared, &PgKey::Pair(1, 2), Some("ab12")),
        "SELECT pg_try_advisory_lock_shared($1, $2) WHERE current_setting('dbmutex.owner', true) = 'ab12'"
    );
    assert_eq!(
        prepared_body(Call::Unlock, Mode::Exclusive, &PgKey::Big(9), Some("ab12")),
        "SELECT pg_advisory_unlock($1) WHERE current_setting('dbmutex.owner', true) = 'ab12'"
    );
    assert_eq!(
        prepared_body(Call::Wait, Mode::Exclusive, &PgKey::Pair(1, 2), None),
        "SELECT pg_advisory_lock($1, $2)",
        "on a connection nothing can move: the raw statement"
    );
    assert_eq!(
        bounded_wait_plain(Mode::Shared, &PgKey::Big(3), None),
        "SELECT set_config('lock_timeout', $2, true), set_config('statement_timeout', '0', true), \
         pg_advisory_lock_shared($1)"
    );
}

/// The one bounded-wait recipe, in every shape its callers use.
#[tokio::test(start_paused = true)]
async fn bounded_waits() {
    let name: LockName = "a*/b".into();
    let key = PgKey::Pair(1, -2);
    let bounded = Deadline::after(Some(Duration::from_micros(300_500)));
    let w = |xact, claim, comment, within, form| BoundedWait {
        xact,
        mode: Mode::Exclusive,
        key: &key,
        claim,
        comment,
        within,
        form,
    };
    const SET: &str = "set_config('lock_timeout', '301ms', true), set_config('statement_timeout', '0', true)";
    const GUARD: &str = "current_setting('dbmutex.owner', true) = 'ab12'";
    // A lock session's, one preparable statement (the key, then the bound;
    // the connection's claim token inlined).
    let prepared = w(false, Some("ab12"), None, Within::Autocommit, Form::Bound);
    assert_eq!(
        prepared.text(),
        "SELECT set_config('lock_timeout', $3, true), set_config('statement_timeout', '0', true), \
             pg_advisory_lock($1, $2) WHERE current_setting('dbmutex.owner', true) = 'ab12'"
    );
    assert_eq!(
        prepared.text(),
        bounded_wait_plain(Mode::Exclusive, &key, Some("ab12"))
    );
    assert_eq!(prepared.rows(), 1);
    assert_eq!(
        BoundedWait {
            mode: Mode::Shared,
            key: &PgKey::Big(7),
            comment: Some(&name),
            ..prepared
        }
        .text(),
        "SELECT set_config('lock_timeout', $2, true), set_config('statement_timeout', '0', true), \
             pg_advisory_lock_shared($1) WHERE current_setting('dbmutex.owner', true) = 'ab12' /* a--b */"
    );
    // A session lock on a dedicated connection (and an upgrade's request).
    let session = w(
        false,
        Some("ab12"),
        Some(&name),
        Within::Autocommit,
        Form::Inline(bounded),
    );
    assert_eq!(
        session.text(),
        format!("SELECT {SET}; SELECT pg_advisory_lock(1,-2) WHERE {GUARD} /* a--b */")
    );
    assert_eq!(session.rows(), 2, "the settings' row and the lock's");
    // A transaction lock in a transaction of its own: the settings back
    // to the session's once it is granted.
    let xact = w(
        true,
        Some("ab12"),
        None,
        Within::NewTransaction,
        Form::Inline(Deadline::NEVER),
    );
    let text = xact.text();
    assert!(
            text.starts_with(
                "BEGIN; SELECT set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true); \
                 SELECT pg_advisory_xact_lock(1,-2) WHERE (coalesce(current_setting('dbmutex.owner', true), '') IN ('', 'ab12') OR NOT EXISTS"
            ),
            "{text}"
        );
    assert!(
        text.ends_with("; SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT"),
        "{text}"
    );
    assert_eq!(xact.rows(), 2);
    // On a caller's connection: no guard for a session lock, in
    // autocommit or in the caller's transaction (a savepoint, the old
    // values read first).
    let caller = w(
        false,
        None,
        Some(&name),
        Within::Autocommit,
        Form::Inline(bounded),
    );
    assert_eq!(
        caller.text(),
        format!("SELECT {SET}; SELECT pg_advisory_lock(1,-2) /* a--b */")
    );
    let in_tx = w(
        false,
        None,
        Some(&name),
        Within::OpenTransaction,
        Form::Inline(bounded),
    );
    assert_eq!(
        in_tx.text(),
        format!(
            "SAVEPOINT dbmutex_wait; SELECT current_setting('lock_timeout'); \
                 SELECT current_setting('statement_timeout'); SELECT {SET}; \
                 SELECT pg_advisory_lock(1,-2) /* a--b */; RELEASE SAVEPOINT dbmutex_wait"
        )
    );
    assert_eq!(in_tx.rows(), 4);
    let caller_xact = w(
        true,
        Some(""),
        None,
        Within::OpenTransaction,
        Form::Inline(bounded),
    );
    assert!(caller_xact
            .text()
            .contains("SELECT pg_advisory_xact_lock(1,-2) WHERE (coalesce(current_setting('dbmutex.owner', true), '') IN ('', '') OR"));
    assert_eq!(
        restore_settings("7s", r"a'b\c"),
        r"SELECT set_config('lock_timeout', E'7s', true), set_config('statement_timeout', E'a''b\\c', true)"
    );
}

#[tokio::test(start_paused = true)]
async fn timeouts_round_up_within_the_servers_range() {
    let after = |d| lock_timeout(Deadline::after(Some(d)));
    assert_eq!(after(Duration::from_micros(1)), "1ms");
    assert_eq!(after(Duration::from_millis(300)), "300ms");
    assert_eq!(after(Duration::from_micros(300_500)), "301ms");
    assert_eq!(
        after(Duration::ZERO),
        "1ms",
        "passed: the shortest bound, not none"
    );
    assert_eq!(after(Duration::from_secs(40 * 86_400)), format!("{}ms", i32::MAX));
    assert_eq!(lock_timeout(Deadline::NEVER), "0");
    assert_eq!(after(Duration::MAX), "0", "beyond the clock: forever");
}
