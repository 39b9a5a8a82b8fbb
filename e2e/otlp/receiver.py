"""An OTLP/gRPC receiver for the e2e tests.

Serves the OpenTelemetry collector's TraceService and MetricsService on
127.0.0.1 with gRPC's server and the OpenTelemetry project's generated
protobuf classes (opentelemetry-proto), writes the bound port to
--port-file, and appends one JSON line per exported span and per metric
data point to --out, flattened for the tests:

  {"signal": "span", "service": ..., "name": ..., "trace_id": hex,
   "span_id": hex, "parent_span_id": hex, "kind": int, "attributes": {...}}
  {"signal": "metric", "service": ..., "name": ..., "type": "sum"|"gauge"|
   "histogram", "attributes": {...}, "value": float, "count": int}

Every request's gRPC metadata "user-agent" is kept as "client".
"""

import argparse
import json
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

LOCK = threading.Lock()


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def service_of(resource):
    return attrs(resource.attributes).get("service.name", "")


def client_of(context):
    return dict(context.invocation_metadata()).get("user-agent", "")


class Out:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, record):
        with LOCK:
            self.file.write(json.dumps(record, sort_keys=True) + "\n")


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):
        client = client_of(context)
        for rs in request.resource_spans:
            service = service_of(rs.resource)
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self.out.write({
                        "signal": "span",
                        "client": client,
                        "service": service,
                        "resource": resource,
                        "name": span.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "kind": span.kind,
                        "attributes": attrs(span.attributes),
                        "duration_ns": span.end_time_unix_nano - span.start_time_unix_nano,
                    })
        return trace_service_pb2.ExportTraceServiceResponse()


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):
        client = client_of(context)
        for rm in request.resource_metrics:
            service = service_of(rm.resource)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    data = getattr(metric, kind)
                    for point in data.data_points:
                        record = {
                            "signal": "metric",
                            "client": client,
                            "service": service,
                            "name": metric.name,
                            "type": kind,
                            "attributes": attrs(point.attributes),
                        }
                        if kind == "histogram":
                            record["count"] = point.count
                            record["value"] = point.sum
                            record["buckets"] = list(point.bucket_counts)
                            record["bounds"] = list(point.explicit_bounds)
                        else:
                            value = point.WhichOneof("value")
                            record["value"] = float(getattr(point, value)) if value else None
                        if kind == "sum":
                            record["monotonic"] = data.is_monotonic
                            record["temporality"] = data.aggregation_temporality
                        self.out.write(record)
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Out(args.out)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(out), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(out), server)
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        print("cannot bind 127.0.0.1", file=sys.stderr)
        sys.exit(1)
    server.start()
    with open(args.port_file + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(port))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
