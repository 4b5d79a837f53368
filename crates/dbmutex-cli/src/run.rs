//! `dbmutex run`, in four steps: the arguments become a [`Plan`] (nothing
//! connects before it is valid), [`acquire`] takes the lock, the command
//! runs under it ([`under_lock`]: the once-per check, the [`Tree`]), and
//! [`finish`] releases the lock, in that one place whatever happened, and
//! picks the exit status. The command's guardian comes in forked (see
//! `main`).

use dbmutex::runs::Run;
use dbmutex::LockName;

use crate::acquire::{self, Held, Taken};
use crate::cli::{Global, RunArgs};
use crate::exit::{self, Failure};
use crate::group::{Exiting, Guardian};
use crate::once;
use crate::plan::Plan;
use crate::say::secs;
use crate::signals::Signals;
use crate::tree::{Ended, Tree};

pub async fn run(global: &Global, args: RunArgs, guardian: std::io::Result<Guardian>) -> Result<u8, Failure> {
    // The signal handlers before connecting: a signal during the wait is
    // never lost to the default action.
    let ready = Plan::new(global, args).and_then(|plan| Ok((plan, Signals::install()?)));
    let (plan, mut signals) = match ready {
        Ok(ready) => ready,
        Err(f) => {
            dismiss(guardian);
            return Err(f);
        }
    };
    let taken = acquire::take(&plan, &mut signals).await;
    let held = match taken {
        Ok(Taken::Held(held)) => *held,
        Ok(Taken::Not(code)) => {
            dismiss(guardian);
            return Ok(code);
        }
        Err(f) => {
            dismiss(guardian);
            return Err(f);
        }
    };
    let ended = under_lock(&plan, &held, guardian, &mut signals).await;
    let (outcome, guardian) = match ended {
        Ok((outcome, guardian)) => (Ok(outcome), guardian),
        Err(f) => (Err(f), None),
    };
    finish(&plan, outcome, held, guardian).await
}

/// Ends a guardian whose command never started.
fn dismiss(guardian: std::io::Result<Guardian>) {
    if let Ok(g) = guardian {
        g.dismiss();
    }
}

/// What happened under the lock.
enum Outcome {
    /// `--once-per` and the last run is too recent: the command did not run.
    NotDue,
    /// The command ran and ended so.
    Ran(Ended),
}

/// Everything done while the lock is held, up to the command's end; the
/// lock is released by the caller, whatever this returns. With the
/// outcome, the guardian of a command that ran, disarmed and exiting (the
/// caller reaps it once the unlock is on its way).
async fn under_lock(
    plan: &Plan,
    held: &Held,
    guardian: std::io::Result<Guardian>,
    signals: &mut Signals,
) -> Result<(Outcome, Option<Exiting>), Failure> {
    let guard = held.guard();
    if !guard.is_held() {
        dismiss(guardian);
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!(
                "lock {} was lost before the command started; not running it",
                plan.name
            ),
        ));
    }
    let run = match plan.once_per {
        None => None,
        Some(o) => match once::start(guard, o.window, o.reset, &plan.name, plan.busy).await {
            Ok(Some(run)) => Some(run),
            Ok(None) => {
                dismiss(guardian);
                return Ok((Outcome::NotDue, None));
            }
            Err(f) => {
                dismiss(guardian);
                return Err(f);
            }
        },
    };
    // What the command may want to know of its lock: the name as given, the
    // fencing token only when asked for (an inherited one, from an outer
    // `dbmutex run --fence`, is not this lock's: removed), the slot.
    // The database URL is dbmutex's, not the command's: it may hold a
    // password (DATABASE_URL, often the application's own, stays).
    let mut env = vec![
        ("DBMUTEX_LOCK_NAME", Some(plan.given_name.clone())),
        ("DBMUTEX_FENCE", guard.fence().map(|t| t.to_string())),
        ("DBMUTEX_DATABASE_URL", None),
    ];
    if let LockName::Slot(_, slot) = guard.name() {
        env.push(("DBMUTEX_SLOT", Some(slot.to_string())));
    }
    let ended = match Tree::start(
        &plan.program,
        &env,
        guardian,
        plan.kill_after,
        &plan.name,
        plan.say,
    ) {
        Ok(tree) => tree.run(guard, signals).await,
        Err(f) => {
            // Found by the check, gone (or not executable) by now: the
            // record says how this run ended.
            record_end(plan, held, run.as_ref(), f.code).await;
            return Err(f);
        }
    };
    // A once-per-window run's end, recorded while the lock is still held
    // (a lost lock keeps the start only).
    match &ended {
        Ok((Ended::Exited(code), _)) => record_end(plan, held, run.as_ref(), *code).await,
        Ok((Ended::MaxHold, _)) => record_end(plan, held, run.as_ref(), exit::MAX_HOLD).await,
        _ => {}
    }
    ended.map(|(ended, guardian)| (Outcome::Ran(ended), Some(guardian)))
}

async fn record_end(plan: &Plan, held: &Held, run: Option<&Run>, code: u8) {
    if let Some(run) = run {
        once::finish(held.guard(), run, code, &plan.name, plan.say).await;
    }
}

/// Releases the lock and picks the exit status: the command's, the
/// conflict status when a once-per run was not due, or 70 when the lock
/// did not last the whole run. The disarmed `guardian` is reaped once the
/// unlock has been answered: it exits while the server works.
async fn finish(
    plan: &Plan,
    outcome: Result<Outcome, Failure>,
    held: Held,
    guardian: Option<Exiting>,
) -> Result<u8, Failure> {
    let name = &plan.name;
    let held_for = held.guard().held_for();
    let held_throughout = held.guard().is_held();
    let released = held.release().await;
    drop(guardian);
    let code = match outcome? {
        Outcome::NotDue => return Ok(plan.conflict_exit_code),
        Outcome::Ran(Ended::Lost) => return Ok(exit::LOCK_LOST),
        // Stopped with the lock still held: it is released like any other.
        Outcome::Ran(Ended::MaxHold) => return Ok(exit::MAX_HOLD),
        Outcome::Ran(Ended::Exited(code)) => code,
    };
    match released {
        Err(dbmutex::Error::LockLost { .. }) => {}
        _ if !held_throughout => {}
        Ok(()) => {
            plan.say.detail(format_args!(
                "released lock {name} after holding it {}",
                secs(held_for)
            ));
            return Ok(code);
        }
        Err(e) => {
            // The library closes the connection (or our exit does), so the
            // server frees the lock.
            plan.say.error(format_args!(
                "could not confirm the release of lock {name}: {}",
                exit::describe(&e)
            ));
            return Ok(code);
        }
    }
    plan.say.error(format_args!(
        "lock {name} was lost while the command ran (it exited with status {code})"
    ));
    Ok(exit::LOCK_LOST)
}
