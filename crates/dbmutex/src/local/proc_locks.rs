//! Linux's table of file locks, `/proc/locks`: one line per lock with the
//! pid that took it, shared holders included, which the note in a lock file
//! cannot tell. A line reads
//! `1: FLOCK  ADVISORY  READ 9575 fe:00:10011791 0 EOF`
//! (device major and minor in hex, then the inode); waiters are listed with
//! `->` after the number and are skipped.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

use crate::Mode;

/// The `flock` holders of the file `meta` describes, as (pid, mode); pid 0
/// when the holder is in a pid namespace this process cannot see. `None`
/// when the table cannot be read (not Linux, or hidden) or does not list the
/// file (a file system whose `stat` device differs from the lock table's).
///
/// The table is not read at once: the kernel hands it out a page at a time,
/// walking its list of locks afresh for each, so a lock taken or released
/// elsewhere between two pages shifts the rest and a line can come twice
/// or not at all (seen: this process's two locks listed four times, with
/// the table over a page and other processes locking). So the file's lines
/// are read until two reads in a row agree, at most [`READS`] times.
pub(crate) fn holders_of(meta: &Metadata) -> Option<Vec<(i64, Mode)>> {
    let (device, ino) = (device(meta.dev()), meta.ino());
    let read = || Some(parse(&std::fs::read_to_string("/proc/locks").ok()?, &device, ino));
    let mut found = read()?;
    for _ in 1..READS {
        let again = read()?;
        if again == found {
            break;
        }
        found = again;
    }
    (!found.is_empty()).then_some(found)
}

/// How many times [`holders_of`] reads the table at most.
const READS: usize = 5;

/// `major:minor` in hex as the kernel prints it.
fn device(dev: u64) -> String {
    format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev))
}

fn parse(table: &str, device: &str, ino: u64) -> Vec<(i64, Mode)> {
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            if fields.next()? != "FLOCK" {
                return None;
            }
            let mode = match fields.nth(1)? {
                "READ" => Mode::Shared,
                "WRITE" => Mode::Exclusive,
                _ => return None,
            };
            let pid: i64 = fields.next()?.parse().ok()?;
            let (dev, file) = fields.next()?.rsplit_once(':')?;
            (dev == device && file.parse() == Ok(ino)).then_some((pid.max(0), mode))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_print_as_the_kernel_does() {
        assert_eq!(device(0xfe00), "fe:00");
        assert_eq!(device(0x2d), "00:2d");
        // A large minor spills into the high bits of dev_t.
        assert_eq!(device((0x103 << 8) | 0x45 | (0x12 << 12 << 8)), "103:1245");
    }

    #[test]
    fn lines_for_one_file() {
        let table = "1: FLOCK  ADVISORY  READ 9575 fe:00:10011791 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 9410 fe:00:5513221 0 EOF\n\
                     3: POSIX  ADVISORY  WRITE 3780 fe:00:10011791 0 EOF\n\
                     4: FLOCK  ADVISORY  READ 9573 fe:00:10011791 0 EOF\n\
                     4: -> FLOCK  ADVISORY  WRITE 9999 fe:00:10011791 0 EOF\n\
                     5: FLOCK  ADVISORY  READ 9576 fe:01:10011791 0 EOF\n\
                     6: FLOCK  ADVISORY  WRITE -1 fe:00:42 0 EOF\n";
        assert_eq!(
            parse(table, "fe:00", 10_011_791),
            vec![(9575, Mode::Shared), (9573, Mode::Shared)],
            "fcntl locks, waiters and other devices are not holders"
        );
        assert_eq!(parse(table, "fe:00", 42), vec![(0, Mode::Exclusive)]);
        assert!(parse(table, "fe:00", 7).is_empty());
    }

    #[test]
    fn this_process_is_listed() {
        let dir = crate::local::tests::TempDir::new("proc");
        let path = dir.path().join("l.lock");
        let f = std::fs::File::create(&path).unwrap();
        f.lock_shared().unwrap();
        let g = std::fs::File::open(&path).unwrap();
        g.lock_shared().unwrap();
        let Some(found) = holders_of(&f.metadata().unwrap()) else {
            // Not Linux, or /proc hidden: the backend falls back to the note.
            assert!(std::fs::read_to_string("/proc/locks").is_err());
            return;
        };
        let me = i64::from(std::process::id());
        assert_eq!(found, vec![(me, Mode::Shared), (me, Mode::Shared)]);
    }
}
