#!/usr/bin/env python3
"""The data a lock cycle touches, as the caches see it: from a trace of
`valgrind --tool=lackey --trace-mem=yes` on stdin, the distinct 64-byte
lines of memory (loads and stores) touched in a stretch of the run as long
as one cycle, in instructions: the stretch with the median count over the
run's last third (its steady state), split by where the lines are.

Code is shared: 200 fleet workers run one binary, whose pages the caches
hold once for all. Data is each process's own: its stack, its heap, its
copy of the binary's writable data. A worker that runs again after 199
others finds its data lines cold (BENCHMARKS.md, "The data a cycle
touches").

    valgrind --tool=lackey --trace-mem=yes --log-fd=9 PROGRAM 9>&1 >/dev/null |
        scripts/data-footprint.py INSTRUCTIONS_PER_CYCLE [BINARY TOP]

Prints one JSON object: {"lines", "stack", "heap", "program"}, by where
valgrind lays a process out: "stack" is every line at or above
0x1000000000 (the main thread's stack), "program" every line below
0x4000000 (the program's own constants, tables and writable data; valgrind
loads a PIE program at 0x108000 and ld.so at 0x4000000), "heap" the rest
(malloc's heap, mappings, and the shared libraries' data, libc's malloc
state among them); and "stretches", how many stretches the median is
over. With BINARY (the traced
PIE program, which valgrind loads at 0x108000) and TOP, also the TOP
functions of BINARY that touch the most of one such stretch's lines first
(a line is counted once, for the first instruction that touches it).
"""
import bisect
import collections
import json
import subprocess
import sys

STACK = 0x1000000000
LIBRARIES = 0x4000000
# Where valgrind's loader puts a position-independent main program.
PIE_BASE = 0x108000


def region(line):
    addr = line << 6
    if addr >= STACK:
        return "stack"
    if addr < LIBRARIES:
        return "program"
    return "heap"


def symbols(path):
    syms = []
    out = subprocess.run(["nm", "-C", "--defined-only", "-n", path], capture_output=True, text=True, check=True)
    for row in out.stdout.splitlines():
        parts = row.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16) + PIE_BASE, parts[2]))
    return syms


def main():
    per = int(sys.argv[1])
    binary = sys.argv[2] if len(sys.argv) > 2 else None
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    stretches = []  # per stretch: {line: first instruction address}
    first = {}
    ins = 0
    mark = per
    ip = 0
    for row in sys.stdin:
        head = row[:1]
        if head == "I":
            ins += 1
            if ins >= mark:
                stretches.append(first)
                first = {}
                mark += per
            ip = int(row[3:].split(",", 1)[0], 16)
        elif head == " ":
            addr, size = row[3:].split(",", 1)
            start = int(addr, 16)
            # An access across a line boundary touches both lines.
            for line in range(start >> 6, ((start + int(size) - 1) >> 6) + 1):
                if line not in first:
                    first[line] = ip
    steady = stretches[len(stretches) * 2 // 3 :]
    if not steady:
        sys.exit(f"data-footprint.py: {ins} instructions: not one stretch of {per}")
    # The stretch with the median number of lines stands for the cycle:
    # its total and its parts, all from that one stretch.
    sizes = sorted((len(s), i) for i, s in enumerate(steady))
    _, mid = sizes[(len(sizes) - 1) // 2]
    parts = collections.Counter(region(line) for line in steady[mid])
    result = {
        "lines": len(steady[mid]),
        "stack": parts["stack"],
        "heap": parts["heap"],
        "program": parts["program"],
        # How many stretches the median is over.
        "stretches": len(steady),
    }
    if binary and top:
        syms = symbols(binary)
        starts = [a for a, _ in syms]
        end = syms[-1][0] if syms else 0
        by = collections.Counter()
        for line, at in steady[mid].items():
            i = bisect.bisect_right(starts, at) - 1
            name = syms[i][1] if 0 <= i and at <= end + 0x10000 else "(outside the program: libc, ld.so)"
            by[name] += 1
        result["top"] = [[n, name] for name, n in by.most_common(top)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
