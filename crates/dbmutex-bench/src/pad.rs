//! `--fleet-pad-lines N`, an experiment on the fleet's A/A run
//! (BENCHMARKS.md, "Where a fleet worker's time goes"): the second raw
//! floor also runs N cache lines of code of its own per acquisition, to see
//! whether code touched (not instructions run) is what a fleet worker pays
//! for. Each line holds seven 8-byte NOPs and a jump to the next line, the
//! lines eight to a 4 KiB page and chained in a shuffled order, so neither
//! the next-line prefetcher nor a warm TLB entry hides them: N lines are
//! ~8 N instructions over N / 8 pages, as dbmutex's extra code is ~5,800
//! instructions over 564 lines and 68 pages (`scripts/callgrind.sh`).
//! x86-64 Linux only.

use std::io;

/// Lines per 4 KiB page.
const PER_PAGE: usize = 8;
/// `nopw 0x0(%rax,%rax,1)`: one 8-byte instruction.
const NOP8: [u8; 8] = [0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00];

/// The code, mapped executable for the process's life.
pub struct Pad {
    entry: extern "C" fn(),
}

impl Pad {
    /// Writes and maps `lines` lines of code (at least 1).
    pub fn new(lines: usize) -> io::Result<Pad> {
        if !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            return Err(io::Error::other("--fleet-pad-lines is for x86-64 Linux"));
        }
        let lines = lines.max(1);
        let len = lines.div_ceil(PER_PAGE) * 4096;
        let mut code = vec![0xccu8; len];
        // Slot i: page i / 8, at byte (i % 8) * 512 of it; the chain visits
        // them in a shuffled order (xorshift, fixed seed: the same in every
        // worker).
        let mut order: Vec<usize> = (0..lines).collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let at = |slot: usize| (slot / PER_PAGE) * 4096 + (slot % PER_PAGE) * 512;
        for (n, &slot) in order.iter().enumerate() {
            let start = at(slot);
            for k in 0..7 {
                code[start + k * 8..start + k * 8 + 8].copy_from_slice(&NOP8);
            }
            let j = start + 56;
            match order.get(n + 1) {
                Some(&next) => {
                    // jmp rel32, relative to the end of the jump.
                    let rel = at(next) as i64 - (j as i64 + 5);
                    code[j] = 0xe9;
                    code[j + 1..j + 5].copy_from_slice(&(rel as i32).to_le_bytes());
                }
                None => code[j] = 0xc3, // ret
            }
        }
        // SAFETY: a fresh private anonymous mapping of `len` bytes; the
        // code is copied in while it is writable, then it is made
        // read+exec and never unmapped (the pad lives as long as the
        // process). The code is NOPs and jumps within it, ending in `ret`:
        // it touches no register the C ABI asks a callee to keep, and no
        // memory.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            std::ptr::copy_nonoverlapping(code.as_ptr(), p.cast::<u8>(), len);
            if libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
            let entry = p.cast::<u8>().add(at(order[0]));
            Ok(Pad {
                entry: std::mem::transmute::<*mut u8, extern "C" fn()>(entry),
            })
        }
    }

    /// Runs the lines once.
    pub fn run(&self) {
        (self.entry)();
    }
}
