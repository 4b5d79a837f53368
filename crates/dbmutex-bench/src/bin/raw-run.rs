//! `raw-run URL KEY CMD [ARGS…]`: the raw floor of `dbmutex run NAME -- CMD`
//! on PostgreSQL, for `scripts/cli-overhead.sh`. One tokio-postgres
//! connection, `pg_try_advisory_lock(KEY)` in one round trip, the command
//! run to its end, `pg_advisory_unlock(KEY)` in one round trip, exit with the
//! command's status (75 if the lock was busy, 69 if the server failed).
//!
//! What a hand-written wrapper would do and no less: what `dbmutex run` adds
//! on top (the claim that finds a pooler or a standby, the server's dead-peer
//! settings, the process group and its guardian, signals, the heartbeat) is
//! what this floor leaves out, so the difference is its price.
//! Plaintext only (`NoTls`): give the URL `sslmode=disable`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, cmd, rest @ ..] = args.as_slice() else {
        eprintln!("usage: raw-run URL KEY CMD [ARGS...]");
        return ExitCode::from(64);
    };
    let Ok(key) = key.parse::<i64>() else {
        eprintln!("raw-run: KEY must be an integer");
        return ExitCode::from(64);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("raw-run: {e}");
            return ExitCode::from(71);
        }
    };
    match runtime.block_on(run(url, key, cmd, rest)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("raw-run: {e}");
            ExitCode::from(69)
        }
    }
}

async fn run(url: &str, key: i64, cmd: &str, args: &[String]) -> Result<u8, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(conn);
    let took = client
        .simple_query(&format!("SELECT pg_try_advisory_lock({key})"))
        .await?;
    if !answered_true(&took) {
        eprintln!("raw-run: lock {key} is busy");
        return Ok(75);
    }
    // Blocking is fine here: nothing else runs on this thread until the
    // command ends, and the connection has nothing to do meanwhile.
    let code = match std::process::Command::new(cmd).args(args).status() {
        Ok(s) => s.code().map_or(1, |c| c.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("raw-run: cannot run {cmd}: {e}");
            127
        }
    };
    client
        .simple_query(&format!("SELECT pg_advisory_unlock({key})"))
        .await?;
    drop(client);
    let _ = conn.await;
    Ok(code)
}

/// Whether a one-row, one-column `simple_query` answer says `t`.
fn answered_true(messages: &[tokio_postgres::SimpleQueryMessage]) -> bool {
    messages.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0) == Some("t"),
        _ => false,
    })
}
