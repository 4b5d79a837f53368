//! `dbmutex status`, `list` and `key`: what the server (or the key mapping)
//! says, as text for people or JSON for scripts.

use std::io::Write;

use dbmutex::key::{local_file_name, mysql_lock_string_for, pg_key, MysqlFlavour, PgKey};
use dbmutex::{Holder, LockName, Prefix};
use serde_json::{json, Map, Value};

use crate::backend::Target;
use crate::cli::{Global, IntArg, KeyArgs, ListArgs, StatusArgs};
use crate::exit::{self, Failure};
use crate::once;
use crate::say::shown;

/// Checks a lock name before anything connects. With `--int`, NAME is an
/// integer: [`LockName::Int`], the gem's Integer lock name.
pub fn valid_name(name: &str, int: &IntArg) -> Result<LockName, Failure> {
    let n = if int.int {
        let v: i64 = name.trim().parse().map_err(|_| {
            Failure::usage(format!(
                "--int: NAME {} is not an integer from {} to {}",
                shown_arg(name),
                i64::MIN,
                i64::MAX
            ))
        })?;
        LockName::Int(v)
    } else {
        LockName::from(name)
    };
    n.validate()?;
    Ok(n)
}

/// A user's argument quoted for a message (control characters escaped).
fn shown_arg(s: &str) -> String {
    format!("{s:?}")
}

/// The name as JSON shows it: a number for `--int`, else the string.
fn name_json(name: &LockName, given: &str) -> Value {
    match name {
        LockName::Int(n) => json!(n),
        _ => json!(given),
    }
}

/// Exit 0 when free, 1 when held.
pub async fn status(global: &Global, args: StatusArgs) -> Result<u8, Failure> {
    let json = args.json;
    json_errors(json, status_inner(global, args).await)
}

/// With `--json`, an error is printed as `{"error": {...}}` on stdout (and
/// not on stderr); the exit status is the same as without.
fn json_errors(json: bool, r: Result<u8, Failure>) -> Result<u8, Failure> {
    match r {
        Err(f) if json => {
            print(&json_line(&json!({
                "error": { "kind": f.kind(), "message": f.message, "exit": f.code }
            })))?;
            Ok(f.code)
        }
        r => r,
    }
}

async fn status_inner(global: &Global, args: StatusArgs) -> Result<u8, Failure> {
    let name = valid_name(&args.name, &args.int)?;
    let target = Target::choose(global)?;
    let locker = target.connect().await?;
    if let Some(n) = args.slots {
        return slots_status(&locker, &name, &args, n).await;
    }
    let holders = locker.holders(name.clone()).await?;
    // Holders of NAME's slots (`run --slots`) are holders too, whatever
    // they count (MySQL/MariaDB: found by asking each slot, count unknown).
    let slots = locker.slot_holders(&name.to_string()).await?;
    let in_slots = slots.holders;
    let state = match (holders.is_empty(), in_slots) {
        (false, _) => "held",
        (true, 0) => "free",
        (true, _) => "slots held",
    };
    let held = !holders.is_empty() || in_slots > 0;
    // The last once-per-window run, if any was recorded. A role that may
    // not read the table still gets the lock's state.
    let last_run = locker.last_run(name.clone()).await;
    let out = if args.json {
        let holders: Vec<Value> = holders.iter().map(|h| Value::Object(holder_json(h))).collect();
        let mut o = json!({
            "name": name_json(&name, &args.name),
            "backend": locker.backend().as_str(),
            "key": locker.key_of(name)?,
            "state": state,
            "held": held,
            "holders": holders,
            "slot_holders": slots.holders,
            "slot_counts": counts_json(&slots.counts),
            "last_run": last_run.as_ref().ok().and_then(|r| r.as_ref().map(once::json)),
        });
        if let Err(e) = &last_run {
            o["last_run_error"] = json!(exit::describe(e));
        }
        json_line(&o)
    } else {
        let mut s = format!("{state}\n");
        for h in &holders {
            s.push_str(&format!("{}: {}\n", h.mode.as_str(), holder_text(h)));
        }
        if slots.holders > 0 {
            s.push_str(&format!(
                "slots: {} {} of its slots ({}; `dbmutex status --slots N {}` shows each)\n",
                slots.holders,
                if slots.holders == 1 {
                    "process holds one"
                } else {
                    "processes hold some"
                },
                counts_text(&slots.counts),
                shown(&args.name)
            ));
        }
        match &last_run {
            Ok(Some(last)) => s.push_str(&format!("{}\n", once::text(last))),
            Ok(None) => {}
            Err(e) => s.push_str(&format!("last run: unknown ({})\n", exit::describe(e))),
        }
        s
    };
    print(&out)?;
    Ok(u8::from(held))
}

/// The slot counts holders give, for `status`: `[{"slots": 3, "holders": 2}]`.
fn counts_json(counts: &[(u32, usize)]) -> Value {
    Value::Array(
        counts
            .iter()
            .map(|(n, k)| json!({ "slots": n, "holders": k }))
            .collect(),
    )
}

/// "counting 3 slots", or "counting 3 slots (2), 5 slots (1): holders
/// disagree" when they give different counts.
fn counts_text(counts: &[(u32, usize)]) -> String {
    match counts {
        [] => "count unknown".into(),
        [(n, _)] => format!("counting {n} slots"),
        many => {
            let each: Vec<String> = many.iter().map(|(n, k)| format!("{n} slots ({k})")).collect();
            format!("counting {}: holders disagree", each.join(", "))
        }
    }
}

/// `status --slots N`: who holds which slot; 1 when every slot is held.
async fn slots_status(
    locker: &dbmutex::Locker,
    name: &LockName,
    args: &StatusArgs,
    n: u32,
) -> Result<u8, Failure> {
    let mut slots = Vec::new();
    for i in 0..n {
        let slot = LockName::Slot(name.to_string(), i);
        slots.push((i, locker.holders(slot).await?));
    }
    let free = slots.iter().filter(|(_, h)| h.is_empty()).count();
    // The counts holders give, where the backend can tell them (MySQL
    // cannot: its scan of every slot would tell nothing more here).
    let counts = if locker.capabilities().shared {
        locker.slot_holders(&name.to_string()).await?.counts
    } else {
        Vec::new()
    };
    let out = if args.json {
        let rows: Vec<Value> = slots
            .iter()
            .map(|(i, h)| {
                let holders: Vec<Value> = h.iter().map(|h| Value::Object(holder_json(h))).collect();
                json!({ "slot": i, "held": !h.is_empty(), "holders": holders })
            })
            .collect();
        json_line(&json!({
            "name": name_json(name, &args.name),
            "backend": locker.backend().as_str(),
            "slots": rows,
            "free": free,
            "slot_counts": counts_json(&counts),
        }))
    } else {
        let mut s = format!("{free} of {n} slots free\n");
        if counts.iter().any(|(m, _)| *m != n) {
            s.push_str(&format!("warning: holders are {}\n", counts_text(&counts)));
        }
        for (i, h) in &slots {
            if h.is_empty() {
                s.push_str(&format!("slot {i}: free\n"));
            }
            for h in h {
                s.push_str(&format!("slot {i}: {}: {}\n", h.mode.as_str(), holder_text(h)));
            }
        }
        s
    };
    print(&out)?;
    Ok(u8::from(free == 0))
}

pub async fn list(global: &Global, args: ListArgs) -> Result<u8, Failure> {
    let json = args.json;
    json_errors(json, list_inner(global, args).await)
}

async fn list_inner(global: &Global, args: ListArgs) -> Result<u8, Failure> {
    let target = Target::choose(global)?;
    let locker = target.connect().await?;
    let locks = locker.list().await?;
    let out = if args.json {
        let rows: Vec<Value> = locks
            .iter()
            .map(|l| {
                let mut m = Map::new();
                m.insert("name".into(), json!(l.name));
                m.insert("key".into(), json!(l.key));
                m.extend(holder_json(&l.holder));
                Value::Object(m)
            })
            .collect();
        json_line(&Value::Array(rows))
    } else {
        locks
            .iter()
            .map(|l| {
                let what = match &l.name {
                    Some(n) => format!("{} (key {})", shown(n), l.key),
                    None => format!("key {}", l.key),
                };
                format!("{what}: {}, {}\n", l.holder.mode.as_str(), holder_text(&l.holder))
            })
            .collect()
    };
    print(&out)?;
    Ok(0)
}

/// Needs no connection: the mapping is pure.
pub fn key(global: &Global, args: KeyArgs) -> Result<u8, Failure> {
    let json = args.json;
    json_errors(json, key_inner(global, args))
}

fn key_inner(global: &Global, args: KeyArgs) -> Result<u8, Failure> {
    let name = valid_name(&args.name, &args.int)?;
    let prefix = match &global.prefix {
        Some(p) => Prefix::new(p.clone()),
        None => Prefix::from_env(),
    };
    let pg = pg_key(&name, &prefix);
    // The lock string differs between the servers for names of 65–192
    // bytes (MariaDB takes them as they are, as the gem sends them).
    let mysql = mysql_lock_string_for(&name, &prefix, MysqlFlavour::Mysql)?;
    let mariadb = mysql_lock_string_for(&name, &prefix, MysqlFlavour::MariaDb)?;
    let local = local_file_name(&name, &prefix)?;
    let out = if args.json {
        let pg_json = match pg {
            PgKey::Pair(k1, k2) => json!({ "k1": k1, "k2": k2 }),
            PgKey::Big(k) => json!({ "key": k }),
            // A key form newer than this binary: its text form.
            other => json!({ "key": other.to_string() }),
        };
        json_line(&json!({
            "name": name_json(&name, &args.name),
            "prefix": prefix.text(),
            "postgres": pg_json,
            "mysql": mysql,
            "mariadb": mariadb,
            "local": local,
        }))
    } else {
        format!("postgres {pg}\nmysql {mysql}\nlocal {local}\nmariadb {mariadb}\n")
    };
    print(&out)?;
    Ok(0)
}

/// "backend pid 123, app x, user u, client 127.0.0.1:5000, since ..." with
/// what is known; the number is labelled with what it is (see
/// [`dbmutex::HolderId`]).
fn holder_text(h: &Holder) -> String {
    let id = h.id.value().map_or("unknown".into(), |n| n.to_string());
    let mut parts = vec![format!("{} {id}", h.id.label().replace('_', " "))];
    let fields = [
        ("app", &h.application),
        ("user", &h.user),
        ("client", &h.client),
        ("since", &h.since),
    ];
    for (label, value) in fields {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            parts.push(format!("{label} {}", shown(v)));
        }
    }
    parts.join(", ")
}

/// The waiting notice's "held by ..." part, for one or more holders.
pub fn holders_text(holders: &[Holder]) -> String {
    holders.iter().map(holder_text).collect::<Vec<_>>().join("; ")
}

fn holder_json(h: &Holder) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("mode".into(), json!(h.mode.as_str()));
    m.insert(h.id.label().into(), json!(h.id.value()));
    m.insert("application".into(), json!(h.application));
    m.insert("user".into(), json!(h.user));
    m.insert("client".into(), json!(h.client));
    m.insert("since".into(), json!(h.since));
    m
}

fn json_line(v: &Value) -> String {
    format!("{v}\n")
}

pub fn print(s: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(exit::IO_ERROR, format!("cannot write to stdout: {e}")))
}
