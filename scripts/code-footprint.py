#!/usr/bin/env python3
"""The code a lock cycle runs, as the caches see it: from two callgrind
outputs made with `--dump-instr=yes` (a run of 0 cycles and one of N), the
instructions that ran at least 0.9 times per cycle more in the long run,
counted as distinct instructions, 64-byte cache lines and 4 KiB pages.

In a fleet each worker runs a few microseconds between two context
switches, on caches the other processes have since filled: what a cycle
costs there follows the lines and pages it touches more than the
instructions it runs (BENCHMARKS.md, "Where a fleet worker's time goes").

    scripts/code-footprint.py CYCLES BASE.out FULL.out [TOP]

Prints one JSON object; with TOP, also the TOP functions with the most lines
(inlined code counts in the function it was inlined into).
"""
import collections
import json
import re
import sys


def parse(path):
    """Self cost (Ir) per instruction address, and the function of each."""
    cost = collections.Counter()
    fn_of = {}
    names = {}
    fn = "?"
    addr = 0
    after_call = False
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            head = parts[0]
            if "=" in head:
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    if head.startswith("fn="):
                        fn = names.get(m.group(1), "?")
                after_call = head.startswith("calls=")
                continue
            if head.startswith("0x"):
                addr = int(head, 16)
            elif head[0] in "+-":
                step = head[1:]
                step = int(step, 16) if step.startswith("0x") else int(step)
                addr += step if head[0] == "+" else -step
            elif head != "*":
                continue
            if after_call:
                # The inclusive cost of a call, not this instruction's own.
                after_call = False
                continue
            # positions: instr line; then the events (Ir).
            if len(parts) > 2 and parts[2].isdigit():
                cost[addr] += int(parts[2])
                fn_of[addr] = fn
    return cost, fn_of


def main():
    cycles = int(sys.argv[1])
    base, _ = parse(sys.argv[2])
    full, fn_of = parse(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    hot = [a for a, v in full.items() if v - base.get(a, 0) >= 0.9 * cycles]
    out = {
        "instructions": len(hot),
        "lines": len({a // 64 for a in hot}),
        "pages": len({a // 4096 for a in hot}),
    }
    if top:
        per_fn = collections.defaultdict(set)
        for a in hot:
            per_fn[fn_of.get(a, "?")].add(a // 64)
        out["top"] = [
            [len(v), k] for k, v in sorted(per_fn.items(), key=lambda kv: -len(kv[1]))[:top]
        ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
