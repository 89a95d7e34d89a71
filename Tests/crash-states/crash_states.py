#!/usr/bin/env python3
"""Power-loss crash states (`make crash-states`; a short form runs in `make test`).

1. Records a workload (workload.py) against backhauld under an LD_PRELOAD recorder (recorder.c)
   that logs every call changing a file in the state directory, with its bytes and a
   CLOCK_MONOTONIC time, and the time each 2xx answer was received.
2. Rebuilds, at N crash points, what a disk may hold after a power loss there (replay.py: the
   model of the disk), each state's random choices drawn from the printed seed.
3. Opens every state with the real daemon, and counts it
   - unopenable when the daemon does not become ready (exit 65 is a corrupt state) or the database
     then fails `PRAGMA integrity_check`;
   - lost when an acknowledgement received before the crash point is missing: a session PUT (in
     GET /v1/sessions), a webhook created (GET /v1/sessions/{id}/webhooks), a task created (the
     last 40 answered and 10 earlier ones by GET /v1/tasks/{id}; every one of them in the
     database after the daemon stopped: listing thousands through the debug build's API took
     seconds a state), and for a task of a session
     with a webhook, every event of it in the state has its delivery, pending or delivered (read
     from the database after the daemon stopped; creating a task writes no event, so there is no
     event an answer promised).

The criterion: the daemon answers a durable write only after the fdatasync that makes it durable
returned. The recorder stamps a sync once it returned, and the driver stamps an answer once it
was read, so an answer received before call p's time had its sync before call p: a power loss
just before p must keep it. A task of the session whose retention is 1 s may be pruned from 1 s
after its answer on: from then on its absence is no loss; before that it is looked for in a copy
of the state read by python's sqlite3 before the daemon opens it (which prunes it at once).

Prints `crash states: N explored, L lost, U unopenable` and exits 1 when L or U is not 0.
"""

import argparse
import http.client
import json
import os
import queue
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay  # noqa: E402
import workload  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRUNE_RETENTION_NS = 1_000_000_000
# Acknowledged tasks asked for through the API in each state (the rest are read from the database).
API_SAMPLE = 40


def get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return response.status, (json.loads(body) if body else None)
    finally:
        connection.close()


class Checker:
    def __init__(self, args, work, files_root, routes):
        self.args = args
        self.work = work
        self.files_root = files_root
        self.routes = routes

    def check(self, number, point, files, required, description):
        """Opens one crash state; returns (verdict, details): verdict is "ok", "lost" or
        "unopenable"."""
        directory = os.path.join(self.work, "states", f"{number:05d}")
        state = os.path.join(directory, "state")
        os.makedirs(state)
        for name, content in files.items():
            with open(os.path.join(state, name), "wb") as out:
                out.write(content)
        pruned_session = {ack["session"] for ack in required if ack["kind"] == "task" and ack["session"] == "prune"}
        before = self.tasks_before_opening(state, directory, "prune") if pruned_session else set()
        log = os.path.join(directory, "daemon.log")
        process, port = workload.start_daemon(self.args.binary, state, self.files_root, self.routes, log)
        verdict, details = "ok", []
        try:
            if port is None or not workload.wait_ready(port, process):
                code = process.poll()
                kind = "corrupt state, exit 65" if code == 65 else f"exit {code}" if code is not None else "not ready"
                return "unopenable", [f"the daemon did not open it ({kind}); log: {log}"]
            missing = self.missing_through_api(port, required, before)
        finally:
            self.stop(process)
        verdict, details = self.check_database(state, required, missing)
        return verdict, details

    @staticmethod
    def stop(process):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def missing_through_api(self, port, required, prune_before):
        missing = []
        _, answer = get(port, "/v1/sessions")
        sessions = {session["id"] for session in (answer or {}).get("sessions", [])}
        webhooks = {}
        for ack in required:
            kind, session = ack["kind"], ack["session"]
            if kind == "session":
                if session not in sessions:
                    missing.append(f"session {session}")
            elif kind == "webhook":
                if session not in webhooks:
                    status, answer = get(port, f"/v1/sessions/{session}/webhooks")
                    webhooks[session] = {hook["id"] for hook in (answer or {}).get("webhooks", [])} if status == 200 else set()
                if ack["id"] not in webhooks[session]:
                    missing.append(f"webhook {ack['id']}")
        # Tasks: the last ones answered (those a power loss puts at risk) and a few earlier ones
        # through the API, one request each; all of them in the database after the daemon stopped.
        tasks = [ack for ack in required if ack["kind"] == "task" and ack["session"] != "prune"]
        for ack in tasks[-API_SAMPLE:] + random.Random(len(tasks)).sample(tasks, min(len(tasks), API_SAMPLE // 4)):
            status, _ = get(port, f"/v1/tasks/{ack['id']}")
            if status != 200:
                missing.append(f"task {ack['id']} ({ack['session']}, GET answered {status})")
        for ack in required:
            # The prune session's tasks are looked for in the state before the daemon opened it.
            if ack["kind"] == "task" and ack["session"] == "prune":
                if prune_before is None:
                    missing.append("the state could not be read before the daemon opened it")
                    break
                if ack["id"] not in prune_before:
                    missing.append(f"task {ack['id']} (prune, before opening)")
        return missing

    @staticmethod
    def check_database(state, required, missing):
        try:
            db = sqlite3.connect(os.path.join(state, "backhaul.db"), timeout=30)
            integrity = db.execute("PRAGMA integrity_check").fetchall()
            if integrity != [("ok",)]:
                return "unopenable", [f"integrity_check: {integrity[:5]}"]
            tasks = [ack["id"] for ack in required if ack["kind"] == "task" and ack["session"] != "prune"]
            if tasks:
                present = {row[0] for row in db.execute(
                    "SELECT id FROM tasks WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(tasks),))}
                missing += [f"task {task} (in the database)" for task in tasks if task not in present]
            # Every event of an acknowledged task of a subscribed session (progress aside, which no
            # subscription here asked for) has its delivery, pending or delivered: the outbox is
            # written in the event's transaction.
            hooks = {ack["session"]: ack["id"] for ack in required if ack["kind"] == "webhook"}
            tasks = [(ack["id"], hooks[ack["session"]]) for ack in required
                     if ack["kind"] == "task" and ack["session"] in hooks]
            if tasks:
                undelivered = db.execute(
                    """SELECT e.task_id, e.type FROM events e
                       JOIN json_each(?) t ON json_extract(t.value, '$[0]') = e.task_id
                       WHERE e.type != 'task.progress' AND NOT EXISTS (
                           SELECT 1 FROM deliveries d WHERE d.event_seq = e.seq
                           AND d.webhook_id = json_extract(t.value, '$[1]') AND d.state IN ('pending', 'delivered'))""",
                    (json.dumps(tasks),)).fetchall()
                missing += [f"delivery of {kind} of task {task}" for task, kind in undelivered]
            db.close()
        except sqlite3.Error as error:
            return "unopenable", [f"sqlite3: {error}"]
        if missing:
            return "lost", missing
        return "ok", []

    @staticmethod
    def tasks_before_opening(state, directory, session):
        """The ids of `session`'s tasks in the state as it is, read by SQLite (python's sqlite3) from
        a copy: the daemon that opens the state prunes that session's finished tasks at once."""
        copy = os.path.join(directory, "before")
        os.makedirs(copy)
        for name in os.listdir(state):
            shutil.copyfile(os.path.join(state, name), os.path.join(copy, name))
        try:
            db = sqlite3.connect(os.path.join(copy, "backhaul.db"), timeout=30)
            ids = {row[0] for row in db.execute("SELECT id FROM tasks WHERE session_id = ?", (session,))}
            db.close()
            return ids
        except sqlite3.Error:
            return None
        finally:
            shutil.rmtree(copy, ignore_errors=True)


def describe_files(ops):
    """Per file of the state directory: its writes, syncs and truncations (to which lengths)."""
    names, figures = {}, {}
    for op in ops:
        if op.kind == "open":
            names[op.fd] = op.path or "(directory)"
            continue
        name = names.get(op.fd)
        if name is None or op.kind == "close":
            continue
        entry = figures.setdefault(name, {"write": 0, "sync": 0, "truncations": []})
        if op.kind == "write":
            entry["write"] += 1
        elif op.kind in ("fsync", "fdatasync"):
            entry["sync"] += 1
        elif op.kind == "trunc":
            entry["truncations"].append(op.a)
    return "; ".join(f"{name} {entry['write']} writes, {entry['sync']} syncs"
                     + (f", cut to {entry['truncations']}" if entry["truncations"] else "")
                     for name, entry in sorted(figures.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=1000)
    parser.add_argument("--size", choices=sorted(workload.SIZES), default="full")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--binary", default=os.path.join(ROOT, ".build/debug/backhauld"))
    parser.add_argument("--recorder", required=True, help="the compiled recorder.c (a shared library)")
    parser.add_argument("--work", default=None, help="scratch directory (default: a new one in /dev/shm)")
    parser.add_argument("--jobs", type=int, default=2, help="states opened at once")
    parser.add_argument("--directory-model", choices=("posix", "ext4"), default="posix")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (failing states are always kept)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    scratch_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = args.work or tempfile.mkdtemp(prefix="backhaul-crash-", dir=scratch_root)
    started = time.monotonic()
    print(f"crash-states: seed {seed} (--seed {seed} repeats the states' choices), "
          f"{args.size} workload, {args.directory_model} directory model, scratch {work}", flush=True)

    fixture = os.path.join(ROOT, "Tests/fixtures/state-v1/backhaul.db")
    with open(fixture, "rb") as source:
        initial = {"backhaul.db": source.read()}
    summary = workload.record(args.binary, os.path.abspath(args.recorder), work, fixture, args.size)
    acks = sorted(summary["acks"], key=lambda ack: ack["t"])
    with open(os.path.join(work, "trace", "acks.json"), "w") as out:
        json.dump(acks, out)
    disk = replay.Disk(os.path.join(work, "trace"), initial, args.directory_model)
    ops = disk.ops
    kinds = {}
    for op in ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    print(f"crash-states: recorded {len(ops)} calls ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), "
          f"{sum(1 for a in acks if a['kind'] == 'task')} tasks acknowledged, {summary['uploads']} uploads and "
          f"{summary['hooks']} webhook ids received, in {time.monotonic() - started:.0f} s", flush=True)
    print("crash-states: per file: " + describe_files(ops), flush=True)
    print("crash-states: the daemon's figures: " +
          ", ".join(f"{k} {v:g}" for k, v in sorted(summary["metrics"].items())), flush=True)

    # A recorder that saw nothing (not preloaded, a directory spelled differently) would leave only
    # the fixture to check: that is a broken harness, not a pass.
    if kinds.get("fdatasync", 0) + kinds.get("fsync", 0) == 0 or kinds.get("write", 0) == 0:
        raise SystemExit("crash-states: the recorder logged no writes or syncs in the state directory")
    rng = random.Random(seed)
    points = replay.crash_points(ops, args.states, rng)
    checker = Checker(args, work, os.path.join(work, "files"), os.path.join(work, "routes"))
    jobs = queue.Queue(maxsize=2 * args.jobs)
    results = []
    results_lock = threading.Lock()

    def worker():
        while True:
            job = jobs.get()
            if job is None:
                return
            number, point, files, required, description = job
            try:
                verdict, details = checker.check(number, point, files, required, description)
            except Exception as error:  # a harness failure is reported as such, never as a pass
                verdict, details = "unopenable", [f"harness error: {error!r}"]
            if verdict == "ok" and not args.keep:
                shutil.rmtree(os.path.join(work, "states", f"{number:05d}"), ignore_errors=True)
            with results_lock:
                results.append((number, point, verdict, details, description, len(required)))

    threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for thread in threads:
        thread.start()
    for number, point in enumerate(points):
        disk.advance(point)
        # The state's own random source: the seed and its number, so one state can be rebuilt alone.
        state_rng = random.Random(seed * 1_000_003 + number)
        tear = point - 1 if point > 0 and ops[point - 1].kind == "write" else None
        files, description = disk.crash_state(state_rng, tear)
        limit = ops[point].ns if point < len(ops) else float("inf")
        required = [ack for ack in acks if ack["t"] < limit and not (
            ack["kind"] == "task" and ack["session"] == "prune" and limit - ack["t"] > PRUNE_RETENTION_NS)]
        jobs.put((number, point, files, required, f"before call {point} of {len(ops)}: {description}"))
        if number % 100 == 99:
            with results_lock:
                bad = sum(1 for r in results if r[2] != "ok")
            print(f"crash-states: {len(results)} of {len(points)} states checked, {bad} failing, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    for _ in threads:
        jobs.put(None)
    for thread in threads:
        thread.join()

    results.sort()
    lost = [r for r in results if r[2] == "lost"]
    unopenable = [r for r in results if r[2] == "unopenable"]
    for number, point, verdict, details, description, count in (lost + unopenable)[:20]:
        op = ops[point] if point < len(ops) else None
        call = f"{op.kind} fd {op.fd} ({op.a}, {op.b}) at {op.ns} ns" if op else "the end"
        print(f"crash-states: state {number} {verdict}: {description}; next call {call}; "
              f"{len(details)} findings among its {count} acknowledgements: {'; '.join(details[:4])}", flush=True)
    for problem in disk.problems[:5]:
        print(f"crash-states: replay: {problem}")
    print(f"crash-states: {len(results)} states in {time.monotonic() - started:.0f} s; scratch "
          f"{work if (lost or unopenable or args.keep) else 'removed'}")
    print(f"crash states: {len(results)} explored, {len(lost)} lost, {len(unopenable)} unopenable", flush=True)
    if not (lost or unopenable or args.keep):
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if lost or unopenable or len(results) < args.states else 0)


if __name__ == "__main__":
    main()
