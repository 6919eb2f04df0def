#!/usr/bin/env python3
"""Where the threads of a stuck process are, without a debugger (the GPU
machine has none): stops each thread with ptrace, reads its instruction and
stack pointers, and lists the words on its stack that point into executable
code, as (module, offset). Those are return addresses, plus some stale
values: read them as a rough backtrace. Offsets are named by the nearest
symbol `nm` finds in the module (its dynamic symbols where it has no others:
a library's internal functions then show as the exported one before them).

Usage: python3 bench/stackscan.py PID [--depth BYTES]
"""
import argparse
import bisect
import ctypes
import os
import subprocess

PTRACE_ATTACH, PTRACE_DETACH, PTRACE_GETREGS = 16, 17, 12
WALL = 0x40000000


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax "
        "rip cs eflags rsp ss fs_base gs_base ds es fs gs").split()]


def maps(pid):
    """Executable mappings as (start, end, path, base of that file)."""
    rows, base = [], {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else "?"
            if int(parts[2], 16) == 0 and path not in base:
                base[path] = lo
            if "x" in parts[1]:
                rows.append((lo, hi, path))
    return [(lo, hi, p, base.get(p, lo)) for lo, hi, p in rows]


def where(addr, exe):
    for lo, hi, path, base in exe:
        if lo <= addr < hi:
            return path, addr - base
    return None


def symbolizer(binary):
    out = ""
    for flags in (["-C"], ["-C", "-D"]):
        if not out.strip():
            out = subprocess.run(["nm", *flags, "--defined-only", binary],
                                 capture_output=True, text=True).stdout
    syms = sorted((int(a, 16), n) for a, t, n in
                  (l.split(" ", 2) for l in out.splitlines() if l.count(" ") >= 2)
                  if t in "tTwW")
    keys = [a for a, _ in syms]

    def name(off):
        i = bisect.bisect_right(keys, off) - 1
        return f" {syms[i][1][:160]}+{off - syms[i][0]:#x}" if i >= 0 else ""
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pid", type=int)
    ap.add_argument("--depth", type=int, default=128 * 1024)
    a = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    exe = maps(a.pid)
    names = {}

    def label(hit):
        path, off = hit
        if path not in names:
            names[path] = symbolizer(path) if os.path.exists(path) else (lambda o: "")
        return f"{os.path.basename(path)}+{off:#x}{names[path](off)}"
    mem = open(f"/proc/{a.pid}/mem", "rb", buffering=0)
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{a.pid}/task")):
        comm = open(f"/proc/{a.pid}/task/{tid}/comm").read().strip()
        if libc.ptrace(PTRACE_ATTACH, tid, None, None) != 0:
            print(f"## {tid} {comm}: ptrace failed (errno {ctypes.get_errno()})")
            continue
        os.waitpid(tid, WALL)
        regs = Regs()
        libc.ptrace(PTRACE_GETREGS, tid, None, ctypes.byref(regs))
        try:
            mem.seek(regs.rsp)
            stack = mem.read(a.depth)
        except OSError:
            stack = b""
        libc.ptrace(PTRACE_DETACH, tid, None, None)
        at = where(regs.rip, exe)
        print(f"## {tid} {comm} rip={label(at) if at else hex(regs.rip)}")
        seen = 0
        for i in range(0, len(stack) - 7, 8):
            w = int.from_bytes(stack[i:i + 8], "little")
            hit = where(w, exe)
            if hit is None:
                continue
            print(f"  sp+{i:#07x} {label(hit)}")
            seen += 1
            if seen >= 60:
                break


if __name__ == "__main__":
    main()
