"""Section api: wrk on GET /v1/tasks/{id} and on single-task POSTs, and the batch loops scale and
postgres share."""
from .common import *  # noqa: F403 (the shared helpers and modules)


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
