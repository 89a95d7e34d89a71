"""The recorded run of the crash-state harness: backhauld under the recorder (recorder.c), driven
through every path that writes the state, with the time each acknowledgement arrived.

What it drives, all at once against one daemon whose state starts as the v1 fixture (so the
migrations run first, under the recorder):
- bursts: POST /v1/sessions/burst/tasks with `{"tasks": [...]}` of many tasks, back to back;
- beside them, single POSTs from two threads into another session, and from a third into a session
  whose `finished_task_retention` is 1 s (its tasks finish at once and are pruned, and the sweep
  then returns pages with `incremental_vacuum`);
- transfers completing (raw PUTs to a sink on 127.0.0.1) and webhooks delivered (a receiver);
- a pause after each round, so the checkpointer copies the log back while nothing commits; the
  rounds' writes grow the log past `journal_size_limit` (4 MiB), so it is cut back after a reset;
- a SIGTERM at the end (the close path).

An acknowledgement is a 2xx answer read to its end: a session PUT, a webhook created, a task
created (one or a batch). Its time is CLOCK_MONOTONIC taken right after, the clock the recorder
stamps each call with.
"""

import http.client
import http.server
import json
import os
import signal
import subprocess
import threading
import time


def monotonic_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Peer:
    """One loopback HTTP server for both the uploads (any path) and the webhooks (/hook):
    it reads every body and answers 200 or 204, and counts what came."""

    def __init__(self):
        peer = self
        self.lock = threading.Lock()
        self.uploads = 0
        self.hooks = set()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def read_body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline().strip():
                                pass
                            return
                        self.rfile.read(size + 2)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)

            def answer(self):
                self.read_body()
                if self.path.startswith("/hook"):
                    with peer.lock:
                        peer.hooks.add(self.headers.get("webhook-id", ""))
                    self.send_response(204)
                else:
                    with peer.lock:
                        peer.uploads += 1
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_PUT = answer
            do_POST = answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def route_file(path):
    """A routing table with a default route through eth0, so the daemon sees a network."""
    with open(path, "w") as out:
        out.write("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n")
        out.write("lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n")
        out.write("eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n")
    return path


def start_daemon(binary, state, root, routes, log_path, env=None, extra=()):
    """Starts backhauld on a free port; returns (process, port), or (process, None) if it exited
    or did not listen within `timeout`."""
    log = open(log_path, "ab")
    process = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--state-dir", state, "--allow-root", root, "--route-file", routes,
         "--log-level", "info", "--no-ui", *extra],
        stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log_path, "rb") as text:
            for line in text:
                if b'"msg":"listening"' in line:
                    try:
                        return process, int(json.loads(line)["http.port"])
                    except (ValueError, KeyError):
                        pass
        if process.poll() is not None:
            return process, None
        time.sleep(0.01)
    return process, None


class Client:
    """One keep-alive connection to the daemon."""

    def __init__(self, port):
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            try:
                self.connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
                response = self.connection.getresponse()
                payload = response.read()
                return response.status, (json.loads(payload) if payload else None)
            except (http.client.HTTPException, ConnectionError):
                self.connection.close()
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt == 2:
                    raise

    def close(self):
        self.connection.close()


def wait_ready(port, process, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            response.read()
            connection.close()
            if response.status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.02)
    return False


SIZES = {
    # rounds, bursts per round, tasks per burst, single POSTs per thread and round, prune-session POSTs per round
    "full": (3, 4, 500, 60, 40),
    "short": (2, 2, 250, 25, 15),
}


def record(binary, recorder, work, fixture_db, size):
    """Runs the workload under the recorder in `work`; returns the acknowledgements and what the
    daemon's /metrics said at the end (a summary of the paths taken)."""
    state, trace, files = (os.path.join(work, name) for name in ("state", "trace", "files"))
    for directory in (state, trace, files):
        os.makedirs(directory)
    with open(fixture_db, "rb") as source, open(os.path.join(state, "backhaul.db"), "wb") as target:
        target.write(source.read())
    for index in range(16):
        with open(os.path.join(files, f"f{index}.bin"), "wb") as out:
            out.write(os.urandom(1024 * (1 + index)))
    routes = route_file(os.path.join(work, "routes"))
    peer = Peer()
    env = dict(os.environ, LD_PRELOAD=recorder, CRASH_RECORD_DIR=state, CRASH_RECORD_OUT=trace)
    process, port = start_daemon(binary, state, files, routes, os.path.join(work, "record.log"), env=env,
                                 extra=("--webhook-retry-schedule", "0,1,1,1,1,1", "--wal-cap-frames", "2500"))
    if port is None or not wait_ready(port, process):
        raise SystemExit(f"crash-states: the recorded daemon did not start (see {work}/record.log)")

    acks = []
    acks_lock = threading.Lock()
    failures = []

    def acknowledge(kind, session, ident):
        stamp = monotonic_ns()
        with acks_lock:
            acks.append({"t": stamp, "kind": kind, "session": session, "id": ident})

    def task_body(n):
        return {"file": os.path.join(files, f"f{n % 16}.bin"),
                "request": {"url": f"http://127.0.0.1:{peer.port}/up/{n}", "method": "PUT"}}

    setup = Client(port)
    for session, configuration in (("burst", {}), ("single", {}), ("prune", {"finished_task_retention": 1})):
        status, _ = setup.call("PUT", f"/v1/sessions/{session}", {"configuration": configuration})
        if status not in (200, 201):
            raise SystemExit(f"crash-states: PUT session {session}: {status}")
        acknowledge("session", session, session)
    for session in ("burst", "single"):
        status, answer = setup.call("POST", f"/v1/sessions/{session}/webhooks",
                                    {"url": f"http://127.0.0.1:{peer.port}/hook/{session}"})
        if status != 201:
            raise SystemExit(f"crash-states: POST webhook: {status}")
        acknowledge("webhook", session, answer["id"])

    rounds, bursts, burst_size, singles, prunes = SIZES[size]
    counter = iter(range(10**9))
    counter_lock = threading.Lock()

    def numbers(count):
        with counter_lock:
            return [next(counter) for _ in range(count)]

    def bursting():
        client = Client(port)
        for _ in range(bursts):
            status, answer = client.call("POST", "/v1/sessions/burst/tasks",
                                         {"tasks": [task_body(n) for n in numbers(burst_size)]})
            if status != 201:
                failures.append(f"burst: {status} {answer}")
                continue
            stamp = monotonic_ns()
            with acks_lock:
                acks.extend({"t": stamp, "kind": "task", "session": "burst", "id": task["id"]}
                            for task in answer["tasks"])
        client.close()

    def posting(session, count):
        client = Client(port)
        for n in numbers(count):
            status, answer = client.call("POST", f"/v1/sessions/{session}/tasks", task_body(n))
            if status != 201:
                failures.append(f"{session}: {status} {answer}")
                continue
            acknowledge("task", session, answer["id"])
        client.close()

    for _ in range(rounds):
        threads = [threading.Thread(target=bursting), threading.Thread(target=posting, args=("single", singles)),
                   threading.Thread(target=posting, args=("single", singles)),
                   threading.Thread(target=posting, args=("prune", prunes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        # A pause: the checkpointer copies the log back once no commit came for a quarter second.
        time.sleep(0.8)
    expected = sum(1 for ack in acks if ack["kind"] == "task")
    deadline = time.monotonic() + 120
    while peer.uploads < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    # The prune session's retention is 1 s; the sweep comes back within half a second.
    time.sleep(2.5)
    status, metrics = 0, ""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        status, metrics = response.status, response.read().decode()
    except (OSError, http.client.HTTPException):
        pass
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    peer.stop()
    if failures:
        raise SystemExit("crash-states: the workload was refused: " + "; ".join(failures[:5]))
    figures = {}
    for line in metrics.splitlines():
        for name in ("backhaul_tasks_pruned_total", "backhaul_pages_vacuumed_total", "backhaul_wal_checkpoints_total",
                     "backhaul_store_commits_total"):
            if line.startswith(name):
                key, _, value = line.rpartition(" ")
                figures[key] = float(value)
    return {"acks": acks, "uploads": peer.uploads, "expected_uploads": expected, "hooks": len(peer.hooks),
            "metrics": figures, "port_status": status}
