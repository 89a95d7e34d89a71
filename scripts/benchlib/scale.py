"""Section scale: a million queued tasks, the first window against the last."""
from .common import *  # noqa: F403 (the shared helpers and modules)
from .api import disabled_session, one_file, post_batches, wrk


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
