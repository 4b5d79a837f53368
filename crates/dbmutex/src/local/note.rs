//! The note in a lock file about who holds it.
//!
//! The OS lock on the file is the lock; the file's content is only a note for
//! `holders` and `list`. It is UTF-8 text:
//!
//! ```text
//! dbmutex-lock 1
//! pid 4242
//! application dbmutex
//! since 2025-01-02T03:04:05.000000Z
//! name 6
//! report
//! ```
//!
//! An exclusive holder writes the whole note once it has the lock. Shared
//! holders are many at once and would clobber each other's notes, so a shared
//! holder writes only the magic line and the `name` part, and only into an
//! empty file: all shared holders of one file write the same bytes, so their
//! writes cannot garble each other. `name` is the text the file name hashes
//! (prefix + name) with its length in bytes, so a note read while it is being
//! written never yields a wrong name.

use jiff::Timestamp;

const MAGIC: &str = "dbmutex-lock 1\n";

/// What a note says; `None` where it says nothing (or nothing readable).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Note {
    pub(crate) pid: Option<i64>,
    pub(crate) application: Option<String>,
    pub(crate) since: Option<String>,
    pub(crate) name: Option<String>,
}

/// The note an exclusive holder writes: this process, now.
pub(crate) fn exclusive(name: &str, application: &str) -> Vec<u8> {
    let application: String = application
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!(
        "{MAGIC}pid {}\napplication {application}\nsince {}\n{}",
        std::process::id(),
        format_utc(Timestamp::now()),
        name_part(name)
    )
    .into_bytes()
}

/// The note a shared holder writes into an empty file: the name only.
pub(crate) fn shared(name: &str) -> Vec<u8> {
    format!("{MAGIC}{}", name_part(name)).into_bytes()
}

fn name_part(name: &str) -> String {
    format!("name {}\n{name}", name.len())
}

/// Reads a note leniently: a missing, foreign or half-written file gives
/// whatever fields are complete.
pub(crate) fn parse(bytes: &[u8]) -> Note {
    let mut note = Note::default();
    let Some(mut rest) = bytes.strip_prefix(MAGIC.as_bytes()) else {
        return note;
    };
    while let Some(end) = rest.iter().position(|&b| b == b'\n') {
        let Some((key, value)) = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|l| l.split_once(' '))
        else {
            break;
        };
        rest = &rest[end + 1..];
        match key {
            "pid" => note.pid = value.parse().ok(),
            "application" => note.application = Some(value.to_owned()),
            "since" => note.since = Some(value.to_owned()),
            "name" => {
                // More bytes than announced is the tail of an older, longer
                // note that the writer has not cut off yet.
                note.name = value
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| rest.get(..n))
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(str::to_owned);
                break;
            }
            // A field from a later version of this format.
            _ => {}
        }
    }
    note
}

/// A time as PostgreSQL prints a UTC `timestamptz` (`2025-01-02
/// 03:04:05+00`), so both backends' holders read alike.
fn format_utc(time: Timestamp) -> String {
    time.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_vectors() {
        let utc = |secs| format_utc(Timestamp::from_second(secs).unwrap());
        assert_eq!(utc(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00.000000Z");
        assert_eq!(utc(1_700_000_000), "2023-11-14T22:13:20.000000Z");
        assert_eq!(utc(4_107_542_399), "2100-02-28T23:59:59.000000Z");
        let micros = Timestamp::from_microsecond(1_700_000_000_123_456).unwrap();
        assert_eq!(format_utc(micros), "2023-11-14T22:13:20.123456Z");
    }

    #[test]
    fn exclusive_round_trip() {
        let name = "line one\nline two é";
        let note = parse(&exclusive(name, "my\napp"));
        assert_eq!(note.pid, Some(i64::from(std::process::id())));
        assert_eq!(note.application.as_deref(), Some("my app"));
        assert!(note
            .since
            .as_deref()
            .is_some_and(|s| s.ends_with('Z') && s.contains('T')));
        assert_eq!(note.name.as_deref(), Some(name));
    }

    #[test]
    fn shared_note_names_only() {
        let note = parse(&shared("report"));
        assert_eq!(
            note,
            Note {
                name: Some("report".into()),
                ..Note::default()
            }
        );
    }

    #[test]
    fn partial_and_foreign_content() {
        assert_eq!(parse(b""), Note::default());
        assert_eq!(parse(b"4242\n"), Note::default(), "not our format");
        let full = exclusive("report", "dbmutex");
        for cut in 0..full.len() {
            let note = parse(&full[..cut]);
            assert!(
                note.name.is_none(),
                "a cut note never yields a name ({cut} bytes)"
            );
        }
        let mut longer = full.clone();
        longer.extend_from_slice(b"tail of an older note");
        assert_eq!(parse(&longer).name.as_deref(), Some("report"));
    }
}
