//! A child process whose stdout lines arrive on a channel (a reader
//! thread), killed and reaped when dropped: the process tests' children
//! (this test binary re-run as a holder, or flock(1)). Included alone
//! (`#[path]`) by the tests that need no server.
#![allow(dead_code)]

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a child may stay silent when a line is expected.
const SILENCE: Duration = Duration::from_secs(30);

/// Takes `child`'s piped stdout and sends each of its lines.
pub fn of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let out = std::io::BufReader::new(child.stdout.take().expect("stdout piped"));
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    lines
}

/// A running child, its stdin and stdout piped.
pub struct Child {
    pub child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Child {
    /// Starts `cmd` with stdin and stdout piped.
    pub fn spawn(cmd: &mut Command) -> Child {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let lines = of(&mut child);
        Child { child, lines }
    }

    /// The child's next line (it must come within 30 s).
    pub fn line(&self) -> String {
        self.lines
            .recv_timeout(SILENCE)
            .unwrap_or_else(|e| panic!("the child went silent: {e}"))
    }

    /// A line the child has printed and nobody read yet, if any (no wait).
    pub fn printed(&self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    /// Blocks until the child prints `want` as a whole line.
    pub fn expect_line(&self, want: &str) {
        loop {
            match self.lines.recv_timeout(SILENCE) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("the child never printed {want:?}: {e}"),
            }
        }
    }

    /// Writes `line` to the child's stdin.
    pub fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin piped");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Sends `sig` (`kill(1)`'s form: `-STOP`, `-KILL`, …).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success(), "kill {sig}");
    }

    /// SIGKILL (no release, no goodbye), and reaped.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn pid(&self) -> i64 {
        i64::from(self.child.id())
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
