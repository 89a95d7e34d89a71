"""Sections many, rclone and https: many small files to nginx, rclone serve webdav, and over TLS."""
from .common import *  # noqa: F403 (the shared helpers and modules)


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
