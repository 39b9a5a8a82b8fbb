# Drives a coordinator for callgrind: N store batches (256 entries) then M lookups (16 keys),
# one keep-alive connection; runs a hook command between phases.
import http.client, json, random, subprocess, sys
port, n_batches, n_lookups, hook1, hook2 = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
c = http.client.HTTPConnection("127.0.0.1", port)
def post(path, body):
    c.request("POST", path, body=body, headers={"content-type": "application/json"})
    r = c.getresponse(); data = r.read()
    assert r.status == 200, (r.status, data[:300])
    return data
for i in range(16):
    post("/instances", json.dumps({"instance_id": f"mp-{i}", "ip": "127.0.0.1", "http_port": 1}))
M = "loadgen-model"
def batch(inst, seq, first):
    ents = ",".join('{"key":{"chunk_hash_hex":"%016x%016x","model_name":"%s","kv_rank":0},"size_bytes":65536}' % (inst, first + k, M) for k in range(256))
    return '{"batches":[{"instance_id":"mp-%d","incarnation":1,"seq":%d,"event_type":"store","tier":"l2","backend":"fs","entries":[%s]}]}' % (inst, seq, ents)
# warm-up: 32 batches (not counted)
produced = [0] * 16
def one(i):
    inst = i % 16
    seq = produced[inst] // 256 + 1
    post("/events", batch(inst, seq, produced[inst])); produced[inst] += 256
for i in range(32): one(i)
subprocess.run(hook1, shell=True, check=True)  # zero counters
for i in range(n_batches): one(32 + i)
subprocess.run(hook2, shell=True, check=True)  # dump ingest
rnd = random.Random(7)
bodies = []
for j in range(n_lookups):
    keys = []
    for _ in range(16):
        inst = rnd.randrange(16); n = rnd.randrange(produced[inst])
        keys.append('{"chunk_hash_hex":"%016x%016x","model_name":"%s","kv_rank":0}' % (inst, n, M))
    bodies.append('{"keys":[%s]}' % ",".join(keys))
for b in bodies:
    d = json.loads(post("/directory/lookup", b))
    assert all(r["placements"] for r in d["results"])
print("ok", n_batches, n_lookups)
