# Self cost of a callgrind dump (--compress-strings=no) per request, grouped by function name.
# usage: group.py FILE REQUESTS
import sys, collections
self_cost = collections.Counter(); fn=None; after=False
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("fn="): fn=line[3:].strip(); continue
    if line.startswith("cfn="): continue
    if line.startswith("calls="): after=True; continue
    if line and (line[0].isdigit() or line[0] in "+-*"):
        p=line.split()
        if len(p)>=2:
            if after: after=False
            else: self_cost[fn]+=int(p[1])
n=int(sys.argv[2]); tot=sum(self_cost.values())
groups=[("allocator",["malloc","free","realloc","_int_","unlink_chunk","alloc_perturb","consolidate","tcache"]),
 ("hyper/http/axum/tower",["hyper","http::","axum","tower","matchit","httparse","h1::","bytes::"]),
 ("tokio/threads/locks",["tokio","parking_lot","futex","mio","pthread","epoll","__lll","syscall","sched","clone"]),
 ("metrics",["prometheus","metrics"]),
 ("json decode",["serde_json::de","serde_json::read","from_utf8","Deserialize","deserialize","Visitor","SeqAccess","MapAccess","PhantomData"]),
 ("json encode",["serde_json::ser","format_escaped","Serialize","serialize","Answer","fmt::"]),
 ("lax/validate/keys",["lax","validate","from_parts","from_wire","decode_hex","events::"]),
 ("views apply (directory, usage, LRU, gate)",["directory","usage","eviction","Lru","gate","capacity","ObjectKey","ByHash","btree","hashbrown","foldhash","Hash"]),
]
acc=collections.Counter()
for f,c in self_cost.items():
    for g,keys in groups:
        if any(k in f for k in keys): acc[g]+=c; break
    else: acc["other"]+=c
print(f"total per request {tot//n:,}")
for g,c in acc.most_common(): print(f"  {g:45s} {c//n:>10,} {c/tot*100:5.1f}%")
