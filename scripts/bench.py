#!/usr/bin/env python3
"""Side-by-side benchmark on loopback, in one run: prints each section's table, then every target
the issues set (16's, the earlier ones it keeps, and 40's for PostgreSQL) beside its figure with
met / not met, and writes it all as JSON.

Sections (`--only`, comma-separated; all by default):
  big       one 1 GiB file: backhauld raw and chunked (8 MiB) vs `curl -T`, to nginx on tmpfs,
            rounds interleaved
  download  the same file the other way: backhauld download vs `curl -o`
  webhooks  N small uploads, one subscription, nginx answering 204 as the receiver
  many      2,000 × 256 KiB to nginx WebDAV (`dav_methods PUT`, tmpfs): backhauld vs one curl
            process (`-K`, one file after another) vs `curl -Z --parallel-max 16`, rounds
            interleaved; backhauld's CPU per task
  rclone    the same files to `rclone serve webdav` (rclone's WebDAV backend cannot talk to
            nginx's partial WebDAV): backhauld, curl, curl -Z and `rclone copy --transfers 8`
  https     the same files over https to nginx speaking HTTP/1.1 and HTTP/2: backhauld vs curl -Z,
            and the connections (TLS handshakes) each opened, counted in nginx's log
  api       wrk (2 threads, 16 connections) on GET /v1/tasks/{id} and on single-task POSTs,
            every POST's status counted by a Lua script
  scale     1,000,000 tasks in batches of 1,000 into a disabled session: the first 100,000 vs
            the last 100,000, RSS with them present, SIGTERM and restart to /readyz, GET under wrk;
            then the same with every task scheduled a month ahead in an enabled session
  profile   instructions per 64 KiB task under callgrind (N tasks minus an idle run) beside curl
  postgres  the state in PostgreSQL (docs/fleet.md), one node beside SQLite: CPU per small task
            (the daemon's, and the database's), single durable POSTs under wrk, the first 100,000
            enqueued; then three nodes on one database sharing the same uploads

`--quick` shrinks every size (and runs once) so the whole script is checked in a few minutes:
its verdicts are not the targets'. Every wait has a deadline; everything listens on 127.0.0.1.
"""
import argparse, atexit, glob, http.client, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20

# Every process this script starts, so that none outlives it whatever fails.
CHILDREN = []


def spawn(command, **kwargs):
    process = subprocess.Popen(command, **kwargs)
    CHILDREN.append(process)
    return process


def stop(process, sig=signal.SIGTERM, timeout=30):
    """Signals `process` and waits for it; SIGKILL when it outlives `timeout`. Returns the seconds
    it took to exit after the signal."""
    if process.poll() is not None:
        return 0.0
    started = time.time()
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    return time.time() - started


@atexit.register
def stop_children():
    for process in CHILDREN:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def api(port, method, path, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def run(command, timeout, **kwargs):
    """subprocess.run with a time limit and check=True."""
    return subprocess.run(command, check=True, timeout=timeout, **kwargs)


def timed(command, timeout, **kwargs):
    """Runs `command` to a successful end and returns its wall time, from before its start to its
    exit, in seconds (the monotonic clock). The wait blocks in waitpid: subprocess.run's timed wait
    polls, sleeping up to 50 ms between looks, which adds 0-50 ms to a wall timed around it. A timer
    kills the command past `timeout`."""
    started = time.monotonic()
    process = spawn(command, **kwargs)
    expired = threading.Event()

    def expire():
        expired.set()
        process.kill()

    watchdog = threading.Timer(timeout, expire)
    watchdog.start()
    try:
        code = process.wait()
    finally:
        watchdog.cancel()
    elapsed = time.monotonic() - started
    if expired.is_set():
        raise subprocess.TimeoutExpired(command, timeout)
    if code != 0:
        raise subprocess.CalledProcessError(code, command)
    return elapsed


def dav_location(directory):
    """nginx's WebDAV PUT sink under `directory`/root (as BackhaulTesting's NginxServer)."""
    return f"location / {{ root {directory}/root; dav_methods PUT; create_full_put_path on; client_max_body_size 0; }}"


def run_nginx(directory, http, ports):
    """nginx with one worker in its own prefix `directory` (its root and body files there), the
    `http` block's contents as given; returns the process once every one of `ports` listens."""
    os.makedirs(f"{directory}/root", exist_ok=True)
    os.makedirs(f"{directory}/tmp", exist_ok=True)
    user = "user root;" if os.getuid() == 0 else ""
    with open(f"{directory}/nginx.conf", "w") as conf:
        conf.write(f"""{user}
worker_processes 1;
daemon off;
error_log {directory}/error.log;
pid {directory}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  client_body_temp_path {directory}/tmp;
{http}
}}
""")
    process = spawn(["nginx", "-c", f"{directory}/nginx.conf", "-p", f"{directory}/"])
    for port in ports:
        wait_port(port)
    return process


def start_nginx(directory):
    """nginx as a WebDAV PUT sink (`dav_methods PUT`, `create_full_put_path on`), its root on
    tmpfs, and a 204 webhook receiver at /hooks."""
    port = free_port()
    process = run_nginx(directory, f"""  access_log off;
  server {{
    listen 127.0.0.1:{port};
    {dav_location(directory)}
    location /hooks {{ return 204; }}
  }}""", [port])
    return process, port


class ChunkSink:
    """A resumable Content-Range sink on tmpfs (nginx answers 501 to ranged PUTs): writes each
    chunk at its offset, 308 + Range for intermediate chunks, 201 for the last."""

    def __init__(self, directory):
        import http.server, threading
        self.directory = directory
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def do_PUT(self):
                length = int(self.headers.get("Content-Length", "0"))
                first, last, total = sink.parse(self.headers.get("Content-Range", ""))
                path = sink.assembled(self.path)
                mode = "r+b" if os.path.exists(path) else "wb"
                with open(path, mode) as out:
                    out.seek(first)
                    remaining = length
                    while remaining > 0:
                        block = self.rfile.read(min(remaining, 1 << 20))
                        if not block:
                            break
                        out.write(block)
                        remaining -= len(block)
                size = os.path.getsize(path)
                status = 201 if size >= total else 308
                self.send_response(status)
                if status == 308:
                    self.send_header("Range", f"bytes=0-{size - 1}")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def assembled(self, path):
        return f"{self.directory}/assembled" + path.replace("/", "_")

    @staticmethod
    def parse(header):
        spec, total = header.removeprefix("bytes ").split("/")
        first, last = spec.split("-")
        return int(first), int(last), int(total)


def proc_stat(path):
    """A /proc stat file: the name in its parentheses, and the fields after them."""
    with open(path) as stat:
        text = stat.read()
    return text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 1:].split()


def proc_times(pid):
    """The process's utime and stime (seconds) and its minor page faults so far."""
    _, fields = proc_stat(f"/proc/{pid}/stat")
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def proc_thread_times(pid):
    """utime and stime (seconds) of each of the process's threads that carries a name of its own
    (the daemon's `bh-*` threads), summed by name."""
    tick = os.sysconf("SC_CLK_TCK")
    times = {}
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            name, fields = proc_stat(f"/proc/{pid}/task/{thread}/stat")
        except OSError:
            continue  # the thread ended meanwhile
        if name.startswith("bh-"):
            user, system = times.get(name, (0.0, 0.0))
            times[name] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)
    return times


def proc_cpu_seconds(pid):
    """utime + stime of the process so far."""
    user, system, _ = proc_times(pid)
    return user + system


def proc_status_mib(pid, key):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_peak_rss_mib(pid):
    return proc_status_mib(pid, "VmHWM")


def proc_rss_mib(pid):
    return proc_status_mib(pid, "VmRSS")


def start_daemon(binary, state, root, extra=(), port=0):
    """Starts backhauld and returns (process, port) once it listens (read from its log)."""
    log = open(state + ".log", "a")
    skip = listening_lines(state)
    process = spawn([binary, "--listen", f"127.0.0.1:{port}", "--state-dir", state, "--allow-root", root, *extra],
                    stderr=log, stdout=log)
    deadline = time.time() + 60
    while time.time() < deadline and process.poll() is None:
        with open(state + ".log") as lines:
            for line in list(lines)[skip:]:
                if '"msg":"listening"' in line:
                    return process, int(json.loads(line)["http.port"])
        time.sleep(0.02)
    stop(process)
    raise RuntimeError(f"backhauld did not start; see {state}.log")


def listening_lines(state):
    try:
        with open(state + ".log") as lines:
            return len(list(lines))
    except FileNotFoundError:
        return 0


def wait_done(port, ids, timeout=900):
    deadline = time.time() + timeout
    pending = set(ids)
    while pending and time.time() < deadline:
        for task_id in list(pending):
            status, task = api(port, "GET", f"/v1/tasks/{task_id}")
            if task["state"] in ("completed", "failed", "cancelled"):
                if task["state"] != "completed":
                    raise RuntimeError(f"task {task_id} {task['state']}: {task['error']}")
                pending.discard(task_id)
        time.sleep(0.01)
    if pending:
        raise RuntimeError(f"{len(pending)} tasks did not finish")


def wait_session_done(port, session, count, timeout=600, interval=0.01):
    """Polls the session's counts until `count` tasks ended; their counts. The polls share one
    kept-alive connection, as an HTTP client library's would: a connection each 10 ms cost the
    daemon an accept and a thread started and ended each time, 0.006 ms of CPU a small task
    (threads other than the curl one and the writer: 0.024 → 0.018 ms a task over 2,000)."""
    deadline = time.time() + timeout
    connection, counts = None, None
    try:
        while time.time() < deadline:
            try:
                connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                connection.request("GET", f"/v1/sessions/{session}")
                body = json.loads(connection.getresponse().read())
            except (OSError, http.client.HTTPException):
                # The daemon closed the kept connection (its idle timeout): a new one.
                if connection:
                    connection.close()
                connection = None
                time.sleep(interval)
                continue
            counts = body["task_counts"]
            if counts["completed"] + counts["failed"] + counts.get("cancelled", 0) >= count:
                break
            time.sleep(interval)
    finally:
        if connection:
            connection.close()
    if counts is None:
        raise RuntimeError(f"session {session}: no answer to its polls within {timeout} s")
    if counts["completed"] != count:
        _, failed = api(port, "GET", f"/v1/sessions/{session}/tasks?state=failed&limit=1")
        raise RuntimeError(f"session {session}: {counts}; first failure: {failed.get('tasks', [{}])[:1]}")
    return counts


# ---------------------------------------------------------------------------------------------
# 1. One big file


def big_file(args, work, data, source, sink_dir, nginx_port, chunk_sink):
    """One big file: curl -T, backhauld raw and backhauld chunked (8 MiB), to the same sinks. Rounds
    interleave the three, as the small files' do, so that drift of the machine touches them alike
    (run one sender's rounds after the other's, and a slow minute falls on one of them only)."""
    gib = args.size_mib / 1024
    uploads = [("backhauld raw", {"protocol": "raw"}), ("backhauld chunked", {"protocol": "chunked"})]
    walls = {name: [] for name in ["curl -T"] + [name for name, _ in uploads]}
    cpus = {name: [] for name, _ in uploads}
    rss = {name: [] for name, _ in uploads}

    def sink_port(upload):
        return nginx_port if upload["protocol"] == "raw" else chunk_sink.port

    for run_index in range(args.runs):
        target = f"http://127.0.0.1:{nginx_port}/curl/{run_index}.bin"
        subprocess.run(["sync"], timeout=120)
        walls["curl -T"].append(timed(["curl", "-sS", "-o", "/dev/null", "-T", source, target], timeout=600))
        os.remove(f"{sink_dir}/root/curl/{run_index}.bin")
        for name, upload in uploads:
            state = f"{work}/state-{name.split()[1]}-{run_index}"
            daemon, port = start_daemon(args.binary, state, data)
            try:
                api(port, "PUT", "/v1/sessions/bench", {"configuration": {}})
                cpu_before = proc_cpu_seconds(daemon.pid)
                subprocess.run(["sync"], timeout=120)
                started = time.time()
                status, task = api(port, "POST", "/v1/sessions/bench/tasks", {
                    "file": source, "upload": upload,
                    "request": {"url": f"http://127.0.0.1:{sink_port(upload)}/bh/{run_index}.bin"}})
                assert status == 201, task
                wait_done(port, [task["id"]])
                walls[name].append(time.time() - started)
                cpus[name].append(proc_cpu_seconds(daemon.pid) - cpu_before)
                rss[name].append(proc_peak_rss_mib(daemon.pid))
                target = (f"{sink_dir}/root/bh/{run_index}.bin" if upload["protocol"] == "raw"
                          else chunk_sink.assembled(f"/bh/{run_index}.bin"))
                if subprocess.run(["cmp", "-s", source, target], timeout=300).returncode != 0:
                    raise RuntimeError(f"{name}: the uploaded file differs")
                os.remove(target)
            finally:
                stop(daemon)
    cases = {name: {"wall_s": statistics.median(values), "walls": values} for name, values in walls.items()}
    for name, _ in uploads:
        cases[name]["cpu_s_per_gib"] = statistics.median(cpus[name]) / gib
        cases[name]["peak_rss_mib"] = max(rss[name])
    base = cases["curl -T"]["wall_s"]
    for case in cases.values():
        case["mib_per_s"] = args.size_mib / case["wall_s"]
        case["ratio_to_curl"] = case["wall_s"] / base
    return cases


def big_download(args, work, data, source, sink_dir, nginx_port):
    """One big file the other way: curl -o vs a backhauld download, from the same nginx, into a
    tmpfs directory (so the disk does not bound either; backhauld still fsyncs its checkpoints)."""
    served = f"{sink_dir}/root/dl/big.bin"
    os.makedirs(os.path.dirname(served), exist_ok=True)
    shutil.copyfile(source, served)
    target_dir = tempfile.mkdtemp(prefix="backhaul-dl-", dir="/dev/shm")
    url = f"http://127.0.0.1:{nginx_port}/dl/big.bin"
    cases = {}
    try:
        walls = []
        for run_index in range(args.runs):
            target = f"{target_dir}/curl-{run_index}.bin"
            walls.append(timed(["curl", "-sS", "-o", target, url], timeout=600))
            os.remove(target)
        cases["curl -o"] = {"wall_s": statistics.median(walls), "walls": walls}
        walls, cpus, rss = [], [], []
        for run_index in range(args.runs):
            daemon, port = start_daemon(args.binary, f"{work}/state-download-{run_index}", data, ["--allow-root", target_dir])
            try:
                api(port, "PUT", "/v1/sessions/bench", {"configuration": {}})
                cpu_before = proc_cpu_seconds(daemon.pid)
                target = f"{target_dir}/bh-{run_index}.bin"
                started = time.time()
                status, task = api(port, "POST", "/v1/sessions/bench/tasks",
                                   {"kind": "download", "request": {"url": url}, "destination": target})
                assert status == 201, task
                wait_done(port, [task["id"]])
                walls.append(time.time() - started)
                cpus.append(proc_cpu_seconds(daemon.pid) - cpu_before)
                rss.append(proc_peak_rss_mib(daemon.pid))
                if subprocess.run(["cmp", "-s", source, target], timeout=300).returncode != 0:
                    raise RuntimeError("backhauld download: the file differs")
                os.remove(target)
            finally:
                stop(daemon)
        cases["backhauld download"] = {"wall_s": statistics.median(walls), "walls": walls,
                                       "cpu_s_per_gib": statistics.median(cpus) / (args.size_mib / 1024),
                                       "peak_rss_mib": max(rss)}
    finally:
        os.remove(served)
        shutil.rmtree(target_dir, ignore_errors=True)
    curl = cases["curl -o"]["wall_s"]
    for case in cases.values():
        case["mib_per_s"] = args.size_mib / case["wall_s"]
        case["ratio_to_curl"] = case["wall_s"] / curl
    return cases


# ---------------------------------------------------------------------------------------------
# 2. Webhooks


def webhook_throughput(args, work, data, nginx_port):
    """N small uploads with one task.completed subscription, nginx answering 204 as the receiver:
    from the enqueue to the last delivery."""
    files = []
    for index in range(args.webhook_events):
        path = f"{data}/w{index}.bin"
        with open(path, "wb") as out:
            out.write(b"x" * 1024)
        files.append(path)
    state = f"{work}/state-webhooks"
    daemon, port = start_daemon(args.binary, state, data)
    try:
        api(port, "PUT", "/v1/sessions/hooks", {"configuration": {}})
        status, webhook = api(port, "POST", "/v1/sessions/hooks/webhooks",
                              {"url": f"http://127.0.0.1:{nginx_port}/hooks", "events": ["task.completed"]})
        assert status == 201, webhook
        started = time.time()
        tasks = [{"file": path, "request": {"url": f"http://127.0.0.1:{nginx_port}/w/{i}.bin"}} for i, path in enumerate(files)]
        status, created = api(port, "POST", "/v1/sessions/hooks/tasks", {"tasks": tasks})
        assert status == 201, created
        uploads_done = None
        deadline = time.time() + 600
        while time.time() < deadline:
            _, session = api(port, "GET", "/v1/sessions/hooks")
            if uploads_done is None and session["task_counts"]["completed"] == len(files):
                uploads_done = time.time() - started
            if uploads_done is not None:
                _, pending = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=pending&limit=1")
                if not pending["deliveries"]:
                    break
            time.sleep(0.02)
        delivered_at = time.time() - started
        count = 0
        cursor = ""
        for _ in range(len(files) // 1000 + 2):
            _, page = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=delivered&limit=1000&cursor={cursor}")
            count += len(page["deliveries"])
            if not page["next_cursor"]:
                break
            cursor = page["next_cursor"]
        if count != len(files):
            raise RuntimeError(f"webhooks: {count} of {len(files)} delivered after {delivered_at:.0f} s")
        return {"events": count, "uploads_s": uploads_done, "all_delivered_s": delivered_at,
                "events_per_s": count / delivered_at}
    finally:
        stop(daemon)


# ---------------------------------------------------------------------------------------------
# 3. Many small files


def make_files(data, name, count, size):
    """`count` files of `size` random bytes, `0.bin`…, in `data/name` (made once); the directory."""
    source = f"{data}/{name}"
    if not os.path.isdir(source):
        os.makedirs(source)
        for index in range(count):
            with open(f"{source}/{index}.bin", "wb") as out:
                out.write(os.urandom(size))
    return source


def make_small_files(args, data):
    return make_files(data, "many", args.files, 256 * 1024)


def curl_config(path, source, files, base_url):
    with open(path, "w") as out:
        for index in range(files):
            out.write(f'upload-file = "{source}/{index}.bin"\nurl = "{base_url}/{index}.bin"\noutput = "/dev/null"\n')
    return path


CURL_CASES = (("curl (one process)", []), ("curl -Z (16 parallel)", ["-Z", "--parallel-max", "16", "--no-progress-meter"]))


def run_curl(args, work, source, name, flags, base_url, label):
    config = curl_config(f"{work}/{label}.cfg", source, args.files, base_url)
    return timed(["curl", "-sSf", *flags, "-K", config], timeout=900, stdout=subprocess.DEVNULL)


def run_backhauld_many(args, work, data, source, base_url, label, extra=()):
    """backhauld, one batch of `args.files` tasks, from the enqueue POST to the last completion seen
    by polling (its durable state included); its CPU (utime, stime; in all and by named thread), minor
    page faults and peak RSS over the run. The batch's JSON is written before the clock starts, as
    curl's `-K` file is before curl's; the 201's body (every task, 1.5 MB for 2,000) is read but
    parsed only on a failure: `json.loads` of it took this script 22-29 ms of a CPU in the middle of
    the transfers, which curl's runs do not share their two cores with."""
    daemon, port = start_daemon(args.binary, f"{work}/state-{label}", data, extra)
    try:
        body = many_session(port, source, base_url, args.files)
        before, threads_before = proc_times(daemon.pid), proc_thread_times(daemon.pid)
        started = time.time()
        post_many(port, body, args.files)
        wall = time.time() - started
        user, system, faults = (after - first for after, first in zip(proc_times(daemon.pid), before))
        threads = {name: tuple(after - first for after, first in zip(times, threads_before.get(name, (0, 0))))
                   for name, times in proc_thread_times(daemon.pid).items()}
        usage = {"user": user, "system": system, "faults": faults, "threads": threads}
        return wall, usage, proc_peak_rss_mib(daemon.pid)
    finally:
        stop(daemon)


def many_session(port, source, base_url, files):
    """The session "many" (16 connections per host), and the JSON of a batch of `files` uploads
    from `source` to `base_url`, written before a run's clock starts."""
    api(port, "PUT", "/v1/sessions/many", {"configuration": {"max_connections_per_host": 16}})
    tasks = [{"file": f"{source}/{index}.bin", "request": {"url": f"{base_url}/{index}.bin"}} for index in range(files)]
    return json.dumps({"tasks": tasks}).encode()


def post_many(port, body, files, interval=0.01):
    """Posts the batch to the session "many" and waits for its `files` tasks to end."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/sessions/many/tasks", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    assert response.status == 201, answer[:2000]
    wait_session_done(port, "many", files, interval=interval)


def check_received(directory, files):
    names = os.listdir(directory) if os.path.isdir(directory) else []
    sizes = {os.path.getsize(f"{directory}/{name}") for name in names}
    if len(names) != files or sizes != {256 * 1024}:
        raise RuntimeError(f"{directory}: {len(names)} files of sizes {sorted(sizes)[:5]}, expected {files} of 256 KiB")


def many_files_nginx(args, work, data, sink_dir, nginx_port):
    """2,000 × 256 KiB to nginx WebDAV on tmpfs. Rounds interleave the senders (curl, curl -Z,
    backhauld) so that drift of the machine touches all three alike; each round's files are
    checked (count and size) and removed."""
    source = make_small_files(args, data)
    walls = {}
    usages, peaks = [], []
    for run_index in range(args.runs):
        for name, flags in CURL_CASES:
            label = f"many-{'curlz' if '-Z' in flags else 'curl'}-{run_index}"
            walls.setdefault(name, []).append(
                run_curl(args, work, source, name, flags, f"http://127.0.0.1:{nginx_port}/{label}", label))
            check_received(f"{sink_dir}/root/{label}", args.files)
            shutil.rmtree(f"{sink_dir}/root/{label}")
        label = f"many-bh-{run_index}"
        wall, usage, peak = run_backhauld_many(args, work, data, source, f"http://127.0.0.1:{nginx_port}/{label}", label)
        walls.setdefault("backhauld", []).append(wall)
        usages.append(usage)
        peaks.append(peak)
        check_received(f"{sink_dir}/root/{label}", args.files)
        shutil.rmtree(f"{sink_dir}/root/{label}")
    result = {name: {"wall_s": statistics.median(values), "walls": values, "files_per_s": args.files / statistics.median(values)}
              for name, values in walls.items()}
    for case in result.values():
        case["ratio_backhauld_to_this"] = result["backhauld"]["wall_s"] / case["wall_s"]
    cpus = [usage["user"] + usage["system"] for usage in usages]
    median = usages[cpus.index(statistics.median_low(cpus))]
    result["backhauld"]["cpu_s"] = statistics.median(cpus)
    result["backhauld"]["cpu_ms_per_task"] = statistics.median(cpus) * 1000 / args.files
    result["backhauld"]["user_s"], result["backhauld"]["system_s"] = median["user"], median["system"]
    result["backhauld"]["faults_per_task"] = median["faults"] / args.files
    result["backhauld"]["threads_ms_per_task"] = {
        name: {"user": user * 1000 / args.files, "system": system * 1000 / args.files}
        for name, (user, system) in sorted(median["threads"].items(), key=lambda item: -sum(item[1])) if user + system > 0}
    result["backhauld"]["peak_rss_mib"] = max(peaks)
    return result


def start_rclone_webdav(directory):
    """rclone's own WebDAV server: a sink that rclone, curl and backhauld can all PUT to."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    process = spawn(["rclone", "serve", "webdav", directory, "--addr", f"127.0.0.1:{port}"], env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return process, port


def many_files_rclone(args, work, data):
    """The same files to `rclone serve webdav` on tmpfs, where `rclone copy` works: backhauld,
    curl, curl -Z and rclone copy --transfers 8, rounds interleaved. This sink spends ~2 ms of CPU
    per PUT itself, which bounds every sender on two cores."""
    source = make_small_files(args, data)
    sink = tempfile.mkdtemp(prefix="backhaul-dav-", dir="/dev/shm")
    labels = ("curl", "curlz", "rclone", "bh")
    # Destination folders exist before the server starts (rclone caches directory listings).
    for run_index in range(args.runs):
        for label in labels:
            os.makedirs(f"{sink}/{label}{run_index}")
    webdav, port = start_rclone_webdav(sink)
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    walls = {}
    try:
        for run_index in range(args.runs):
            for name, flags in CURL_CASES:
                label = f"{'curlz' if '-Z' in flags else 'curl'}{run_index}"
                walls.setdefault(name, []).append(
                    run_curl(args, work, source, name, flags, f"http://127.0.0.1:{port}/{label}", f"rclone-sink-{label}"))
            walls.setdefault("rclone copy --transfers 8", []).append(
                timed(["rclone", "copy", "--transfers", "8", source, f":webdav,url='http://127.0.0.1:{port}':rclone{run_index}"],
                      timeout=1800, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wall, _, _ = run_backhauld_many(args, work, data, source, f"http://127.0.0.1:{port}/bh{run_index}",
                                            f"rclone-sink-bh{run_index}")
            walls.setdefault("backhauld", []).append(wall)
            for label in labels:
                check_received(f"{sink}/{label}{run_index}", args.files)
                shutil.rmtree(f"{sink}/{label}{run_index}", ignore_errors=True)
    finally:
        stop(webdav)
        shutil.rmtree(sink, ignore_errors=True)
    result = {name: {"wall_s": statistics.median(values), "walls": values, "files_per_s": args.files / statistics.median(values)}
              for name, values in walls.items()}
    for case in result.values():
        case["ratio_backhauld_to_this"] = result["backhauld"]["wall_s"] / case["wall_s"]
    return result


def start_nginx_tls(directory):
    """nginx over https with a throwaway self-signed certificate: one server that speaks HTTP/2
    (ALPN) and one that speaks only HTTP/1.1, each logging every request's connection number, so
    the connections a sender opened are counted. Returns (process, {"h2": port, "h1": port},
    certificate, log)."""
    certificate, key = f"{directory}/cert.pem", f"{directory}/key.pem"
    run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", certificate],
        timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = {"h2": free_port(), "h1": free_port()}
    tls = f"ssl_certificate {certificate}; ssl_certificate_key {key}; {dav_location(directory)}"
    process = run_nginx(directory, f"""  log_format connections '$connection $uri';
  access_log {directory}/access.log connections;
  server {{ listen 127.0.0.1:{ports["h2"]} ssl http2; {tls} }}
  server {{ listen 127.0.0.1:{ports["h1"]} ssl; {tls} }}""", ports.values())
    return process, ports, certificate, f"{directory}/access.log"


def connections_used(log, label):
    """How many connections nginx saw carry the requests under /`label`/."""
    with open(log) as lines:
        return len({line.split()[0] for line in lines if line.split()[1:2] and line.split()[1].startswith(f"/{label}/")})


def many_files_https(args, work, data):
    """The same files over https to nginx, HTTP/1.1 and HTTP/2: backhauld vs `curl -Z --parallel-max
    16` (which multiplexes over HTTP/2), rounds interleaved; the connections each opened, from
    nginx's log (each one a TLS handshake)."""
    source = make_small_files(args, data)
    directory = tempfile.mkdtemp(prefix="backhaul-tls-", dir="/dev/shm")
    nginx, ports, certificate, log = start_nginx_tls(directory)
    results = {}
    try:
        for run_index in range(args.runs):
            for protocol, port in ports.items():
                base = f"https://127.0.0.1:{port}"
                label = f"curlz-{protocol}-{run_index}"
                flags = ["-Z", "--parallel-max", "16", "--no-progress-meter", "--cacert", certificate]
                flags += ["--http1.1"] if protocol == "h1" else []
                wall = run_curl(args, work, source, "curl -Z", flags, f"{base}/{label}", label)
                results.setdefault(f"curl -Z, {protocol}", []).append((wall, None, connections_used(log, label)))
                check_received(f"{directory}/root/{label}", args.files)
                shutil.rmtree(f"{directory}/root/{label}")
                label = f"bh-{protocol}-{run_index}"
                wall, usage, _ = run_backhauld_many(args, work, data, source, f"{base}/{label}", label,
                                                    ["--ca-bundle", certificate])
                cpu = (usage["user"] + usage["system"]) * 1000 / args.files
                results.setdefault(f"backhauld, {protocol}", []).append((wall, cpu, connections_used(log, label)))
                check_received(f"{directory}/root/{label}", args.files)
                shutil.rmtree(f"{directory}/root/{label}")
    finally:
        stop(nginx)
        shutil.rmtree(directory, ignore_errors=True)
    cases = {}
    for name, rounds in results.items():
        walls = [wall for wall, _, _ in rounds]
        cpus = [cpu for _, cpu, _ in rounds if cpu is not None]
        cases[name] = {"wall_s": statistics.median(walls), "walls": walls, "files_per_s": args.files / statistics.median(walls),
                       "connections": [connections for _, _, connections in rounds]}
        if cpus:
            cases[name]["cpu_ms_per_task"] = statistics.median(cpus)
    for protocol in ports:
        cases[f"backhauld, {protocol}"]["ratio_to_curl_z"] = (
            cases[f"backhauld, {protocol}"]["wall_s"] / cases[f"curl -Z, {protocol}"]["wall_s"])
    return cases


# ---------------------------------------------------------------------------------------------
# 4. The API under wrk


STATUS_COUNTER = """
-- Counts every response's status per thread; done() adds them up (wrk runs done() in the main
-- thread's Lua state, so it reads each thread's globals through thread:get).
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) created = 0; other = 0; others = "" end
function response(status, headers, body)
  if status == EXPECTED then created = created + 1 else
    other = other + 1
    if #others < 100 then others = others .. status .. " " end
  end
end
function done(summary, latency, requests)
  local c, o, s = 0, 0, ""
  for _, t in ipairs(threads) do c = c + t:get("created"); o = o + t:get("other"); s = s .. t:get("others") end
  io.write(string.format("statuses: expected=%d other=%d [%s]\\n", c, o, s))
end
"""


def wrk_script(path, method="GET", body=None, expected=200):
    with open(path, "w") as out:
        out.write(f'wrk.method = "{method}"\n')
        if body is not None:
            out.write(f'wrk.body = {json.dumps(body)}\nwrk.headers["Content-Type"] = "application/json"\n')
        out.write(STATUS_COUNTER.replace("EXPECTED", str(expected)))
    return path


def wrk(url, seconds, connections=16, script=None):
    """requests/s, p99 latency (ms), socket errors and (with a counting script) the statuses, from
    wrk --latency with 2 threads."""
    command = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    if script:
        command[1:1] = ["-s", script]
    output = run(command, timeout=seconds + 120, capture_output=True, text=True).stdout
    lines = output.splitlines()
    rate = float(next(line.split()[1] for line in lines if line.startswith("Requests/sec:")))
    p99 = next(line.split()[1] for line in lines if line.strip().startswith("99%"))
    units = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    unit = next(u for u in ("us", "ms", "s") if p99.endswith(u))
    requests = int(next(line.split()[0] for line in lines if "requests in" in line))
    socket_errors = 0
    for line in lines:
        if "Socket errors" in line:
            # "Socket errors: connect 0, read 0, write 0, timeout 0"
            socket_errors = sum(int(part.split()[-1]) for part in line.split(":", 1)[1].split(","))
    result = {"requests_per_s": rate, "p99_ms": float(p99[: -len(unit)]) * units[unit], "requests": requests,
              "socket_errors": socket_errors,
              "errors": [line.strip() for line in lines if "Non-2xx" in line or "Socket errors" in line]}
    status_line = next((line for line in lines if line.startswith("statuses:")), None)
    if status_line:
        counts = dict(part.split("=") for part in status_line.split("[")[0].split()[1:])
        result["expected_status"] = int(counts["expected"])
        result["other_status"] = int(counts["other"])
        result["other_statuses_seen"] = status_line.split("[", 1)[1].rstrip("]").split()
    return result


def one_file(data):
    """A file of 1,000 bytes for tasks that are queued, not sent; its path."""
    source = f"{data}/one.bin"
    with open(source, "wb") as out:
        out.write(b"x" * 1000)
    return source


def disabled_session(port, session):
    """A session whose transfers are disabled: what is posted to it is the API's and the store's
    work alone."""
    api(port, "PUT", f"/v1/sessions/{session}", {"configuration": {}})
    api(port, "PATCH", f"/v1/sessions/{session}", {"enabled": False})


def post_load(args, work, port, source, session):
    """wrk on single-task POSTs into `session`, each its own 201."""
    body = json.dumps({"file": source, "request": {"url": "http://127.0.0.1:9/x"}})
    script = wrk_script(f"{work}/post-{session}.lua", "POST", body, expected=201)
    return wrk(f"http://127.0.0.1:{port}/v1/sessions/{session}/tasks", args.load_seconds, script=script)


def post_batches(port, session, body, count, deadline=float("inf")):
    """`count` POSTs of one batch's `body` into `session` through one kept-alive connection (the
    body serialized once, so the client's own cost stays small), fewer if `deadline` passes: the
    time before the first and after each, and the last answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    marks = [time.time()]
    answer = b""
    for batch in range(count):
        if time.time() > deadline:
            break
        connection.request("POST", f"/v1/sessions/{session}/tasks", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read()
        if response.status != 201:
            raise RuntimeError(f"batch {batch}: {response.status} {answer[:300]!r}")
        marks.append(time.time())
    connection.close()
    return marks, answer


def api_load(args, work, data):
    """wrk on GET /v1/tasks/{id} and on single-task POSTs (each its own 201), against a session
    whose transfers are disabled, so the figures are the API's and the store's alone."""
    source = one_file(data)
    daemon, port = start_daemon(args.binary, f"{work}/state-api", data)
    results = {}
    try:
        disabled_session(port, "api")
        _, task = api(port, "POST", "/v1/sessions/api/tasks", {"file": source, "request": {"url": "http://127.0.0.1:9/x"}})
        results["get_task"] = wrk(f"http://127.0.0.1:{port}/v1/tasks/{task['id']}", args.load_seconds)
        _, before = api(port, "GET", "/v1/sessions/api")
        results["post_task"] = post_load(args, work, port, source, "api")
        _, after = api(port, "GET", "/v1/sessions/api")
        # Every 201 wrk counted is a task in the store (more may be there: wrk does not count the
        # answers in flight when it stops).
        results["post_task"]["tasks_stored"] = sum(after["task_counts"].values()) - sum(before["task_counts"].values())
    finally:
        stop(daemon)
    return results


# ---------------------------------------------------------------------------------------------
# 5. A million queued


def scale(args, work, data, scheduled=False):
    """`--scale-tasks` tasks in batches of 1,000 (`post_batches`): into a disabled session, or with
    `scheduled`, into an enabled one with `earliest_begin_at` a month ahead (a night window's
    queue: every task waits, and the engine's timers know of all of them). The time of the first
    and of the last `--scale-window` tasks; the daemon's RSS with them present; GET
    /v1/tasks/{id} under wrk; SIGTERM, then a new process timed to the first 200 of /readyz."""
    source = one_file(data)
    state = f"{work}/state-scale" + ("-scheduled" if scheduled else "")
    daemon, port = start_daemon(args.binary, state, data)
    result = {"tasks_planned": args.scale_tasks, "window": args.scale_window, "scheduled": scheduled}
    try:
        begin = {}
        if scheduled:
            api(port, "PUT", "/v1/sessions/scale", {"configuration": {}})
            month = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30 * 86_400))
            begin = {"earliest_begin_at": month}
        else:
            disabled_session(port, "scale")
        body = json.dumps({"tasks": [{"file": source, "request": {"url": f"http://127.0.0.1:9/q/{index}"}, **begin}
                                     for index in range(1000)]}).encode()
        cpu_before = proc_cpu_seconds(daemon.pid)
        marks, answer = post_batches(port, "scale", body, args.scale_tasks // 1000,
                                     deadline=time.time() + args.scale_timeout)
        enqueued = (len(marks) - 1) * 1000
        window = args.scale_window // 1000
        last_id = json.loads(answer)["tasks"][-1]["id"]
        result.update({
            "tasks": enqueued, "enqueue_s": marks[-1] - marks[0], "enqueue_cpu_s": proc_cpu_seconds(daemon.pid) - cpu_before,
            "first_window_s": marks[window] - marks[0] if len(marks) > window else None,
            "last_window_s": marks[-1] - marks[-1 - window] if len(marks) > window else None,
            # Seconds per 100,000 at each tenth of the way, to show the slope.
            "per_tenth_s": [marks[min(len(marks) - 1, (i + 1) * (len(marks) - 1) // 10)] - marks[i * (len(marks) - 1) // 10]
                            for i in range(10)] if len(marks) > 10 else [],
            "rss_mib": proc_rss_mib(daemon.pid), "peak_rss_mib": proc_peak_rss_mib(daemon.pid),
            "database_mib": sum(os.path.getsize(f"{state}/{name}") for name in os.listdir(state)
                                if os.path.isfile(f"{state}/{name}")) / MIB,
        })
        _, session = api(port, "GET", "/v1/sessions/scale")
        result["tasks_in_session"] = sum(session["task_counts"].values())
        result["get_task"] = wrk(f"http://127.0.0.1:{port}/v1/tasks/{last_id}", args.load_seconds)
        result["rss_after_load_mib"] = proc_rss_mib(daemon.pid)
        result["stop_s"] = stop(daemon, timeout=60)
        # A new process on a new port (the old one's may linger): from its start to the first 200.
        ready_port = free_port()
        log = open(state + ".log", "a")
        started = time.time()
        daemon = spawn([args.binary, "--listen", f"127.0.0.1:{ready_port}", "--state-dir", state, "--allow-root", data],
                       stderr=log, stdout=log)
        ready_s = None
        deadline = started + 60
        while time.time() < deadline and daemon.poll() is None:
            probe = http.client.HTTPConnection("127.0.0.1", ready_port, timeout=5)
            try:
                probe.request("GET", "/readyz")
                if probe.getresponse().status == 200:
                    ready_s = time.time() - started
                    break
            except OSError:
                pass
            finally:
                probe.close()
            time.sleep(0.005)
        result["restart_to_ready_s"] = ready_s
        time.sleep(1)
        result["rss_after_restart_mib"] = proc_rss_mib(daemon.pid)
    finally:
        stop(daemon, timeout=60)
    return result


# ---------------------------------------------------------------------------------------------
# 6. Instructions per task


def callgrind_total(path):
    """The instruction count (Ir) a callgrind output file reports."""
    with open(path) as out:
        for line in out:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"no total in {path}")


def profile_tasks(args, work, data, nginx_port):
    """Instructions per small task, counted by callgrind (the same count whatever else the machine
    does): backhauld uploading N files of 64 KiB to nginx, minus an idle run of the same daemon as
    long, divided by N; beside one curl process uploading the same files (its start-up included)."""
    source = f"{data}/profile"
    os.makedirs(source, exist_ok=True)
    for index in range(args.profile_tasks):
        with open(f"{source}/{index}.bin", "wb") as out:
            out.write(os.urandom(64 * 1024))
    valgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no", "--collect-jumps=no"]

    def run_daemon(name, tasks):
        out = f"{work}/callgrind-{name}.out"
        state = f"{work}/state-profile-{name}"
        log = open(state + ".log", "a")
        process = spawn(valgrind + [f"--callgrind-out-file={out}", args.binary, "--listen", "127.0.0.1:0",
                                    "--state-dir", state, "--allow-root", data], stderr=log, stdout=log)
        try:
            port = None
            deadline = time.time() + 180
            while time.time() < deadline and port is None and process.poll() is None:
                with open(state + ".log") as lines:
                    for line in lines:
                        if '"msg":"listening"' in line:
                            port = int(json.loads(line)["http.port"])
                time.sleep(0.1)
            if port is None:
                raise RuntimeError("backhauld under valgrind did not start")
            api(port, "PUT", "/v1/sessions/profile", {"configuration": {"max_connections_per_host": 16}})
            started = time.time()
            if tasks:
                batch = [{"file": f"{source}/{index}.bin",
                          "request": {"url": f"http://127.0.0.1:{nginx_port}/profile-{name}/{index}.bin"}}
                         for index in range(tasks)]
                status, created = api(port, "POST", "/v1/sessions/profile/tasks", {"tasks": batch})
                assert status == 201, created
                wait_session_done(port, "profile", tasks, timeout=900, interval=0.2)
            else:
                time.sleep(args.profile_idle_seconds)
            elapsed = time.time() - started
        finally:
            stop(process, timeout=180)
        return callgrind_total(out), elapsed

    busy, busy_seconds = run_daemon("busy", args.profile_tasks)
    args.profile_idle_seconds = busy_seconds
    idle, _ = run_daemon("idle", 0)
    config = curl_config(f"{work}/profile-curl.cfg", source, args.profile_tasks, f"http://127.0.0.1:{nginx_port}/profile-curl")
    curl_out = f"{work}/callgrind-curl.out"
    run(valgrind + [f"--callgrind-out-file={curl_out}", "curl", "-sSf", "-K", config], timeout=900,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    curl = callgrind_total(curl_out)
    if args.keep_profiles:
        os.makedirs(args.keep_profiles, exist_ok=True)
        for name in ("busy", "idle", "curl"):
            shutil.copy(f"{work}/callgrind-{name}.out", f"{args.keep_profiles}/callgrind-{name}.out")
    return {"tasks": args.profile_tasks, "busy_instructions": busy, "idle_instructions": idle,
            "backhauld_per_task": (busy - idle) / args.profile_tasks, "curl_per_task": curl / args.profile_tasks,
            "busy_seconds": busy_seconds}


# ---------------------------------------------------------------------------------------------
# The targets


def targets(args, results):
    """The issues' targets (16's, the earlier ones it keeps, 40's), each with its figure and verdict."""
    rows = []

    def row(section, name, figure, target, met):
        rows.append({"section": section, "row": name, "figure": figure, "target": target,
                     "met": None if met is None else bool(met)})

    if "many_files_nginx" in results:
        many = results["many_files_nginx"]
        bh = many["backhauld"]
        curl, curlz = many["curl (one process)"], many["curl -Z (16 parallel)"]
        sink = f"{args.files} × 256 KiB, nginx WebDAV"
        row(sink, "backhauld ÷ one curl process", f"{bh['wall_s'] / curl['wall_s']:.2f} ({bh['wall_s']:.2f} s / {curl['wall_s']:.2f} s)",
            "≤ 0.6", bh["wall_s"] / curl["wall_s"] <= 0.6)
        row(sink, "backhauld ÷ curl -Z --parallel-max 16",
            f"{bh['wall_s'] / curlz['wall_s']:.2f} ({bh['wall_s']:.2f} s / {curlz['wall_s']:.2f} s)",
            "≤ 1.3", bh["wall_s"] / curlz["wall_s"] <= 1.3)
        row(sink, "backhauld CPU per task (utime+stime ÷ tasks)", f"{bh['cpu_ms_per_task']:.3f} ms", "≤ 0.25 ms",
            bh["cpu_ms_per_task"] <= 0.25)
    if "profile" in results:
        profile = results["profile"]
        row(f"{profile['tasks']} × 64 KiB, nginx, callgrind", "instructions per task (minus an idle run)",
            f"{profile['backhauld_per_task']:,.0f} (one curl process: {profile['curl_per_task']:,.0f})", "≤ 500,000",
            profile["backhauld_per_task"] <= 500_000)
    if "post_task" in results:
        post = results["post_task"]
        section = "wrk, 2 threads, 16 connections"
        row(section, "single-task POSTs", f"{post['requests_per_s']:,.0f} req/s, p99 {post['p99_ms']:.2f} ms", "≥ 5,000 req/s",
            post["requests_per_s"] >= 5000)
        row(section, "every POST answered 201",
            f"{post['expected_status']:,} × 201, {post['other_status']} other{' (' + ' '.join(post['other_statuses_seen'][:5]) + ')' if post['other_status'] else ''}, "
            f"{post['socket_errors']} socket errors; {post['tasks_stored']:,} tasks stored",
            "all 201", post["other_status"] == 0 and post["socket_errors"] == 0 and post["tasks_stored"] >= post["expected_status"])
        get = results["get_task"]
        row(section, "GET /v1/tasks/{id}, a near-empty store (earlier target)", f"{get['requests_per_s']:,.0f} req/s, p99 {get['p99_ms']:.2f} ms",
            "≥ 10,000 req/s, p99 ≤ 10 ms", get["requests_per_s"] >= 10_000 and get["p99_ms"] <= 10)
    for key in ("scale", "scale_scheduled"):
        if key not in results:
            continue
        s = results[key]
        window = args.scale_window
        enqueue_target = 5.0 * window / 100_000
        complete = s["tasks"] >= s["tasks_planned"]
        held = f"{s['tasks']:,} queued" + ("" if complete else f" (of {s['tasks_planned']:,}: the {args.scale_timeout:.0f} s limit)")
        section = f"{s['tasks_planned']:,} queued, batches of 1,000" + (
            ", scheduled a month ahead in an enabled session" if s.get("scheduled") else "")
        if s["first_window_s"] is not None:
            row(section, f"the first {window:,} enqueued (an empty store)", f"{s['first_window_s']:.2f} s", f"≤ {enqueue_target:g} s",
                s["first_window_s"] <= enqueue_target)
            ratio = s["last_window_s"] / s["first_window_s"]
            row(section, f"the last {window:,} ÷ the first {window:,}",
                f"{ratio:.2f} ({s['last_window_s']:.2f} s / {s['first_window_s']:.2f} s; {held})", "≤ 1.25", complete and ratio <= 1.25)
        rss = max(s["rss_mib"], s["rss_after_restart_mib"], s["rss_after_load_mib"])
        row(section, f"RSS with {s['tasks']:,} present", f"{rss:.1f} MiB", "≤ 128 MiB", complete and rss <= 128)
        ready = s["restart_to_ready_s"]
        row(section, "SIGTERM, new process to the first 200 of /readyz",
            "never ready" if ready is None else f"{ready:.2f} s (the stop took {s['stop_s']:.2f} s)", "≤ 3 s",
            complete and ready is not None and ready <= 3)
        get = s["get_task"]
        row(section, f"GET /v1/tasks/{{id}} with {s['tasks']:,} present", f"{get['requests_per_s']:,.0f} req/s, p99 {get['p99_ms']:.2f} ms",
            "≥ 10,000 req/s, p99 ≤ 10 ms", complete and get["requests_per_s"] >= 10_000 and get["p99_ms"] <= 10
            and get["socket_errors"] == 0 and not any("Non-2xx" in e for e in get["errors"]))
    if "postgres" in results:
        pg = results["postgres"]
        section = f"the state in PostgreSQL, {pg['files']:,} × 4 KiB to nginx"
        ratio = pg["postgres"]["daemon_cpu_ms_per_task"] / pg["sqlite"]["daemon_cpu_ms_per_task"]
        row(section, "daemon CPU per task, PostgreSQL ÷ SQLite",
            f"{ratio:.2f} ({pg['postgres']['daemon_cpu_ms_per_task']:.3f} / {pg['sqlite']['daemon_cpu_ms_per_task']:.3f} ms; "
            f"the database {pg['postgres']['database_cpu_ms_per_task']:.3f} ms more)", "≤ 2", ratio <= 2)
        post = pg["post_task"]
        row(section, "single durable POSTs", f"{post['requests_per_s']:,.0f} req/s, p99 {post['p99_ms']:.2f} ms, "
            f"{post['other_status']} not 201", "≥ 2,000 req/s", post["requests_per_s"] >= 2000 and post["other_status"] == 0)
        window = pg["enqueue_window"]
        row(section, f"the first {window:,} enqueued (batches of 1,000)", f"{pg['enqueue_window_s']:.2f} s",
            f"≤ {10 * window / 100_000:g} s", pg["enqueue_window_s"] <= 10 * window / 100_000)
        three = pg["three_nodes"]
        row(section, "three nodes on one database: CPU per task (daemons + database)",
            f"{three['total_cpu_ms_per_task']:.3f} ms ({three['wall_s']:.2f} s; one node {pg['postgres']['total_cpu_ms_per_task']:.3f} ms)",
            "reported", None)
    if results.get("cases"):
        cases = results["cases"]
        section = f"{args.size_mib} MiB to nginx"
        raw = cases["backhauld raw"]
        row(section, "backhauld raw ÷ curl -T", f"{raw['ratio_to_curl']:.2f}", "≤ 1.05", raw["ratio_to_curl"] <= 1.05)
        chunked = cases["backhauld chunked"]
        row(section, "backhauld chunked (8 MiB) ÷ curl -T (earlier target)", f"{chunked['ratio_to_curl']:.2f}", "≤ 1.15",
            chunked["ratio_to_curl"] <= 1.15)
        peaks = {name: case["peak_rss_mib"] for name, case in {**cases, **results.get("download", {})}.items() if "peak_rss_mib" in case}
        worst = max(peaks, key=peaks.get)
        row(section, "peak RSS (raw, chunked, download)", f"{peaks[worst]:.1f} MiB ({worst})", "≤ 64 MiB", peaks[worst] <= 64)
    if "webhooks" in results:
        hooks = results["webhooks"]
        # "Nothing gets worse": 445 events/s on 2026-11-22, less this machine's ±15% drift.
        row(f"{hooks['events']:,} task.completed webhooks", "events delivered per second, end to end",
            f"{hooks['events_per_s']:,.0f} events/s", "≥ 378 (445 on 2026-11-22, −15% drift)", hooks["events_per_s"] >= 378)
    return rows


# ---------------------------------------------------------------------------------------------
# 7. The state in PostgreSQL


class Postgres:
    """PostgreSQL (Debian's, the newest installed) in a temporary directory, on a free port of 127.0.0.1,
    trusting local connections (a benchmark's own server), with its defaults otherwise (fsync on,
    synchronous_commit on). As root it runs as the `postgres` user."""

    def __init__(self):
        # Its own directory under /tmp: the benchmark's work directory is private to root.
        directory = tempfile.mkdtemp(prefix="backhaul-bench-pg-")
        self.directory = directory
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.data = f"{directory}/data"
        self.sockets = f"{directory}/sockets"
        os.makedirs(self.sockets)
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_owner:
            shutil.chown(directory, "postgres")
            shutil.chown(self.sockets, "postgres")
        run(self.as_owner + [f"{self.bin}/initdb", "-D", self.data, "-U", "backhaul", "--auth=trust", "-E", "UTF8",
                             "--no-instructions"], timeout=120, stdout=subprocess.DEVNULL)
        self.port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.sockets} -c max_connections=200"
        run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", self.data, "-o", options, "-l", f"{directory}/server.log", "-w",
                             "start"], timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.databases = 0

    def fresh(self):
        """A new empty database's URL."""
        self.databases += 1
        name = f"bench{self.databases}"
        run([f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "backhaul", "-d", "postgres", "-qc",
             f"CREATE DATABASE {name}"], timeout=60)
        return f"postgres://backhaul@127.0.0.1:{self.port}/{name}"

    def cpu_seconds(self):
        """CPU of the server: the postmaster with what its ended children used, and the live ones."""
        with open(f"{self.data}/postmaster.pid") as pidfile:
            postmaster = int(pidfile.readline())
        _, fields = proc_stat(f"/proc/{postmaster}/stat")
        ticks = os.sysconf("SC_CLK_TCK")
        total = sum(int(fields[index]) for index in (11, 12, 13, 14)) / ticks
        for child in subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split():
            try:
                total += proc_cpu_seconds(int(child))
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total

    def stop(self):
        run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], timeout=60,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.directory, ignore_errors=True)


def fleet_run(args, work, data, source, nginx_port, label, states, database=None):
    """`args.files` small uploads posted to the first of `len(states)` daemons (each given its
    extra flags in `states`), waited for on that node; the wall time, every daemon's CPU and, with
    `database`, the server's, per task."""
    daemons = [start_daemon(args.binary, f"{work}/state-{label}-{index}", data, extra) for index, extra in enumerate(states)]
    try:
        port = daemons[0][1]
        body = many_session(port, source, f"http://127.0.0.1:{nginx_port}/{label}", args.files)
        cpu_before = [proc_cpu_seconds(process.pid) for process, _ in daemons]
        database_before = database.cpu_seconds() if database else 0
        started = time.time()
        post_many(port, body, args.files, interval=0.05)
        wall = time.time() - started
        daemon_cpu = sum(proc_cpu_seconds(process.pid) - before for (process, _), before in zip(daemons, cpu_before))
        database_cpu = database.cpu_seconds() - database_before if database else 0
        return {"nodes": len(daemons), "wall_s": wall, "files_per_s": args.files / wall,
                "daemon_cpu_ms_per_task": daemon_cpu * 1000 / args.files,
                "database_cpu_ms_per_task": database_cpu * 1000 / args.files,
                "total_cpu_ms_per_task": (daemon_cpu + database_cpu) * 1000 / args.files}
    finally:
        for process, _ in daemons:
            stop(process)


def postgres_section(args, work, data, nginx_port):
    """One node on SQLite and one on PostgreSQL, the same small uploads, rounds interleaved; then
    single-task POSTs under wrk and the first `--scale-window` (100,000) enqueued on PostgreSQL; then three nodes on
    one database. 2 cores show what a node costs, not how a fleet scales."""
    source = make_files(data, "small", args.files, 4096)
    database = Postgres()
    results = {"files": args.files, "file_bytes": 4096}
    try:
        runs = {"sqlite": [], "postgres": []}
        for round_index in range(args.runs):
            runs["sqlite"].append(fleet_run(args, work, data, source, nginx_port, f"pg-sqlite-{round_index}", [[]]))
            url = database.fresh()
            runs["postgres"].append(fleet_run(
                args, work, data, source, nginx_port, f"pg-one-{round_index}",
                [["--state", url, "--node-id", "a", "--shared-root", data]], database))
        for name, values in runs.items():
            cpus = [value["daemon_cpu_ms_per_task"] for value in values]
            results[name] = values[cpus.index(statistics.median_low(cpus))]
        url = database.fresh()
        results["three_nodes"] = fleet_run(
            args, work, data, source, nginx_port, "pg-three",
            [["--state", url, "--node-id", f"n{index}", "--shared-root", data] for index in range(3)], database)
        # Single durable POSTs, and the first `--scale-window` (100,000), into a disabled session.
        url = database.fresh()
        daemon, port = start_daemon(args.binary, f"{work}/state-pg-api", data, ["--state", url, "--node-id", "api"])
        try:
            one = one_file(data)
            disabled_session(port, "api")
            results["post_task"] = post_load(args, work, port, one, "api")
            disabled_session(port, "bulk")
            batch = json.dumps({"tasks": [{"file": one, "request": {"url": f"http://127.0.0.1:9/q/{index}"}}
                                          for index in range(1000)]}).encode()
            marks, _ = post_batches(port, "bulk", batch, args.scale_window // 1000)
            results["enqueue_window"] = args.scale_window
            results["enqueue_window_s"] = marks[-1] - marks[0]
        finally:
            stop(daemon)
    finally:
        database.stop()
    return results


def print_postgres(args, results):
    print(f"\nThe state in PostgreSQL: {results['files']:,} × 4 KiB to nginx, median of {args.runs} rounds "
          "(CPU in ms per task)")
    print(f"  {'':34} {'wall':>8} {'files/s':>8} {'daemon':>8} {'database':>9} {'total':>8}")
    for name, label in (("sqlite", "one node, SQLite"), ("postgres", "one node, PostgreSQL"),
                        ("three_nodes", "three nodes, one PostgreSQL")):
        case = results[name]
        print(f"  {label:34} {case['wall_s']:7.2f}s {case['files_per_s']:8.0f} {case['daemon_cpu_ms_per_task']:8.3f} "
              f"{case['database_cpu_ms_per_task']:9.3f} {case['total_cpu_ms_per_task']:8.3f}")
    post = results["post_task"]
    print(f"  single-task POSTs (wrk, 16 connections): {post['requests_per_s']:,.0f}/s, p99 {post['p99_ms']:.2f} ms; "
          f"the first {results['enqueue_window']:,} in batches of 1,000: {results['enqueue_window_s']:.2f} s")


# ---------------------------------------------------------------------------------------------
# Printing


def print_transfers(title, cases, width):
    """One big transfer's rows (upload or download): wall time, rate, ratio to curl, CPU, peak RSS."""
    print(f"\n{title}")
    print(f"{'case':<{width}}{'wall s':>9}{'MiB/s':>9}{'× curl':>9}{'CPU s/GiB':>11}{'peak RSS MiB':>14}   runs")
    for name, case in cases.items():
        cpu = f"{case['cpu_s_per_gib']:.2f}" if "cpu_s_per_gib" in case else "–"
        peak = f"{case['peak_rss_mib']:.1f}" if "peak_rss_mib" in case else "–"
        print(f"{name:<{width}}{case['wall_s']:>9.2f}{case['mib_per_s']:>9.0f}{case['ratio_to_curl']:>9.2f}{cpu:>11}{peak:>14}   "
              + " ".join(f"{wall:.2f}" for wall in case["walls"]))


def print_webhooks(results):
    hooks = results["webhooks"]
    print(f"\nwebhooks: {hooks['events']} task.completed events delivered (nginx 204 receiver) "
          f"{hooks['all_delivered_s']:.2f} s after enqueue, uploads done at {hooks['uploads_s']:.2f} s: "
          f"{hooks['events_per_s']:.0f} events/s end to end")


def print_many(args, cases, sink):
    print(f"\n{args.files} files of 256 KiB, one batch, to {sink}, median of {args.runs} interleaved rounds")
    print(f"{'case':<28}{'wall s':>9}{'files/s':>10}{'backhauld ÷ this':>18}   runs")
    for name, case in cases.items():
        walls = " ".join(f"{wall:.2f}" for wall in case["walls"])
        print(f"{name:<28}{case['wall_s']:>9.2f}{case['files_per_s']:>10.0f}{case['ratio_backhauld_to_this']:>18.3f}   {walls}")
    if "cpu_ms_per_task" in cases["backhauld"]:
        bh = cases["backhauld"]
        print(f"backhauld: {bh['cpu_s']:.2f} CPU-s over the run, {bh['cpu_ms_per_task']:.3f} ms per task "
              f"(run of the median: user {bh['user_s']:.2f} s, system {bh['system_s']:.2f} s, "
              f"{bh['faults_per_task']:.1f} minor page faults a task); peak RSS {bh['peak_rss_mib']:.1f} MiB")
        if bh.get("threads_ms_per_task"):
            print("  by thread, ms a task (user + system): " + ", ".join(
                f"{name} {t['user']:.3f} + {t['system']:.3f}" for name, t in bh["threads_ms_per_task"].items()))


def print_https(args, cases):
    print(f"\n{args.files} files of 256 KiB over https (a self-signed certificate) to nginx WebDAV on tmpfs, "
          f"median of {args.runs} interleaved rounds")
    print(f"{'case':<22}{'wall s':>9}{'files/s':>10}{'÷ curl -Z':>11}{'CPU ms a task':>15}   connections (each a handshake), runs")
    for name, case in cases.items():
        ratio = f"{case['ratio_to_curl_z']:.3f}" if "ratio_to_curl_z" in case else ""
        cpu = f"{case['cpu_ms_per_task']:.3f}" if "cpu_ms_per_task" in case else ""
        print(f"{name:<22}{case['wall_s']:>9.2f}{case['files_per_s']:>10.0f}{ratio:>11}{cpu:>15}   "
              f"{' '.join(str(c) for c in case['connections'])}; {' '.join(f'{w:.2f}' for w in case['walls'])}")


def print_api(args, results):
    print(f"\nAPI under load (wrk, 2 threads, 16 connections, {args.load_seconds} s)")
    for name in ("get_task", "post_task"):
        case = results[name]
        extra = ""
        if "expected_status" in case:
            extra = f"  {case['expected_status']} answered 201, {case['other_status']} otherwise"
        print(f"{name:<12}{case['requests_per_s']:>10.0f} req/s   p99 {case['p99_ms']:.2f} ms{extra}  {' '.join(case['errors'])}")


def print_scale(args, results, key="scale"):
    s = results[key]
    print(f"\n{key}: {s['tasks']:,} tasks (of {s['tasks_planned']:,}) enqueued in batches of 1,000 in {s['enqueue_s']:.1f} s "
          f"({s['enqueue_cpu_s']:.1f} CPU-s of the daemon); database {s['database_mib']:.0f} MiB")
    if s["per_tenth_s"]:
        print("  seconds per tenth of the way: " + " ".join(f"{t:.2f}" for t in s["per_tenth_s"]))
    print(f"  RSS {s['rss_mib']:.1f} MiB after the enqueue (peak {s['peak_rss_mib']:.1f}), {s['rss_after_load_mib']:.1f} after the GET load, "
          f"{s['rss_after_restart_mib']:.1f} after a restart; stop {s['stop_s']:.2f} s, start to ready "
          f"{s['restart_to_ready_s'] if s['restart_to_ready_s'] is None else round(s['restart_to_ready_s'], 3)} s")
    get = s["get_task"]
    print(f"  GET with them present: {get['requests_per_s']:.0f} req/s, p99 {get['p99_ms']:.2f} ms {' '.join(get['errors'])}")


def print_profile(results):
    profile = results["profile"]
    print(f"\ninstructions per 64 KiB task to nginx (callgrind, {profile['tasks']} tasks minus an idle run): "
          f"backhauld {profile['backhauld_per_task']:,.0f}, one curl process {profile['curl_per_task']:,.0f}")


def print_targets(args, rows):
    print("\nTargets" + (" (--quick: sizes shrunk, the verdicts are not the targets')" if args.quick else ""))
    widths = [max(len(r["section"]) for r in rows), max(len(r["row"]) for r in rows), max(len(r["figure"]) for r in rows),
              max(len(r["target"]) for r in rows)]
    for r in rows:
        verdict = "–" if r["met"] is None else ("met" if r["met"] else "NOT MET")
        print(f"{r['section']:<{widths[0]}}  {r['row']:<{widths[1]}}  {r['figure']:<{widths[2]}}  {r['target']:<{widths[3]}}  {verdict}")
    met = sum(1 for r in rows if r["met"])
    print(f"{met} of {len(rows)} met")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook-events", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--scale-tasks", type=int, default=1_000_000, help="tasks queued by the scale section")
    parser.add_argument("--scale-window", type=int, default=100_000, help="first and last N tasks compared")
    parser.add_argument("--scale-timeout", type=float, default=1800, help="seconds the scale enqueue may take")
    parser.add_argument("--load-seconds", type=int, default=10)
    parser.add_argument("--profile-tasks", type=int, default=300)
    parser.add_argument("--keep-profiles", default=None, help="copy the callgrind outputs into this directory")
    parser.add_argument("--only", default="big,download,webhooks,many,rclone,https,api,scale,profile,postgres",
                        help="comma-separated sections to run")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: checks the script, not the figures")
    parser.add_argument("--binary", default=f"{ROOT}/.build/release/backhauld")
    parser.add_argument("--output", default=f"{ROOT}/bench-results/latest.json")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.runs, args.webhook_events, args.files, args.load_seconds = 64, 1, 200, 200, 2
        args.scale_tasks, args.scale_window, args.profile_tasks = 20_000, 2_000, 40
    if args.scale_window % 1000 or args.scale_window > args.scale_tasks:
        parser.error("--scale-window is a multiple of 1,000 and at most --scale-tasks")
    sections = set(args.only.split(","))
    unknown = sections - {"big", "download", "webhooks", "many", "rclone", "https", "api", "scale", "profile", "postgres"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"no binary at {args.binary} (make bench builds it)")

    work = tempfile.mkdtemp(prefix="backhaul-bench-")
    sink_dir = tempfile.mkdtemp(prefix="backhaul-sink-", dir="/dev/shm")
    data = f"{work}/data"
    os.makedirs(data)
    source = f"{data}/big.bin"
    if {"big", "download"} & sections:
        with open(source, "wb") as out:
            block = os.urandom(MIB)
            for _ in range(args.size_mib):
                out.write(block)
    # The load average says how much else the shared machine was doing during the run.
    results = {"date": time.strftime("%Y-%m-%d"), "binary": args.binary, "quick": args.quick, "size_mib": args.size_mib,
               "runs": args.runs, "files": args.files, "loadavg_start": os.getloadavg(), "cases": {}}
    nginx, nginx_port = start_nginx(sink_dir)
    chunk_sink = ChunkSink(sink_dir)
    try:
        if "big" in sections:
            results["cases"] = big_file(args, work, data, source, sink_dir, nginx_port, chunk_sink)
        if "download" in sections:
            results["download"] = big_download(args, work, data, source, sink_dir, nginx_port)
        if "webhooks" in sections:
            results["webhooks"] = webhook_throughput(args, work, data, nginx_port)
        if "many" in sections:
            results["many_files_nginx"] = many_files_nginx(args, work, data, sink_dir, nginx_port)
        if "rclone" in sections:
            results["many_files_rclone"] = many_files_rclone(args, work, data)
        if "https" in sections:
            results["many_files_https"] = many_files_https(args, work, data)
        if "api" in sections:
            results.update(api_load(args, work, data))
        if "scale" in sections:
            results["scale"] = scale(args, work, data)
            results["scale_scheduled"] = scale(args, work, data, scheduled=True)
        if "profile" in sections:
            results["profile"] = profile_tasks(args, work, data, nginx_port)
        if "postgres" in sections:
            results["postgres"] = postgres_section(args, work, data, nginx_port)
    finally:
        stop(nginx, signal.SIGQUIT, timeout=10)
        chunk_sink.server.shutdown()
        stop_children()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sink_dir, ignore_errors=True)

    if results["cases"]:
        print_transfers(f"{args.size_mib} MiB to nginx on loopback, median of {args.runs} interleaved rounds", results["cases"], 20)
    if "download" in results:
        print_transfers(f"{args.size_mib} MiB download from nginx into tmpfs, median of {args.runs} runs",
                        results["download"], 28)
    if "webhooks" in results:
        print_webhooks(results)
    if "many_files_nginx" in results:
        print_many(args, results["many_files_nginx"], "nginx WebDAV (dav_methods PUT) on tmpfs")
    if "many_files_rclone" in results:
        print_many(args, results["many_files_rclone"], "rclone serve webdav on tmpfs (where rclone copy works)")
    if "many_files_https" in results:
        print_https(args, results["many_files_https"])
    if "post_task" in results:
        print_api(args, results)
    for key in ("scale", "scale_scheduled"):
        if key in results:
            print_scale(args, results, key)
    if "profile" in results:
        print_profile(results)
    if "postgres" in results:
        print_postgres(args, results["postgres"])
    results["loadavg_end"] = os.getloadavg()
    print(f"\nload average (1, 5, 15 min) at the start {' '.join(f'{x:.2f}' for x in results['loadavg_start'])}, "
          f"at the end {' '.join(f'{x:.2f}' for x in results['loadavg_end'])} (2 cores, shared)")
    results["targets"] = targets(args, results)
    if results["targets"]:
        print_targets(args, results["targets"])
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(results, out, indent=2)
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    sys.exit(main())
