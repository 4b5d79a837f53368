//! The command line: flags, subcommands and help text.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use clap_complete::Shell;

use crate::plan::duration::{parse_duration, parse_lock_delay, parse_once_per};

/// The exit statuses of `dbmutex run`, in `dbmutex --help` and `run --help`.
macro_rules! run_exit_table {
    () => {
        "Exit status of `dbmutex run`:
  the command's  the command ran; 128+N if it died of signal N
  75 (or -E N)   not acquired: -n conflict or -w timeout, or --once-per and not due;
                 the command did not run
  64             usage error: bad flag or value, empty name, no command, or an
                 option the backend does not support (-s on MySQL, --transaction
                 off PostgreSQL)
  69             server unreachable, authentication failed, another database error
                 before the command started, or the database lacks a table the
                 option needs (run `dbmutex init --database-url URL` as a role that
                 may create it), or holders of NAME's slots count another N than
                 --slots N; the command did not run
  70             the lock was lost while the command ran (its process group got
                 SIGTERM, then SIGKILL after --kill-after)
  78             --require-database and no database URL; the command did not run
  124            the command held the lock past --max-hold (its process group got
                 SIGTERM, then SIGKILL after --kill-after; then the lock was released)
  126, 127       the command could not be executed / was not found (as env(1))
  128+N          dbmutex got signal N while waiting; the command did not run
"
    };
}

const AFTER_HELP: &str = concat!(
    "\
Backend: --database-url, else env DBMUTEX_DATABASE_URL, else env DATABASE_URL
(postgres://, postgresql://, mysql://, mariadb://); with none of them, the local
backend (this host only): lock files under env DBMUTEX_LOCK_DIR, else
/run/lock/dbmutex, the same for every user and environment (cron, env -i, sudo).
--require-database (or env DBMUTEX_REQUIRE_DATABASE=1) refuses that fallback.
A URL without a password takes it as the database's own client does: PostgreSQL
from env PGPASSWORD, else the password file (env PGPASSFILE, else ~/.pgpass);
MySQL/MariaDB from the option files' password, else env MYSQL_PWD; a
MySQL/MariaDB URL without a user takes the option files' user, else the
login's name, and without a host the option files' host, port and socket, else
env MYSQL_HOST, MYSQL_TCP_PORT and MYSQL_UNIX_PORT, as the mysql client does
(option files: /etc/my.cnf, /etc/mysql/my.cnf, then ~/.my.cnf, their
[client], [client-server] and [client-mariadb] groups). A PostgreSQL URL takes what else it leaves out from env PGHOST, PGHOSTADDR,
PGPORT, PGUSER, PGDATABASE, PGSSLMODE, PGSSLROOTCERT and PGTARGETSESSIONATTRS,
as psql does, after the section of libpq's service file (~/.pg_service.conf,
else pg_service.conf in env PGSYSCONFDIR or /etc/postgresql-common) that the
URL's service=NAME or env PGSERVICE names: postgres:///db goes where psql goes
in the same environment.

The command runs in a process group of its own. Signals dbmutex gets, a lost
lock (SIGTERM, then SIGKILL after --kill-after) and dbmutex's own death, even by
SIGKILL, reach the whole group; processes left in it when the command exits are
stopped before the lock is released. Processes that leave the group (setsid)
are not reached.

",
    run_exit_table!(),
    "`dbmutex status` exits 0 when the lock is free and 1 when it is held (errors:
see `dbmutex status --help`).

While it waits, dbmutex says once (after 1 s) which lock it waits for and who
holds it (on PostgreSQL and MySQL: who held it when the wait began, read on the
connection that waits, so a waiter costs the server one connection); with -v it
says so again every 5 s, with the holders as they are then (there read on a
second, short-lived connection).
With -E 0 a lock that stays busy is not news: nothing is printed (unless -v).

--int takes NAME as an integer, as the Ruby gem's Integer lock names: the same
key as `with_advisory_lock(42)` (`dbmutex run --int 42 -- CMD`).

Examples:
  dbmutex run nightly-report -- ./report.sh          wait, then run
  dbmutex run -n nightly-report -- ./report.sh       skip if already running
  dbmutex run -w 2.5 -E 0 cache-x -c 'make cache'    wait 2.5 s at most; skip quietly
  DATABASE_URL=postgres://app@db/app dbmutex run --transaction sync-42 -- ./sync
  dbmutex status nightly-report
  dbmutex list --json
  dbmutex key nightly-report
  dbmutex init                                       create dbmutex's tables
  dbmutex run --int 42 -- ./sync                     the gem's with_advisory_lock(42)
  dbmutex run --fence sync-42 -c './sync --fence \"$DBMUTEX_FENCE\"'
  dbmutex run --max-hold 3600 backup -- ./backup.sh  stopped if still running after 1 h
  dbmutex run --slots 3 render -- ./render.sh        at most 3 at once, fleet-wide
  dbmutex run --once-per 1h report -- ./report.sh    at most once an hour, fleet-wide
  dbmutex completions bash > /etc/bash_completion.d/dbmutex
  dbmutex man > dbmutex.1; dbmutex man run > dbmutex-run.1"
);

const STATUS_AFTER_HELP: &str = "\
Exit status of `dbmutex status`:
  0    the lock is free (and, without --slots, none of its slots is held)
  1    the lock is held, or, without --slots, processes hold its slots
       (`run --slots`; state \"slots held\", with their number and the N they
       give; MySQL/MariaDB cannot tell N, and without a list of its user locks
       (MariaDB's metadata_lock_info plugin) asks each of 1024 slots: ~1 s)
  64   usage error: bad flag or value, empty name, a URL that is not a database
       URL or is malformed
  69   server unreachable, authentication failed, or another database error
  74   stdout could not be written
  78   --require-database and no database URL

With --json, an error is one JSON object on stdout too (nothing on stderr), with
the same exit status:
  {\"error\":{\"kind\":\"connect\",\"message\":\"...\",\"exit\":69}}
kind is one of: usage, invalid_name, config, unsupported, connect, database,
lock_file, require_database, output, other. Usage errors found while parsing the
command line (an unknown flag) are text on stderr, exit 64.

A holder's number is labelled with what it is: backend_pid (PostgreSQL: the
server process of its session, for pg_terminate_backend), connection_id
(MySQL/MariaDB: for KILL), client_pid (local backend: the holding process on
this host; null when it cannot be told). `list` labels them the same way.";

/// A mutex the database owns: flock(1) across hosts.
#[derive(Debug, Parser)]
// `disable_help_subcommand`: clap's own `help` subcommand rejects `help
// --help`; ours (Command::Help) takes it, and does the rest the same way.
#[command(
    name = "dbmutex",
    version,
    about,
    after_help = AFTER_HELP,
    propagate_version = true,
    disable_help_subcommand = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
pub struct Global {
    /// Database URL [default: env DBMUTEX_DATABASE_URL, else DATABASE_URL, else local]
    #[arg(long, global = true, value_name = "URL", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub database_url: Option<String>,

    /// Key prefix, as the Ruby gem's [default: env WITH_ADVISORY_LOCK_PREFIX]
    #[arg(long, global = true, value_name = "N")]
    pub prefix: Option<String>,

    /// Say on stderr how long the lock was waited for and held.
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    pub verbose: bool,

    /// Print nothing but errors (no waiting notice).
    #[arg(short, long, global = true)]
    pub quiet: bool,

    /// Refuse to fall back to the local backend when no database URL is set
    /// (exit 78) [default: env DBMUTEX_REQUIRE_DATABASE=1]
    #[arg(long, global = true)]
    pub require_database: bool,
}

// `defer`: a subcommand's arguments are built only when it is the one
// used, not all of them on every start (`dbmutex run x -- true`: 0.19 ms
// less, BENCHMARKS.md session 15).
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Run a command while holding the lock NAME.
    #[command(after_help = concat!(run_exit_table!(), "
Cron (every host runs the same line; one run per tick fleet-wide, silent when
another host has it): dbmutex run -n -E 0 --require-database --once-per 1h NAME -- CMD"), override_usage = "dbmutex run [OPTIONS] NAME -- COMMAND [ARGS...]\n       \
                          dbmutex run [OPTIONS] NAME -c 'SHELL COMMAND'")]
    Run(RunArgs),
    /// Say whether NAME is held, and by whom (exit 0 free, 1 held).
    #[command(after_help = STATUS_AFTER_HELP)]
    Status(StatusArgs),
    /// List the locks held on the server now.
    List(ListArgs),
    /// Print the database keys NAME maps to on each backend (MySQL and MariaDB differ for names of 65 to 192 bytes).
    Key(KeyArgs),
    /// Create the tables of fencing tokens (run --fence), once-per-window runs (run --once-per) and lock-delay records (run --lock-delay) and print the grants an application role then needs.
    #[command(after_help = "For deployments whose application role may not create tables \
                            (PostgreSQL 15 lets no ordinary role create in schema public): run once as \
                            a role that may. PostgreSQL creates dbmutex_fence and dbmutex_delay in schema public and \
                            dbmutex_runs in the current schema (the first existing one of the search_path), \
                            MySQL/MariaDB all three in the URL's database. Roles that may create them \
                            need no init: each table is created on first use. The local backend has \
                            nothing to create.")]
    Init,
    /// Print the shell completion script for SHELL to stdout.
    #[command(after_help = "Examples:\n  \
                            dbmutex completions bash > /etc/bash_completion.d/dbmutex\n  \
                            dbmutex completions zsh > \"${fpath[1]}/_dbmutex\"\n  \
                            dbmutex completions fish > ~/.config/fish/completions/dbmutex.fish")]
    Completions(CompletionsArgs),
    /// Print the man page (roff) of dbmutex, or of one of its subcommands, to stdout.
    #[command(after_help = "Examples:\n  \
                            dbmutex man > dbmutex.1 && man -l dbmutex.1\n  \
                            dbmutex man run > dbmutex-run.1")]
    Man(ManArgs),
    /// Print this help, or the help of the given subcommand.
    Help(HelpArgs),
}

// How NAME is read: as text (the default) or as an integer. (A plain
// comment: a doc comment here would be the `about` of every subcommand
// that flattens it, since their arguments are built when used, after the
// subcommand's own `about`: `defer` on `Command`.)
#[derive(Debug, Args)]
pub struct IntArg {
    /// NAME is an integer (-9223372036854775808 to 9223372036854775807): the
    /// same key as the Ruby gem's Integer lock names, `with_advisory_lock(42)`.
    #[arg(long = "int")]
    pub int: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The subcommand whose page to print (dbmutex-COMMAND(1)); default: dbmutex(1).
    #[arg(value_name = "COMMAND")]
    pub command: Option<String>,
}

#[derive(Debug, Args)]
pub struct HelpArgs {
    /// The subcommand to describe.
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Try once; if the lock is held, exit 75 (or -E) without running the command
    #[arg(short, long, conflicts_with = "timeout")]
    pub no_wait: bool,

    /// Wait at most DURATION (2.5, 250ms, 2s, 1m, 1h; 0 = --no-wait). Default: forever.
    /// The bound covers connecting: a pooler that queues the connection is
    /// waited for within it (at least 5 s, at most 1 h); a refused
    /// connection fails at once.
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub timeout: Option<Duration>,

    /// Take a shared lock (PostgreSQL and local; not MySQL).
    #[arg(short, long, overrides_with = "exclusive")]
    pub shared: bool,

    /// Take an exclusive lock (the default).
    #[arg(short = 'x', long, overrides_with = "shared")]
    pub exclusive: bool,

    /// Exit status when the lock is not acquired. With 0, a busy lock is not
    /// news: nothing is printed about it (unless -v).
    #[arg(short = 'E', long, value_name = "N", default_value_t = crate::exit::NOT_ACQUIRED)]
    pub conflict_exit_code: u8,

    /// PostgreSQL: hold a transaction-level lock (safe behind PgBouncer transaction pooling)
    #[arg(long)]
    pub transaction: bool,

    /// Issue a fencing token with the lock and export it to the command as
    /// DBMUTEX_FENCE (greater than every earlier holder's; exclusive session
    /// locks only). The command always gets DBMUTEX_LOCK_NAME.
    #[arg(long, conflicts_with_all = ["shared", "transaction"])]
    pub fence: bool,

    /// Time between SIGTERM and SIGKILL to the command's process group
    /// (lock lost, dbmutex killed, or processes left behind)
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_duration,
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub kill_after: Duration,

    /// Take one of N slots of NAME instead of the lock itself: at most N
    /// holders at once (the command gets DBMUTEX_SLOT=0..N-1). Every holder
    /// must give the same N: one that finds holders giving another exits 69
    /// without running the command
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: Option<u32>,

    /// Run at most once per DURATION (3600, 90s, 30m, 1h, 1d; not 0) across
    /// every host: under the lock, if NAME last started less than DURATION
    /// minus a grace (half of DURATION, at most 1 min) ago by the database
    /// server's clock, do not run the command and exit with the conflict
    /// status (-E), saying when and where it last ran. The grace absorbs
    /// cron's jitter and hosts' clock differences: --once-per equal to the
    /// cron period runs once per tick
    #[arg(long, value_name = "DURATION", value_parser = parse_once_per, conflicts_with_all = ["shared", "transaction", "slots"])]
    pub once_per: Option<Duration>,

    /// With --once-per: run now whatever the last run (a failed one, say),
    /// and count the window from this run
    #[arg(long, requires = "once_per")]
    pub reset_window: bool,

    /// Lock-delay: when a holder of NAME is lost uncleanly (killed, frozen,
    /// cut off), nobody gets the lock for DURATION after its last sign of
    /// life, by the server's clock, so its in-flight work drains first; a
    /// clean end opens it at once. Every holder of NAME should give the same
    /// DURATION (exclusive locks only; not 0)
    #[arg(long, value_name = "DURATION", value_parser = parse_lock_delay, conflicts_with_all = ["shared", "transaction"])]
    pub lock_delay: Option<Duration>,

    /// Stop the command (as when the lock is lost) and exit 124 if it still
    /// holds the lock after DURATION, so a hung job cannot hold it for ever
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_hold: Option<Duration>,

    /// Run SHELL COMMAND with $SHELL -c (else /bin/sh -c).
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL COMMAND",
        conflicts_with = "argv"
    )]
    pub shell_command: Option<OsString>,

    /// The lock's name (an integer with --int).
    #[arg(value_name = "NAME", allow_negative_numbers = true)]
    pub name: String,

    #[command(flatten)]
    pub int: IntArg,

    /// The command to run and its arguments.
    #[arg(value_name = "COMMAND", trailing_var_arg = true, allow_hyphen_values = true)]
    pub argv: Vec<OsString>,
}

impl RunArgs {
    /// The wait bound: `None` = forever.
    pub fn wait(&self) -> Option<Duration> {
        if self.no_wait {
            Some(Duration::ZERO)
        } else {
            self.timeout
        }
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The lock's name (an integer with --int).
    #[arg(allow_negative_numbers = true)]
    pub name: String,
    #[command(flatten)]
    pub int: IntArg,
    /// Report each of N slots of NAME (as `run --slots N` takes them);
    /// exit 1 only when every slot is held
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: Option<u32>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The lock's name (an integer with --int).
    #[arg(allow_negative_numbers = true)]
    pub name: String,
    #[command(flatten)]
    pub int: IntArg,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}
