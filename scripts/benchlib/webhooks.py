"""Section webhooks: N small uploads, one subscription, nginx answering 204 as the receiver."""
from .common import *  # noqa: F403 (the shared helpers and modules)


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
