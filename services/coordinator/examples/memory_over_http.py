# Run: python3 services/coordinator/examples/memory_over_http.py BIN KEYS PORT [CKPT]
# Fills a fresh coordinator with exactly KEYS keys over POST /events (store
# batches of 1,000 new L2 chunks, 16-byte hashes, from 16 instances in turn,
# one request at a time, the loadgen's shape) and prints the server's VmRSS
# and VmHWM (peak) per key from /proc. With CKPT the server checkpoints to it
# at its clean stop (SIGTERM), so the same fill feeds restart_to_ready.
import http.client, json, os, signal, subprocess, sys, time

binary, keys, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ckpt = sys.argv[4] if len(sys.argv) > 4 else ""
args = [binary, "--host", "127.0.0.1", "--port", str(port), "--checkpoint-interval", "0",
        "--max-directory-keys", "0"]
if ckpt:
    args += ["--checkpoint-path", ckpt]
p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def status_kb(field):
    with open(f"/proc/{p.pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field))


def call(c, method, path, body=None):
    headers = {"content-type": "application/json"} if body is not None else {}
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"{method} {path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def wait_for(what, check, deadline_s=120):
    # The server may exit (bad flag, port taken) or never get there: fail with
    # a reason instead of waiting forever.
    deadline = time.monotonic() + deadline_s
    while True:
        if p.poll() is not None:
            raise SystemExit(f"the server exited with {p.returncode} before {what}")
        if check():
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {deadline_s} s")
        time.sleep(0.05)


def ready():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/ready")
        return c.getresponse().status == 200
    except OSError:
        return False


try:
    wait_for("readiness", ready)
    c = http.client.HTTPConnection("127.0.0.1", port)
    instances = 16
    for i in range(instances):
        call(c, "POST", "/instances", json.dumps({"instance_id": f"mp-{i}", "ip": "127.0.0.1", "http_port": 1}))
    tail = '","model_name":"m","kv_rank":0},"size_bytes":65536}'
    seq = [0] * instances
    done, t0, batch = 0, time.monotonic(), 1000
    while done < keys:
        i = (done // batch) % instances
        seq[i] += 1
        n = min(batch, keys - done)
        entries = ",".join(f'{{"key":{{"chunk_hash_hex":"{i:016x}{done + k:016x}{tail}' for k in range(n))
        body = (f'{{"batches":[{{"instance_id":"mp-{i}","incarnation":1,"seq":{seq[i]},'
                f'"event_type":"store","tier":"l2","backend":"fs","entries":[{entries}]}}]}}')
        call(c, "POST", "/events", body)
        done += n
    fill_s = time.monotonic() - t0
    # /events answers before the writer applies the batch: poll until every key
    # is in the directory rather than guessing how long that takes.
    wait_for(f"{keys} keys in the directory", lambda: call(c, "GET", "/directory/stats")["num_keys"] == keys)
    rss, hwm = status_kb("VmRSS:") * 1024, status_kb("VmHWM:") * 1024
    print(f"{keys} keys filled over HTTP in {fill_s:.1f} s; RSS {rss / 2**20:.0f} MiB = {rss / keys:.1f} B a key, "
          f"peak (VmHWM) {hwm / 2**20:.0f} MiB = {hwm / keys:.1f} B a key")
finally:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
