"""Section profile: instructions per task under callgrind beside curl."""
from .common import *  # noqa: F403 (the shared helpers and modules)
from .many import curl_config


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
