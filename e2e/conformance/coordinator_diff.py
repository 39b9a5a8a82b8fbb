"""Sends the same 1,874 edge-case requests to two coordinators and prints
every answer that differs (status, Allow/Location/Content-Type, JSON body).

Usage: python3 coordinator_diff.py REF_PORT OURS_PORT [SHOW_CHARS] [FULL.json]

Start both on 127.0.0.1 with the sweeps off, e.g.
  lmcache coordinator --host 127.0.0.1 --port 19301 --health-check-interval 0 --eviction-check-interval 0
  ic-coordinator coordinator --host 127.0.0.1 --port 19302 --health-check-interval 0 --eviction-check-interval 0
(`lmcache` from the conformance venv, setup.sh). The cases cover every
field of every request model with lax-coercion edge values, content types,
bodies, every method on every route, trailing slashes, percent-encoded and
empty-segment paths and query parameters. Differences the project keeps
are listed, with reasons, in docs/coordinator.md ("Not built yet, and known
differences"); the ones a test pins are in
services/coordinator/tests/reference_diff.rs. Registration answers carry
random ids, and big-integer cases leave the two directories in different
states, so later listings differ too: read the first difference of a kind.
"""

import http.client, json, sys, copy, itertools, re
REF, OURS = int(sys.argv[1]), int(sys.argv[2])
SHOW = int(sys.argv[3]) if len(sys.argv) > 3 else 400
FULL = sys.argv[4] if len(sys.argv) > 4 else None

def send(port, method, path, headers, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers:
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders()
        if body:
            c.send(body)
        r = c.getresponse()
        data = r.read()
        hdr = {k.lower(): v.replace(str(port), "PORT") for k, v in r.getheaders() if k.lower() in ("allow", "location", "content-type")}
        # Starlette lists a page's methods from a Python set: their order
        # changes from one reference process to the next.
        if "allow" in hdr:
            hdr["allow"] = ", ".join(sorted(hdr["allow"].split(", ")))
        try:
            b = json.loads(data)
        except Exception:
            b = data.decode("utf-8", "replace")[:300]
        if isinstance(b, dict) and isinstance(b.get("instances"), list):
            for i in b["instances"]:
                if isinstance(i, dict): i["registration_time"] = None
        # A registration without an id gets a random one (mp-<32 hex>).
        b = json.loads(re.sub(r'"mp-[0-9a-f]{32}"', '"mp-RANDOM"', json.dumps(b)))
        if method == "HEAD": b = None
        return (r.status, hdr, b)
    except Exception as e:
        return ("EXC", type(e).__name__, str(e)[:100])
    finally:
        c.close()

cases = []
def J(method, path, body, ct="application/json", extra=()):
    data = body if isinstance(body, (bytes, type(None))) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    h = [("Host", "h")] + ([("Content-Type", ct)] if ct is not None else []) + list(extra)
    cases.append((method, path, h, data))

INTS = ["3", 4.0, True, False, "3.5", 1e3, " 3", "3 ", None, [], {}, 10**20, 2**63, 2**63-1, -2**63, -2**63-1, 2**64, "1e3", "0x10",
        "", "  ", "٣", 3.0000001, -0.0, 1.5e300, "inf", "nan", "-0", "+0", "00", "0_1", "1_", "_1", "3.0", "3.", ".0", "-3", "1" * 25, 255, 256, 0, -1, 7]
FLOATS = ["1.5", 2, True, "x", None, [], "inf", "-inf", "nan", " 1.5 ", "1_0", 1e308, "1e400", 10**400 if False else 10**30, "", -0.0, "1e-3", "0x1p3", ".5", "5."]
BOOLS = ["yes", "no", "on", "off", "t", "f", "y", "n", 1, 0, 2, 1.0, 0.5, "1", "0", "true", "TRUE", "True", " true", None, [], "", "2"]
STRS = [5, 5.5, True, None, [], {}, "", " ", " x ", "é", "a\u0000b", "a" * 300]
TIERS = ["l1", "l2", "all", "L2", " l2", "l3", 1, None, "", []]
EVTYPES = ["store", "remove", "config", "clear", "STORE", "Store", 1, None, "", "stor"]

def setp(d, path, v):
    d = copy.deepcopy(d)
    cur = d
    for p in path[:-1]:
        cur = cur[p]
    if v is DEL:
        del cur[path[-1]]
    else:
        cur[path[-1]] = v
    return d
DEL = object()

def key(h="ab", **kw):
    k = {"chunk_hash_hex": h, "model_name": "m", "kv_rank": 0}
    k.update(kw); return k

seq = itertools.count(1)
def batch(**kw):
    n = next(seq)
    b = {"instance_id": "mp-%d" % n, "incarnation": 1, "seq": n, "event_type": "store", "tier": "l2", "backend": "fs",
         "entries": [{"key": key(), "size_bytes": 10, "token_ids": [1, 2], "token_offset": 0}], "shared": False, "ts": 1.0,
         "capacity_bytes": 100, "capacity_revision": 1}
    b.update(kw); return b

bases = {
    ("POST", "/instances"): ({"instance_id": "i1", "ip": "h", "http_port": 1, "metadata": {"a": "b"}, "p2p_advertised_url": "u", "mq_port": 2},
        {"http_port": INTS, "mq_port": INTS, "ip": STRS, "instance_id": STRS, "p2p_advertised_url": STRS, "metadata": [{"a": 1}, {"a": None}, {"a": True}, {1: "x"}, [], None, "x", {"a": ["x"]}]}),
    ("POST", "/directory/lookup"): ({"keys": [key(object_group_id=0, cache_salt="")]},
        {}),
    ("POST", "/directory/blend-lookup"): ({"tokens_b64": "AAAAAA==", "model_name": "m", "world_size": 1, "cache_salt": ""},
        {"world_size": INTS, "model_name": STRS, "cache_salt": STRS, "tokens_b64": STRS + ["AAAA", "AAAAAAA=", "AA==AA==", " AAAAAA== ", "AAAA\nAAAA"]}),
    ("POST", "/cache/delete"): ({"instance_id": "x", "model_name": "m", "world_size": 1, "token_ids": [1], "cache_salt": "", "tier": "l2", "force": False},
        {"world_size": INTS, "force": BOOLS, "tier": TIERS, "instance_id": STRS, "model_name": STRS, "cache_salt": STRS, "token_ids": [[], None, "1", [None], [[1]], ["1", 2.0, True], [-1], [2**32], {}]}),
    ("POST", "/cache/pins"): ({"model_name": "m", "world_size": 1, "token_ids": [1], "cache_salt": ""},
        {"world_size": INTS, "model_name": STRS, "cache_salt": STRS, "token_ids": [[], None, "1", [None], ["1", 2.0, True], [-1], [2**32], [1.5]]}),
    ("DELETE", "/cache/pins"): ({"model_name": "m", "world_size": 1, "token_ids": [1], "cache_salt": ""},
        {"world_size": INTS[:12]}),
    ("POST", "/cache/prefetches"): ({"instance_id": "x", "model_name": "m", "world_size": 1, "token_ids": [1], "cache_salt": ""},
        {"world_size": INTS, "instance_id": STRS}),
    ("PUT", "/quota/t1"): ({"limit_gb": 1.0, "tier": "l2"}, {"limit_gb": FLOATS + [-1, 0], "tier": TIERS}),
    ("PUT", "/quota/config"): ({"default_limit_gb": 1.0, "tier": "l2"}, {"default_limit_gb": FLOATS + [-1, 0], "tier": TIERS}),
}
for (m, p), (base, fields) in bases.items():
    J(m, p, base)
    for f, vals in fields.items():
        J(m, p, setp(base, [f], DEL))
        for v in vals:
            J(m, p, setp(base, [f], v))
    J(m, p, dict(base, extra_field=1))

# lookup: key fields, token form fields
lk = {"keys": [key(object_group_id=0, cache_salt="")]}
for f, vals in {"kv_rank": INTS, "object_group_id": INTS, "chunk_hash_hex": STRS + ["AB", "0xab", "a", "ab ", " ab", "gg", "abab" * 40], "model_name": STRS, "cache_salt": STRS}.items():
    J("POST", "/directory/lookup", setp(lk, ["keys", 0, f], DEL))
    for v in vals:
        J("POST", "/directory/lookup", setp(lk, ["keys", 0, f], v))
tk = {"token_ids": [1, 2, 3], "model_name": "m", "world_size": 1, "cache_salt": ""}
for f, vals in {"world_size": INTS, "model_name": STRS, "cache_salt": STRS, "token_ids": [[], None, "1", [None], ["1", 2.0, True], [-1], [2**32], [1.5], ["x"], [[1]], {}]}.items():
    J("POST", "/directory/lookup", setp(tk, [f], DEL))
    for v in vals:
        J("POST", "/directory/lookup", setp(tk, [f], v))
for body in [{"keys": [], "token_ids": [1]}, {"keys": []}, {"keys": None}, {"keys": None, "token_ids": None}, {"keys": [key()], "model_name": "m"},
             {"token_ids": []}, {"token_ids": [], "model_name": "m"}, {"keys": {}}, {"keys": [None]}, {"keys": "ab"}]:
    J("POST", "/directory/lookup", body)

# events: every batch field and entry field
for f, vals in {"instance_id": STRS, "incarnation": INTS, "seq": INTS, "event_type": EVTYPES, "tier": TIERS, "backend": STRS,
                "shared": BOOLS, "ts": FLOATS, "capacity_bytes": INTS, "capacity_revision": INTS,
                "entries": [None, {}, [], "x", [None]]}.items():
    J("POST", "/events", {"batches": [setp(batch(), [f], DEL)]})
    for v in vals:
        J("POST", "/events", {"batches": [setp(batch(), [f], v)]})
for f, vals in {"size_bytes": INTS, "token_offset": INTS, "token_ids": [[], None, "1", [None], ["1", 2.0, True], [-1], [2**32], [1.5]], "key": [None, "ab", [], {}]}.items():
    J("POST", "/events", {"batches": [setp(batch(), ["entries", 0, f], DEL)]})
    for v in vals:
        J("POST", "/events", {"batches": [setp(batch(), ["entries", 0, f], v)]})
for f, vals in {"kv_rank": INTS[:14], "object_group_id": INTS[:14], "chunk_hash_hex": STRS}.items():
    for v in vals:
        J("POST", "/events", {"batches": [setp(batch(), ["entries", 0, "key", f], v)]})
for et in ["remove", "config", "clear"]:
    J("POST", "/events", {"batches": [batch(event_type=et)]})
J("POST", "/events", {"batches": []})
J("POST", "/events", {"batches": None})
J("POST", "/events", {"batches": [batch()], "extra": 1})
J("POST", "/events", {"batches": [dict(batch(), extra=1)]})

# content types and bodies
good = json.dumps({"instance_id": "ct", "ip": "h", "http_port": 1})
for ct in ["application/json; charset=utf-8", "application/json;charset=latin-1", "APPLICATION/JSON", "Application/Json; charset=UTF-8",
           "application/json-patch+json", "application/jsonx", "text/json", "application/ld+json", "application/json ; charset=utf-8",
           "application/", "", "*/*", "application/json; foo", "application/json, text/plain", " application/json", "multipart/form-data", "application/x-json", "application/+json", "application/problem+json; charset=utf-8", "text/plain; charset=utf-8", None]:
    J("POST", "/instances", good, ct=ct)
    J("POST", "/directory/lookup", '{"keys":[]}', ct=ct)
    J("PUT", "/quota/t1", '{"limit_gb":1}', ct=ct)
for body in [b"", b"null", b"{}", b"[]", b"1", b'"x"', b"true", b"\xef\xbb\xbf{}", b"\xff", b'{"ip":"\xff"}', b"{\"ip\":\"h\",\"http_port\":NaN}",
             b"{\"ip\":\"h\",\"http_port\":Infinity}", b'{"ip":"h","http_port":1e400}', b'{"ip":"h","http_port":-0}', b'{"ip":"h", "http_port":1} ', b'\n{"ip":"h","http_port":1}\n',
             b'{"ip":"\\ud800","http_port":1}', b'{"ip":"h","http_port":01}', b'{"ip":"h","http_port":1.0e0}', b"{'ip':'h'}", b'{"ip":"h","http_port":1,}', b"\t", None]:
    J("POST", "/instances", body)
    J("PUT", "/quota/t1", body)
# UTF-16 and UTF-32 bodies (json.loads(bytes) detects them), and what is none
for enc in ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"]:
    cases.append(("POST", "/instances", [("Host", "h"), ("Content-Type", "application/json")],
                  ('{"instance_id": "enc-%s", "ip": "h\u00e9\U0001f600", "http_port": "1"}' % enc).encode(enc)))
    cases.append(("PUT", "/quota/t1", [("Host", "h"), ("Content-Type", "application/json")], '{"limit_gb": }'.encode(enc)))
    cases.append(("POST", "/directory/lookup", [("Host", "h"), ("Content-Type", "application/json")],
                  json.dumps({"keys": [key(object_group_id=0, cache_salt="")]}).encode(enc)))
for body in [b"\xff\xfe{", b"\x00{", b"{\x00", b"\xfe\xff\xd8\x00\x00{"]:
    J("PUT", "/quota/t1", body)
# GET with a body, PUT heartbeat with a body
J("GET", "/instances", b'{"x":1}')
J("PUT", "/instances/i1/heartbeat", b'{"x":1}')
J("PUT", "/instances/nope/heartbeat", None)
J("DELETE", "/instances/nope", None)
J("GET", "/instances/nope/usage", None)
J("GET", "/instances/i1/usage", None)
J("GET", "/cache/prefetches/x/y", None)

# routing: every route with HEAD, OPTIONS, trailing slash, PATCH
routes = ["/openapi.json", "/docs", "/cache/prefetches", "/cache/prefetches/a/b", "/cache/delete", "/directory/lookup", "/directory/blend-lookup",
          "/directory/keys", "/directory/stats", "/events", "/healthz", "/instances", "/instances/i1/heartbeat", "/instances/zz", "/instances/usage",
          "/instances/i1/usage", "/metrics", "/quota/config", "/quota/t9", "/quota", "/cache/pins", "/redoc", "/docs/oauth2-redirect", "/", "/status", "/live", "/ready"]
for r in routes:
    for m in ["HEAD", "OPTIONS", "PATCH", "GET", "POST", "PUT", "DELETE", "TRACE", "FOO", "PROPFIND"]:
        if r in ("/metrics", "/docs") and m == "GET":
            continue
        J(m, r, None, ct=None)
    J("GET", r + "/", None, ct=None)
    J("POST", r + "/", None, ct=None)
    J("HEAD", r + "/", None, ct=None)
# percent-encoding, odd paths
for p in ["/%69nstances", "/instances%2F", "/instances/a%2Fb/heartbeat", "/instances/a%20b/usage", "/instances/%2e%2e/usage", "//instances", "/instances//heartbeat",
          "/instances/%/usage", "/instances/a/b/usage", "/quota/a%2Fb", "/quota/%20", "/quota/_default", "/quota/config/", "/quota//", "/directory//keys",
          "/instances?x", "/instances?", "/instances#frag", "/cache/prefetches/a/", "/cache/prefetches//b", "/instances/é/usage", "/instances/%C3%A9/usage",
          "/instances/%FF/usage", "/./instances", "/instances/.", "/INSTANCES", "/healthz?x=1&x=2"]:
    J("GET", p, None, ct=None)
    J("PUT", p, None, ct=None)
# query parameters
for q in ["limit=", "limit=&limit=3", "limit=3&limit=", "offset=", "tier=", "tier=L2", "tier=%20l2", "tier=l1&tier=l2", "tier=all", "limit=%203", "limit=3%20",
          "limit=1e3", "limit=0x10", "limit=true", "limit=٣", "limit=1_0", "limit=10000", "limit=10001", "offset=99999999999999999999", "limit=-0",
          "instance_id=&backend=", "instance_id=a&instance_id=b", "unknown=1", "limit", "=3", "limit=3&&offset=1", "limit=3;offset=1", "Limit=0", "limit=%FF", "limit=+3", "limit=3.0", "limit=3.5"]:
    J("GET", "/directory/keys?" + q, None, ct=None)
    J("GET", "/cache/pins?" + q, None, ct=None)
for q in ["tier=", "tier=l1", "tier=all", "tier=x", "tier=l1&tier=x", "tier=x&tier=l1"]:
    J("GET", "/quota?" + q, None, ct=None)
    J("GET", "/quota/config?" + q, None, ct=None)
    J("GET", "/quota/t1?" + q, None, ct=None)
    J("DELETE", "/quota/zz?" + q, None, ct=None)
# big body
J("POST", "/directory/lookup", {"token_ids": list(range(300000)), "model_name": "m", "world_size": 1})
J("POST", "/instances", {"instance_id": "big", "ip": "h", "http_port": 1, "metadata": {str(i): "v" * 100 for i in range(1000)}})
J("GET", "/instances", None, ct=None)
J("GET", "/directory/stats", None, ct=None)
J("GET", "/directory/keys", None, ct=None)
J("GET", "/instances/usage", None, ct=None)
J("GET", "/quota", None, ct=None)
J("GET", "/cache/pins", None, ct=None)

diffs = 0
out = []
full = []
for m, p, h, b in cases:
    a = send(REF, m, p, h, b)
    o = send(OURS, m, p, h, b)
    if a != o:
        full.append([m, p, h, (b or b"").decode("utf-8", "replace"), a, o])
        diffs += 1
        out.append("%s %s %s %r\n  ref:  %s\n  ours: %s" % (m, p, [x for x in h if x[0] != "Host"], (b or b"")[:200], json.dumps(a, default=str)[:SHOW], json.dumps(o, default=str)[:SHOW]))
print("\n".join(out))
if FULL:
    json.dump(full, open(FULL, "w"))
print("cases", len(cases), "diffs", diffs)
