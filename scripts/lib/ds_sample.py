#!/usr/bin/env python3
"""Samples a server and its load client while the client runs: for scripts/bench-ds.

    ds_sample.py OUT SERVER_PID CLIENT_PID [INTERVAL_S]

Every INTERVAL_S (0.2) seconds until the client exits (at most an hour), one line to OUT:
wall time (s), the server's VmRSS and RssAnon (KiB, /proc/PID/status), the server's and the
client's CPU time (clock ticks, utime + stime of every thread, /proc/PID/stat). One process,
no fork per sample, so sampling costs the CPU it runs on next to nothing.
"""

import os
import sys
import time


def status_kib(pid, keys):
    out = dict.fromkeys(keys, 0)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in out:
                    out[k] = int(v.split()[0])
    except OSError:
        return None
    return out


def ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count from the last ')'.
    fields = st[st.rindex(")") + 2 :].split()
    return fields[0], int(fields[11]) + int(fields[12])


def main():
    out, server, client = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
    end = time.time() + 3600
    last_client = 0
    with open(out, "w") as f:
        while time.time() < end:
            mem = status_kib(server, ("VmRSS", "RssAnon"))
            srv = ticks(server)
            cli = ticks(client)
            if mem is None or srv is None:
                break
            # A client that exited (a zombie until its parent waits, or gone) ends the
            # samples with its final count.
            done = cli is None or cli[0] in ("Z", "X")
            if cli is not None:
                last_client = cli[1]
            f.write(f"{time.time():.3f} {mem['VmRSS']} {mem['RssAnon']} {srv[1]} {last_client}\n")
            f.flush()
            if done:
                break
            time.sleep(interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
