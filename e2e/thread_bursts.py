#!/usr/bin/env python3
"""Print the bursts of CPU of one thread of a running process.

    e2e/thread_bursts.py PID [SECONDS] [TID]

Samples /proc/PID/task/TID/stat (TID defaults to PID: the main thread)
every 10 ms for SECONDS (default 20) and prints each run of busy samples
(gaps under 50 ms joined) with its start, end and CPU time. Used to see
Envoy's main thread flush its statistics (BENCHMARKS.md, "Envoy's
statistics at 10k clusters"). The kernel counts CPU time in clock ticks
(10 ms here), so short bursts read as 10 ms.
"""
import os
import sys
import time


def ticks(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pid = int(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    tid = int(sys.argv[3]) if len(sys.argv) > 3 else pid
    ms_per_tick = 1000 / os.sysconf("SC_CLK_TCK")
    start = time.monotonic()
    last = ticks(pid, tid)
    bursts = []  # [start s, end s, cpu ms]
    while time.monotonic() - start < seconds:
        time.sleep(0.01)
        now_ticks = ticks(pid, tid)
        at = time.monotonic() - start
        if now_ticks != last:
            cpu = (now_ticks - last) * ms_per_tick
            if bursts and at - bursts[-1][1] < 0.05:
                bursts[-1][1] = at
                bursts[-1][2] += cpu
            else:
                bursts.append([at, at, cpu])
        last = now_ticks
    for b in bursts:
        print(f"{b[0]:7.2f} s .. {b[1]:7.2f} s  {b[2]:6.0f} ms CPU")


if __name__ == "__main__":
    main()
