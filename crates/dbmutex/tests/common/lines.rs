//! A child process's stdout, line by line, on a channel (a reader thread):
//! for the local backend's process tests, which include this file alone
//! (`#[path]`).

use std::io::BufRead;
use std::sync::mpsc;

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
