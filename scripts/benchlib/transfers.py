"""Section big (one big file up) and download (the same file down), against curl."""
from .common import *  # noqa: F403 (the shared helpers and modules)


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
