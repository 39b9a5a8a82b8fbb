# Run: python3 services/coordinator/examples/lookups_during_capture.py BIN CKPT PORT INTERVAL_S DURATION_S
# Lookups (16 keys, keep-alive, one at a time) against a coordinator restored
# from a checkpoint with a periodic checkpoint every INTERVAL s; prints the
# latency distribution over DURATION s (captures happen meanwhile).
import http.client, json, subprocess, sys, time, os
binary, ckpt, port, interval, duration = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
p = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "--checkpoint-path", ckpt,
                      "--checkpoint-interval", interval, "--max-directory-keys", "0"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/ready")
            if c.getresponse().status == 200: break
        except OSError: pass
        time.sleep(0.05)
    c = http.client.HTTPConnection("127.0.0.1", port)
    keys = [{"chunk_hash_hex": "%032x" % (i * 7919), "model_name": "m", "kv_rank": 0} for i in range(16)]
    body = json.dumps({"keys": keys})
    lat = []
    end = time.monotonic() + duration
    while time.monotonic() < end:
        t = time.monotonic()
        c.request("POST", "/directory/lookup", body=body, headers={"content-type": "application/json"})
        r = c.getresponse(); r.read(); assert r.status == 200
        lat.append(time.monotonic() - t)
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3
    print(f"{len(lat)} lookups; p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, p99.9 {q(0.999):.2f} ms, max {lat[-1]*1e3:.1f} ms; over 100 ms: {sum(1 for x in lat if x > 0.1)}")
finally:
    p.kill(); p.wait()
