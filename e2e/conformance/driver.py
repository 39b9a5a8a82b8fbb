"""Runs one conformance case against the real packages and prints its result.

Usage: python driver.py < case.json   (in the conformance venv, see setup.sh)

A case is {"kind": ..., ...}; the result is one JSON object on the last line
of stdout: {"ok": true, ...facts} or {"ok": false, "error": "..."}. The Rust
tests in e2e/tests/conformance.rs build the cases from the adapters' golden
fixtures (ports and paths moved to this machine's loopback and temp dirs) and
assert on the facts. Each kind uses the packages' own entry points: argument
parsers, config loaders, registries and servers, never a re-implementation.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

VENV = sys.prefix


def wait_for_port(port, proc, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("process exited %s before listening on %d" % (proc.returncode, port))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("nothing listened on 127.0.0.1:%d within %.0fs" % (port, timeout))


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def log_tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def lmcache_env(case):
    """LMCacheEngineConfig.from_env() + validate() on the injected env, the
    connector registry on the remote URL, and the Mooncake loader on the
    extra config."""
    os.environ.update(case["env"])
    from lmcache.v1.config import LMCacheEngineConfig

    config = LMCacheEngineConfig.from_env()
    config.validate()
    out = {
        "chunk_size": config.chunk_size,
        "local_cpu": config.local_cpu,
        "max_local_cpu_size": config.max_local_cpu_size,
        "remote_url": config.remote_url,
        "remote_serde": config.remote_serde,
        "extra_config": config.extra_config,
    }
    if config.remote_url:
        from lmcache.v1.storage_backend.connector import ConnectorManager, parse_remote_url

        manager = ConnectorManager(config.remote_url, None, None, config)
        adapters = [type(a).__name__ for a in manager.adapters if a.can_parse(config.remote_url)]
        if not adapters:
            raise ValueError("no LMCache connector adapter parses %r" % config.remote_url)
        parsed = parse_remote_url(config.remote_url)
        out["connector_adapter"] = adapters[0]
        out["remote_host"] = parsed.host
        out["remote_port"] = parsed.port
        if config.remote_url.startswith("mooncakestore://"):
            from lmcache.v1.storage_backend.connector.mooncakestore_connector import (
                MooncakeStoreConfig,
            )

            out["mooncake_setup"] = MooncakeStoreConfig.load_from_lmcache_config(config).setup_config
    return out


def vllm_args(case):
    """vLLM's own CLI parser (EngineArgs) on each case's engine args, and,
    where the version has it, its environment validation in hard-fail mode
    with the case's env. All cases share one interpreter (importing vLLM
    takes seconds); each gets its own parser and a restored environment."""
    # Parsing needs a platform; this machine has no GPU. 0.33 takes the env
    # var, 0.11 only detects CPU builds, so its plugin table is pointed there.
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    import vllm.platforms as platforms

    platforms.builtin_platform_plugins["cpu"] = lambda: "vllm.platforms.cpu.CpuPlatform"
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    from vllm.platforms import current_platform

    results = []
    for one in case["cases"]:
        saved = dict(os.environ)
        os.environ.update(one.get("env", {}))
        try:
            args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(one["args"])
            out = {"ok": True}
            ktc = args.kv_transfer_config
            out["kv_transfer_config"] = None if ktc is None else {
                "kv_connector": ktc.kv_connector,
                "kv_role": ktc.kv_role,
                "is_kv_transfer_instance": ktc.is_kv_transfer_instance,
            }
            kec = args.kv_events_config
            out["kv_events_config"] = None if kec is None else {
                "enable_kv_cache_events": kec.enable_kv_cache_events,
                "publisher": kec.publisher,
                "endpoint": kec.endpoint,
            }
            validate = getattr(current_platform, "validate_environ", None)
            if validate is not None:
                validate(True)
                out["environ_validated"] = True
        except BaseException as e:
            out = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        finally:
            os.environ.clear()
            os.environ.update(saved)
        results.append(out)
    return {"version": vllm.__version__, "results": results}


def sglang_args(case):
    """SGLang's ServerArgs CLI on the engine's args."""
    import argparse

    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(case["args"]))
    keys = [
        "enable_lmcache",
        "lmcache_config_file",
        "enable_hierarchical_cache",
        "hicache_ratio",
        "hicache_size",
        "kv_events_config",
        "enable_metrics",
        "port",
    ]
    out = {k: getattr(server_args, k, None) for k in keys}
    out["version"] = sglang.__version__
    return out


def mp_worker(case):
    """Runs the MP worker's shell script (its launch line unchanged but for
    the port, config dir and remote address), waits for its own startup
    probe, then reads the config file it wrote with the loader SGLang's
    connector uses."""
    env = dict(os.environ)
    env["PATH"] = os.path.join(VENV, "bin") + os.pathsep + env.get("PATH", "")
    env["LMCACHE_TRACK_USAGE"] = "false"
    log = tempfile.NamedTemporaryFile(prefix="mp-worker-", suffix=".log", delete=False)
    worker = subprocess.Popen(["/bin/sh", "-c", case["script"]], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if worker.poll() is not None:
                raise RuntimeError("the MP worker exited %s:\n%s" % (worker.returncode, log_tail(log.name)))
            probe = subprocess.run(case["probe"], env=env, capture_output=True)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the startup probe never passed:\n%s" % log_tail(log.name))
            time.sleep(0.5)
        from lmcache.v1.config import load_engine_config_with_overrides

        config = load_engine_config_with_overrides(config_file_path=case["config_file"])
        out = {"mp_host": config.mp_host, "mp_port": int(config.mp_port), "chunk_size": config.chunk_size}
        if case.get("redis_port"):
            import redis

            clients = redis.Redis(port=case["redis_port"]).client_list()
            out["redis_clients"] = len(clients) - 1  # less our own
        return out
    finally:
        stop(worker)


def mp_args(case):
    """The MP server's own argument parser and config builders on the
    worker's launch line, exactly as rendered."""
    from lmcache.v1.multiprocess import server

    sys.argv = ["lmcache.v1.multiprocess.server"] + case["argv"]
    args = server.parse_args()
    server.parse_args_to_mp_server_config(args)
    storage = server.parse_args_to_config(args)
    server.parse_args_to_observability_config(args)
    server.parse_args_to_coordinator_config(args)
    return {
        "l1_size_gb": args.l1_size_gb,
        "eviction_policy": args.eviction_policy,
        "chunk_size": args.chunk_size,
        "l2_adapters": [json.loads(a)["type"] for a in (getattr(args, "l2_adapter", None) or [])],
        "storage_config": type(storage).__name__,
    }


def kernel_check(case):
    """Runs the kernel-check script as the init container would."""
    env = dict(os.environ)
    env.update(case.get("env", {}))
    if case.get("pythonpath"):
        env["PYTHONPATH"] = case["pythonpath"]
    run = subprocess.run([os.path.join(VENV, "bin", "python3"), "-c", case["script"]], env=env, capture_output=True, text=True, timeout=600)
    message = ""
    if os.path.exists(case["termination_log"]):
        with open(case["termination_log"]) as f:
            message = f.read()
    return {"exit_code": run.returncode, "stdout": run.stdout, "termination_message": message, "stderr_tail": run.stderr[-2000:]}


def redis_server(case):
    """Starts redis-server with the rendered arguments and reads back the
    settings they were meant to set."""
    import redis

    log = tempfile.NamedTemporaryFile(prefix="redis-", suffix=".log", delete=False)
    server = subprocess.Popen(case["args"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(case["port"], server)
        client = redis.Redis(port=case["port"])
        client.set("inferencecache-conformance", b"1")
        out = {"get": client.get("inferencecache-conformance").decode()}
        for key in ("maxmemory", "maxmemory-policy", "save", "appendonly", "protected-mode"):
            out[key] = client.config_get(key)[key]
        return out
    finally:
        stop(server)


def mooncake(case):
    """Starts mooncake_master with the rendered command, then sets up a real
    Mooncake client from the injected LMCACHE_EXTRA_CONFIG exactly as
    LMCache's mooncakestore connector does, and puts and gets a value."""
    log = tempfile.NamedTemporaryFile(prefix="mooncake-master-", suffix=".log", delete=False)
    command = list(case["command"])
    command[0] = os.path.join(VENV, "bin", command[0])
    master = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(case["rpc_port"], master)
        if case.get("http_metadata_port"):
            wait_for_port(case["http_metadata_port"], master)
        os.environ.update(case["env"])
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.storage_backend.connector.mooncakestore_connector import (
            MooncakeStoreConfig,
            setup_mooncake_store,
        )
        from mooncake.store import MooncakeDistributedStore

        config = MooncakeStoreConfig.load_from_lmcache_config(LMCacheEngineConfig.from_env())
        store = MooncakeDistributedStore()
        setup_mooncake_store(store, config)
        put = store.put("inferencecache-conformance", b"kv-bytes")
        got = store.get("inferencecache-conformance")
        store.close()
        return {"put": put, "get": got.decode(), "setup_config": config.setup_config}
    except BaseException as e:
        raise RuntimeError("%s\nmaster log:\n%s" % (e, log_tail(log.name))) from e
    finally:
        stop(master)


def lmcache_server(case):
    """Starts lmcache_server with the rendered command and speaks LMCache's
    own client protocol to it: a health check and an existence query."""
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.protocol import ClientCommand, ClientMetaMessage, ServerMetaMessage

    log = tempfile.NamedTemporaryFile(prefix="lmcache-server-", suffix=".log", delete=False)
    command = list(case["command"])
    command[0] = os.path.join(VENV, "bin", command[0])
    env = dict(os.environ, LMCACHE_TRACK_USAGE="false")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_port(case["port"], server)
        key = CacheEngineKey.from_string("conformance@1@0@abc123@half")
        replies = {}
        with socket.create_connection(("127.0.0.1", case["port"]), timeout=10) as s:
            for command_name in ("HEALTH", "EXIST"):
                meta = ClientMetaMessage(ClientCommand[command_name], key, 0, MemoryFormat(1), torch.float16, torch.Size((0, 0, 0, 0)))
                s.sendall(meta.serialize())
                need = ServerMetaMessage.packlength()
                data = b""
                while len(data) < need:
                    chunk = s.recv(need - len(data))
                    if not chunk:
                        raise RuntimeError("lmcache_server closed the connection")
                    data += chunk
                replies[command_name] = int(ServerMetaMessage.deserialize(data).code)
        return replies
    except BaseException as e:
        raise RuntimeError("%s\nserver log:\n%s" % (e, log_tail(log.name))) from e
    finally:
        stop(server)


KINDS = {
    "lmcache_env": lmcache_env,
    "vllm_args": vllm_args,
    "sglang_args": sglang_args,
    "mp_args": mp_args,
    "mp_worker": mp_worker,
    "kernel_check": kernel_check,
    "redis_server": redis_server,
    "mooncake": mooncake,
    "lmcache_server": lmcache_server,
}


def main():
    case = json.load(sys.stdin)
    try:
        result = {"ok": True, **KINDS[case["kind"]](case)}
    except BaseException as e:  # the test prints it; nothing here may hide a failure
        result = {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()}
    sys.stdout.flush()
    print("\n" + json.dumps(result, default=str))


if __name__ == "__main__":
    main()
