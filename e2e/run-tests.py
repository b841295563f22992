#!/usr/bin/env python3
"""Run the workspace's test binaries, a few at a time (e2e/test.sh).

`cargo test` runs its test binaries one after another. Ours spend most of
their time waiting on the real servers they start, so one at a time leaves
a core idle for most of the run. This runner takes the binaries that
`cargo test --no-run --message-format=json` built (the JSON on stdin) and
runs them in `--jobs` lanes, longest first (the seconds in
e2e/test-durations.tsv; a binary missing there counts as 30 s).

Each binary runs as `cargo test` runs it: in its package's directory, with
the arguments given after `--`. Each lane gets its own share of the ports
the harness hands out (MESHBRIDGE_TEST_PORT_SLOT, read by
meshbridge_e2e::process::free_port), so two binaries never pick the same
port. A binary's output is printed whole when it ends, under cargo's own
"Running" line plus its lane and time, so the log reads as cargo's does.
Every binary runs even when one fails (cargo's --no-fail-fast); the exit
status is 1 if any failed. The times of this run are written to
--durations-out, in the seed's format.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

DEFAULT_SECONDS = 30.0


def key(artifact):
    """`kind:name`, as in e2e/test-durations.tsv: `test:nacos_registry`,
    `lib:meshbridge`, `bin:bench`."""
    target = artifact["target"]
    return f"{target['kind'][0]}:{target['name']}"


def shown(artifact):
    """What cargo prints after "Running": `tests/x.rs` or `unittests src/lib.rs`."""
    target = artifact["target"]
    root = os.path.dirname(artifact["manifest_path"])
    src = os.path.relpath(target["src_path"], root)
    return src if target["kind"][0] == "test" else f"unittests {src}"


def read_durations(path):
    durations = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, seconds = line.split()
            durations[name] = float(seconds)
    return durations


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--durations", required=True, help="seed: `kind:name seconds` per line")
    parser.add_argument("--durations-out", help="where this run's times go")
    parser.add_argument("args", nargs="*", help="passed to every test binary (after --)")
    opts = parser.parse_args()
    if opts.jobs < 1:
        parser.error("--jobs must be at least 1")

    binaries = []
    for line in sys.stdin:
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
            binaries.append(msg)
    if not binaries:
        print("run-tests: no test binaries in the build's output: FAILED", flush=True)
        return 1

    seed = read_durations(opts.durations)
    # Longest first, so the last binary to start is a short one; ties in
    # the order cargo built them.
    queue = sorted(binaries, key=lambda b: -seed.get(key(b), DEFAULT_SECONDS))
    lock = threading.Lock()
    running = set()
    results = {}
    failed = []

    def lane(slot):
        env = dict(os.environ, MESHBRIDGE_TEST_PORT_SLOT=f"{slot}/{opts.jobs}")
        while True:
            with lock:
                if not queue:
                    return
                artifact = queue.pop(0)
            with tempfile.TemporaryFile() as out:
                started = time.monotonic()
                proc = subprocess.Popen(
                    [artifact["executable"], *opts.args],
                    cwd=os.path.dirname(artifact["manifest_path"]),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                with lock:
                    running.add(proc)
                code = proc.wait()
                took = time.monotonic() - started
                with lock:
                    running.discard(proc)
                out.seek(0)
                text = out.read().decode("utf-8", "replace")
            with lock:
                results[key(artifact)] = took
                print(f"     Running {shown(artifact)} ({artifact['executable']}) [lane {slot}, {took:.1f} s]")
                sys.stdout.write(text)
                if code != 0:
                    why = f"signal {-code}" if code < 0 else f"exit status {code}"
                    print(f"error: test binary {key(artifact)} failed ({why})")
                    failed.append(key(artifact))
                sys.stdout.flush()

    def forward(signum, _frame):
        with lock:
            for proc in running:
                proc.send_signal(signum)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    began = time.monotonic()
    threads = [threading.Thread(target=lane, args=(slot,), daemon=True) for slot in range(opts.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    wall = time.monotonic() - began

    if opts.durations_out:
        with open(opts.durations_out, "w", encoding="utf-8") as f:
            f.write("# seconds per test binary, from one run of e2e/run-tests.py\n")
            for name, seconds in sorted(results.items(), key=lambda kv: -kv[1]):
                f.write(f"{name} {seconds:.1f}\n")
    print(
        f"test binaries: {len(results)} in {opts.jobs} lanes, {wall:.0f} s wall, "
        f"{sum(results.values()):.0f} s summed; failed: {', '.join(failed) or 'none'}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
