#!/bin/bash
# Instructions per request of a coordinator under callgrind (docs/benchmarks.md,
# "Coordinator over HTTP"): registration and 32 warm-up batches, counters
# zeroed, NBATCH store batches of 256 entries (dump 1), NLOOKUP lookups of 16
# stored keys (dump 2), one keep-alive connection. Then:
#   python3 group.py OUTPREFIX.PID.out.1 NBATCH ; python3 group.py OUTPREFIX.PID.out.2 NLOOKUP
# usage: run.sh BIN OUTPREFIX PORT [NBATCH=200] [NLOOKUP=1000]
BIN=$1; OUT=$2; PORT=$3; NB=${4:-200}; NL=${5:-1000}
D=$(mktemp -d)
valgrind --tool=callgrind --compress-strings=no --compress-pos=no --callgrind-out-file=$OUT.%p.out $BIN coordinator --host 127.0.0.1 --port $PORT \
  --checkpoint-path $D/ckpt --metadata-path $D/meta.json > $D/server.log 2>&1 &
VP=$!
for i in $(seq 1 600); do curl -sf http://127.0.0.1:$PORT/healthz >/dev/null && break; sleep 0.2; done
python3 "$(dirname "$0")/drive.py" $PORT $NB $NL "callgrind_control -z $VP >/dev/null" "callgrind_control -d ingest $VP >/dev/null"
callgrind_control -d lookup $VP >/dev/null
kill $VP; wait $VP 2>/dev/null
rm -rf $D
for f in $OUT.$VP.out.*; do echo "$f $(callgrind_annotate $f 2>/dev/null | grep 'PROGRAM TOTALS')"; done
