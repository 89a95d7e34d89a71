#!/usr/bin/env python3
"""Side-by-side benchmark on loopback, in one run; prints tables and writes JSON.

1. One big file: backhauld raw and chunked vs `curl -T`, to the same nginx sink.
2. Many small files (2,000 × 256 KiB as one batch): backhauld vs one curl process uploading them
   one after another over a reused connection vs `rclone copy --transfers 8`, all to the same
   WebDAV sink (`rclone serve webdav`).
3. The API under load (wrk): GET /v1/tasks/{id} and single POST enqueues; requests/s and p99.
4. Scale: 100,000 tasks enqueued in batches of 1,000 (held in a disabled session), the daemon's
   RSS, restart-to-ready time with them in the store, and GET latency with them present.

Sinks live on tmpfs (/dev/shm) so the disk does not bound the figures; cases run several times
and tables show medians. Usage: scripts/bench.py [--size-mib 1024] [--runs 3] [--quick]
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def api(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(directory):
    port = free_port()
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
  access_log off;
  client_body_temp_path {directory}/tmp;
  server {{
    listen 127.0.0.1:{port};
    location / {{ root {directory}/root; dav_methods PUT; create_full_put_path on; client_max_body_size 0; }}
    location /hooks {{ return 204; }}
  }}
}}
""")
    process = subprocess.Popen(["nginx", "-c", f"{directory}/nginx.conf", "-p", f"{directory}/"])
    time.sleep(0.5)
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


def proc_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start_daemon(binary, state, root, extra=()):
    log = open(state + ".log", "a")
    process = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--state-dir", state, "--allow-root", root, *extra],
                               stderr=log, stdout=log)
    skip = listening_lines(state)
    deadline = time.time() + 20
    while time.time() < deadline:
        with open(state + ".log") as lines:
            for line in list(lines)[skip:]:
                if '"msg":"listening"' in line:
                    return process, int(json.loads(line)["http.port"])
        time.sleep(0.05)
    raise RuntimeError("backhauld did not start")


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
        time.sleep(0.02)
    if pending:
        raise RuntimeError(f"{len(pending)} tasks did not finish")


def proc_rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wait_port(port, timeout=20):
    import socket
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_webdav(directory):
    """rclone's own WebDAV server: a sink that rclone, curl and backhauld can all PUT to."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    process = subprocess.Popen(["rclone", "serve", "webdav", directory, "--addr", f"127.0.0.1:{port}"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return process, port


def many_files(args, work, data):
    """2,000 × 256 KiB: backhauld (one batch) vs one curl process vs rclone copy --transfers 8."""
    source = f"{data}/many"
    os.makedirs(source)
    for index in range(args.files):
        with open(f"{source}/{index}.bin", "wb") as out:
            out.write(os.urandom(256 * 1024))
    sink = tempfile.mkdtemp(prefix="backhaul-dav-", dir="/dev/shm")
    # Destination folders exist before the server starts (rclone caches directory listings).
    for run in range(args.runs):
        os.makedirs(f"{sink}/curl{run}")
        os.makedirs(f"{sink}/curlz{run}")
        os.makedirs(f"{sink}/bh{run}")
    webdav, port = start_webdav(sink)
    cases = {}
    try:
        def count(directory):
            return len(os.listdir(f"{sink}/{directory}")) if os.path.isdir(f"{sink}/{directory}") else 0

        # One curl process, the files one after another over one reused connection; then the same
        # process with 16 transfers in parallel (-Z): no durable state at all, so it shows the
        # floor this sink and these two cores allow.
        for name, flags, folder in (("curl (one process)", [], "curl"), ("curl -Z (16 parallel)", ["-Z", "--parallel-max", "16", "--no-progress-meter"], "curlz")):
            for run in range(args.runs):
                config = f"{work}/{folder}-{run}.cfg"
                with open(config, "w") as out:
                    for index in range(args.files):
                        out.write(f'upload-file = "{source}/{index}.bin"\nurl = "http://127.0.0.1:{port}/{folder}{run}/{index}.bin"\n'
                                  f'output = "/dev/null"\n')
                started = time.time()
                subprocess.run(["curl", "-sSf", *flags, "-K", config], check=True, stdout=subprocess.DEVNULL)
                cases.setdefault(name, []).append(time.time() - started)
                assert count(f"{folder}{run}") == args.files
        # rclone copy --transfers 8 (its WebDAV backend).
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        for run in range(args.runs):
            started = time.time()
            subprocess.run(["rclone", "copy", "--transfers", "8", source, f":webdav,url='http://127.0.0.1:{port}':rclone{run}"],
                           check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cases.setdefault("rclone copy --transfers 8", []).append(time.time() - started)
            assert count(f"rclone{run}") == args.files
        # backhauld: one batch, from enqueue to the last completion (durable state included).
        for run in range(args.runs):
            state = f"{work}/state-many-{run}"
            daemon, api_port = start_daemon(args.binary, state, data)
            try:
                api(api_port, "PUT", "/v1/sessions/many", {"configuration": {"max_connections_per_host": 16}})
                tasks = [{"file": f"{source}/{index}.bin", "request": {"url": f"http://127.0.0.1:{port}/bh{run}/{index}.bin"}}
                         for index in range(args.files)]
                started = time.time()
                status, created = api(api_port, "POST", "/v1/sessions/many/tasks", {"tasks": tasks})
                assert status == 201, created
                deadline = time.time() + 600
                while time.time() < deadline:
                    _, session = api(api_port, "GET", "/v1/sessions/many")
                    counts = session["task_counts"]
                    if counts["completed"] + counts["failed"] == args.files:
                        break
                    time.sleep(0.01)
                cases.setdefault("backhauld", []).append(time.time() - started)
                if counts["completed"] != args.files:
                    _, failed = api(api_port, "GET", "/v1/sessions/many/tasks?state=failed&limit=1")
                    raise RuntimeError(f"{counts}: {failed['tasks'][0]['error']}")
                assert count(f"bh{run}") == args.files
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=30)
    finally:
        webdav.terminate()
        webdav.wait(timeout=10)
        shutil.rmtree(sink, ignore_errors=True)
    result = {name: {"wall_s": statistics.median(walls), "files_per_s": args.files / statistics.median(walls)}
              for name, walls in cases.items()}
    for case in result.values():
        case["ratio_backhauld_to_this"] = result["backhauld"]["wall_s"] / case["wall_s"]
    return result


def wrk(url, seconds, connections=16, script=None):
    """requests/s and p99 latency (ms) from wrk --latency."""
    command = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    if script:
        command[1:1] = ["-s", script]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    rate = float(next(line.split()[1] for line in output.splitlines() if line.startswith("Requests/sec:")))
    p99 = next(line.split()[1] for line in output.splitlines() if line.strip().startswith("99%"))
    units = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    unit = next(u for u in ("us", "ms", "s") if p99.endswith(u))
    errors = [line.strip() for line in output.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    return {"requests_per_s": rate, "p99_ms": float(p99[: -len(unit)]) * units[unit], "errors": errors}


def api_and_scale(args, work, data):
    """The API under load, then 100,000 tasks in the store."""
    source = f"{data}/one.bin"
    with open(source, "wb") as out:
        out.write(b"x" * 1000)
    state = f"{work}/state-api"
    daemon, port = start_daemon(args.binary, state, data)
    results = {}
    try:
        # A disabled session: tasks wait, so the figures are the API's and the store's alone.
        api(port, "PUT", "/v1/sessions/api", {"configuration": {}})
        api(port, "PATCH", "/v1/sessions/api", {"enabled": False})
        _, task = api(port, "POST", "/v1/sessions/api/tasks", {"file": source, "request": {"url": "http://127.0.0.1:9/x"}})
        results["get_task"] = wrk(f"http://127.0.0.1:{port}/v1/tasks/{task['id']}", args.load_seconds)
        script = f"{work}/post.lua"
        with open(script, "w") as out:
            body = json.dumps({"file": source, "request": {"url": "http://127.0.0.1:9/x"}})
            out.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\nwrk.headers["Content-Type"] = "application/json"\n')
        results["post_task"] = wrk(f"http://127.0.0.1:{port}/v1/sessions/api/tasks", args.load_seconds, script=script)

        # Scale: 100,000 tasks in batches of 1,000.
        api(port, "PUT", "/v1/sessions/scale", {"configuration": {}})
        api(port, "PATCH", "/v1/sessions/scale", {"enabled": False})
        started = time.time()
        last = None
        for batch in range(args.scale_tasks // 1000):
            tasks = [{"file": source, "request": {"url": f"http://127.0.0.1:9/{batch}/{index}"}} for index in range(1000)]
            status, created = api(port, "POST", "/v1/sessions/scale/tasks", {"tasks": tasks})
            assert status == 201, created
            last = created["tasks"][-1]["id"]
        enqueue_s = time.time() - started
        rss = proc_rss_mib(daemon.pid)
        get_loaded = wrk(f"http://127.0.0.1:{port}/v1/tasks/{last}", args.load_seconds)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        started = time.time()
        daemon, port = start_daemon(args.binary, state, data)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if api(port, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.01)
        ready_s = time.time() - started
        time.sleep(1)
        results["scale"] = {"tasks": args.scale_tasks, "enqueue_s": enqueue_s, "rss_mib": rss,
                            "rss_after_restart_mib": proc_rss_mib(daemon.pid), "restart_to_ready_s": ready_s,
                            "get_task": get_loaded}
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    return results


def webhook_throughput(args, work, data, nginx_port):
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
                _, delivered = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=delivered&limit=1000")
                if not pending["deliveries"]:
                    break
            time.sleep(0.02)
        delivered_at = time.time() - started
        count = 0
        cursor = ""
        while True:
            _, page = api(port, "GET", f"/v1/webhooks/{webhook['id']}/deliveries?state=delivered&limit=1000&cursor={cursor}")
            count += len(page["deliveries"])
            if not page["next_cursor"]:
                break
            cursor = page["next_cursor"]
        return {"events": count, "uploads_s": uploads_done, "all_delivered_s": delivered_at,
                "events_per_s": count / delivered_at}
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def big_file(args, work, data, source, sink_dir, nginx_port, chunk_sink):
    """One big file: curl -T, then backhauld raw and chunked (8 MiB), to the same sinks."""
    cases = {}

    def sink_port(upload):
        return nginx_port if upload["protocol"] == "raw" else chunk_sink.port

    # curl -T, the baseline.
    walls = []
    for run in range(args.runs):
        target = f"http://127.0.0.1:{nginx_port}/curl/{run}.bin"
        subprocess.run(["sync"])
        started = time.time()
        subprocess.run(["curl", "-sS", "-o", "/dev/null", "-T", source, target], check=True)
        walls.append(time.time() - started)
        os.remove(f"{sink_dir}/root/curl/{run}.bin")
    cases["curl -T"] = {"wall_s": statistics.median(walls)}

    # backhauld, raw and chunked (8 MiB), to the same sink.
    gib = args.size_mib / 1024
    for name, upload in [("backhauld raw", {"protocol": "raw"}), ("backhauld chunked", {"protocol": "chunked"})]:
        walls, cpus, rss = [], [], []
        for run in range(args.runs):
            state = f"{work}/state-{name.split()[1]}-{run}"
            daemon, port = start_daemon(args.binary, state, data)
            try:
                api(port, "PUT", "/v1/sessions/bench", {"configuration": {}})
                cpu_before = proc_cpu_seconds(daemon.pid)
                subprocess.run(["sync"])
                started = time.time()
                status, task = api(port, "POST", "/v1/sessions/bench/tasks", {
                    "file": source, "upload": upload, "request": {"url": f"http://127.0.0.1:{sink_port(upload)}/bh/{run}.bin"}})
                assert status == 201, task
                wait_done(port, [task["id"]])
                walls.append(time.time() - started)
                cpus.append(proc_cpu_seconds(daemon.pid) - cpu_before)
                rss.append(proc_peak_rss_mib(daemon.pid))
                target = f"{sink_dir}/root/bh/{run}.bin" if upload["protocol"] == "raw" else chunk_sink.assembled(f"/bh/{run}.bin")
                if subprocess.run(["cmp", "-s", source, target]).returncode != 0:
                    raise RuntimeError(f"{name}: the uploaded file differs")
                os.remove(target)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=30)
        cases[name] = {"wall_s": statistics.median(walls), "cpu_s_per_gib": statistics.median(cpus) / gib,
                                  "peak_rss_mib": max(rss)}

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
        for run in range(args.runs):
            target = f"{target_dir}/curl-{run}.bin"
            started = time.time()
            subprocess.run(["curl", "-sS", "-o", target, url], check=True)
            walls.append(time.time() - started)
            os.remove(target)
        cases["curl -o"] = {"wall_s": statistics.median(walls)}
        walls, cpus, rss = [], [], []
        for run in range(args.runs):
            daemon, port = start_daemon(args.binary, f"{work}/state-download-{run}", data, ["--allow-root", target_dir])
            try:
                api(port, "PUT", "/v1/sessions/bench", {"configuration": {}})
                cpu_before = proc_cpu_seconds(daemon.pid)
                target = f"{target_dir}/bh-{run}.bin"
                started = time.time()
                status, task = api(port, "POST", "/v1/sessions/bench/tasks",
                                   {"kind": "download", "request": {"url": url}, "destination": target})
                assert status == 201, task
                wait_done(port, [task["id"]])
                walls.append(time.time() - started)
                cpus.append(proc_cpu_seconds(daemon.pid) - cpu_before)
                rss.append(proc_peak_rss_mib(daemon.pid))
                if subprocess.run(["cmp", "-s", source, target]).returncode != 0:
                    raise RuntimeError("backhauld download: the file differs")
                os.remove(target)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=30)
        cases["backhauld download"] = {"wall_s": statistics.median(walls), "cpu_s_per_gib": statistics.median(cpus) / (args.size_mib / 1024),
                                       "peak_rss_mib": max(rss)}
    finally:
        os.remove(served)
        shutil.rmtree(target_dir, ignore_errors=True)
    return cases


def callgrind_total(path):
    """The instruction count (Ir) a callgrind output file reports."""
    with open(path) as out:
        for line in out:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"no total in {path}")


def profile_tasks(args, work, data, nginx_port):
    """Instructions per small task, counted by callgrind (the same count whatever else the machine
    does): backhauld uploading N files of 64 KiB to nginx, minus an idle run of the same daemon,
    divided by N; beside one curl process uploading the same files (its start-up included)."""
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
        process = subprocess.Popen(valgrind + [f"--callgrind-out-file={out}", args.binary, "--listen", "127.0.0.1:0",
                                               "--state-dir", state, "--allow-root", data], stderr=log, stdout=log)
        port = None
        deadline = time.time() + 120
        while time.time() < deadline and port is None:
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
            batch = [{"file": f"{source}/{index}.bin", "request": {"url": f"http://127.0.0.1:{nginx_port}/profile-{name}/{index}.bin"}}
                     for index in range(tasks)]
            status, created = api(port, "POST", "/v1/sessions/profile/tasks", {"tasks": batch})
            assert status == 201, created
            deadline = time.time() + 600
            while time.time() < deadline:
                _, session = api(port, "GET", "/v1/sessions/profile")
                if session["task_counts"]["completed"] + session["task_counts"]["failed"] == tasks:
                    break
                time.sleep(0.2)
            assert session["task_counts"]["completed"] == tasks, session
        else:
            time.sleep(args.profile_idle_seconds)
        elapsed = time.time() - started
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
        return callgrind_total(out), elapsed

    busy, busy_seconds = run_daemon("busy", args.profile_tasks)
    args.profile_idle_seconds = busy_seconds
    idle, _ = run_daemon("idle", 0)
    config = f"{work}/profile-curl.cfg"
    with open(config, "w") as out:
        for index in range(args.profile_tasks):
            out.write(f'upload-file = "{source}/{index}.bin"\nurl = "http://127.0.0.1:{nginx_port}/profile-curl/{index}.bin"\n'
                      f'output = "/dev/null"\n')
    curl_out = f"{work}/callgrind-curl.out"
    subprocess.run(valgrind + [f"--callgrind-out-file={curl_out}", "curl", "-sSf", "-K", config], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    curl = callgrind_total(curl_out)
    if args.keep_profiles:
        os.makedirs(args.keep_profiles, exist_ok=True)
        for name in ("busy", "idle", "curl"):
            shutil.copy(f"{work}/callgrind-{name}.out", f"{args.keep_profiles}/callgrind-{name}.out")
    return {"tasks": args.profile_tasks, "busy_instructions": busy, "idle_instructions": idle,
            "backhauld_per_task": (busy - idle) / args.profile_tasks, "curl_per_task": curl / args.profile_tasks,
            "busy_seconds": busy_seconds}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook-events", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--scale-tasks", type=int, default=100_000)
    parser.add_argument("--load-seconds", type=int, default=10)
    parser.add_argument("--profile-tasks", type=int, default=300)
    parser.add_argument("--keep-profiles", default=None, help="copy the callgrind outputs into this directory")
    parser.add_argument("--only", default="big,download,webhooks,many,api,profile", help="comma-separated sections to run")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: checks the script, not the figures")
    parser.add_argument("--binary", default=f"{ROOT}/.build/release/backhauld")
    parser.add_argument("--output", default=f"{ROOT}/bench-results/latest.json")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.runs, args.webhook_events, args.files, args.scale_tasks, args.load_seconds = 64, 1, 200, 200, 5000, 2

    work = tempfile.mkdtemp(prefix="backhaul-bench-")
    sink_dir = tempfile.mkdtemp(prefix="backhaul-sink-", dir="/dev/shm")
    data = f"{work}/data"
    os.makedirs(data)
    source = f"{data}/big.bin"
    if {"big", "download"} & set(args.only.split(",")):
        with open(source, "wb") as out:
            block = os.urandom(1 << 20)
            for _ in range(args.size_mib):
                out.write(block)
    nginx, nginx_port = start_nginx(sink_dir)
    chunk_sink = ChunkSink(sink_dir)

    results = {"size_mib": args.size_mib, "runs": args.runs, "cases": {}}
    sections = set(args.only.split(","))
    try:
        if "big" in sections:
            results["cases"] = big_file(args, work, data, source, sink_dir, nginx_port, chunk_sink)
        if "download" in sections:
            results["download"] = big_download(args, work, data, source, sink_dir, nginx_port)
        if "webhooks" in sections:
            # Webhook deliveries: N small uploads, one subscription, nginx answering 204 as receiver.
            results["webhooks"] = webhook_throughput(args, work, data, nginx_port)
        if "many" in sections:
            results["many_files"] = many_files(args, work, data)
        if "api" in sections:
            results.update(api_and_scale(args, work, data))
        if "profile" in sections:
            results["profile"] = profile_tasks(args, work, data, nginx_port)
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sink_dir, ignore_errors=True)

    if results["cases"]:
        print_big(args, results)
    if "download" in results:
        print_download(args, results)
    if "webhooks" in results:
        print_webhooks(results)
    if "many_files" in results:
        print_many(args, results)
    if "scale" in results:
        print_api(args, results)
    if "profile" in results:
        profile = results["profile"]
        print(f"\ninstructions per 64 KiB task to nginx (callgrind, {profile['tasks']} tasks minus an idle run): "
              f"backhauld {profile['backhauld_per_task']:,.0f}, one curl process {profile['curl_per_task']:,.0f} "
              f"(target ≤ 500,000)")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(results, out, indent=2)


def print_big(args, results):
    base = results["cases"]["curl -T"]["wall_s"]
    print(f"{args.size_mib} MiB to nginx on loopback, median of {args.runs} runs")
    print(f"{'case':<20}{'wall s':>9}{'MiB/s':>9}{'× curl':>8}{'CPU s/GiB':>11}{'peak RSS MiB':>14}")
    for name, case in results["cases"].items():
        case["mib_per_s"] = args.size_mib / case["wall_s"]
        case["ratio_to_curl"] = case["wall_s"] / base
        print(f"{name:<20}{case['wall_s']:>9.2f}{case['mib_per_s']:>9.0f}{case['ratio_to_curl']:>8.2f}"
              f"{case.get('cpu_s_per_gib', float('nan')):>11.2f}{case.get('peak_rss_mib', float('nan')):>14.1f}")


def print_download(args, results):
    cases = results["download"]
    curl = cases["curl -o"]["wall_s"]
    print(f"\n{args.size_mib} MiB download from nginx into tmpfs, median of {args.runs} runs")
    print(f"{'case':<28}{'wall s':>9}{'MiB/s':>9}{'× curl':>9}{'CPU s/GiB':>11}{'peak RSS MiB':>14}")
    for name, case in cases.items():
        cpu = f"{case['cpu_s_per_gib']:.2f}" if "cpu_s_per_gib" in case else "–"
        peak = f"{case['peak_rss_mib']:.1f}" if "peak_rss_mib" in case else "–"
        print(f"{name:<28}{case['wall_s']:>9.2f}{args.size_mib / case['wall_s']:>9.0f}{case['wall_s'] / curl:>9.2f}{cpu:>11}{peak:>14}")


def print_webhooks(results):
    hooks = results["webhooks"]
    print(f"webhooks: {hooks['events']} task.completed events delivered (nginx 204 receiver) "
          f"{hooks['all_delivered_s']:.2f} s after enqueue, uploads done at {hooks['uploads_s']:.2f} s: "
          f"{hooks['events_per_s']:.0f} events/s end to end")


def print_many(args, results):
    print(f"\n{args.files} files of 256 KiB to one WebDAV sink (rclone serve webdav on tmpfs), median of {args.runs} runs")
    print(f"{'case':<28}{'wall s':>9}{'files/s':>10}{'backhauld ÷ this':>18}")
    for name, case in results["many_files"].items():
        print(f"{name:<28}{case['wall_s']:>9.2f}{case['files_per_s']:>10.0f}{case['ratio_backhauld_to_this']:>18.3f}")


def print_api(args, results):
    print(f"\nAPI under load (wrk, 2 threads, 16 connections, {args.load_seconds} s)")
    for name in ("get_task", "post_task"):
        case = results[name]
        print(f"{name:<28}{case['requests_per_s']:>10.0f} req/s   p99 {case['p99_ms']:.2f} ms  {' '.join(case['errors'])}")
    scale = results["scale"]
    print(f"\nscale: {scale['tasks']} tasks enqueued in batches of 1,000 in {scale['enqueue_s']:.2f} s; RSS {scale['rss_mib']:.1f} MiB "
          f"({scale['rss_after_restart_mib']:.1f} MiB after a restart); restart to ready {scale['restart_to_ready_s']:.2f} s; "
          f"GET with them present {scale['get_task']['requests_per_s']:.0f} req/s, p99 {scale['get_task']['p99_ms']:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
