"""`tandem up`'s top: picks the stack (a plain Stack, or with --planner the ScalableStack of stack_control.py), starts
it, prints how to use it, keeps its children up through the supervisor until Ctrl-C/SIGTERM, then stops it all.
It knows no child's command line (launcher.py does)."""

import signal
import sys
import time

from tandem.launcher import Stack, StackConfig, served_name
from tandem.stack_control import ScalableStack
from tandem.supervisor import CrashLoopError


def make_stack(cfg: StackConfig) -> Stack:
    """A Stack, or with cfg.planner one whose workers the planner scales (tandem/stack_control.py)."""
    return ScalableStack(cfg) if cfg.planner else Stack(cfg)


def run_stack(cfg: StackConfig) -> int:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per readiness probe
    stack = make_stack(cfg)

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        stack.wait_ready()
        prometheus = stack.start_prometheus() if cfg.prometheus_port > 0 else None
        print_banner(stack, prometheus)
        supervisor = stack.supervisor()
        while True:
            supervisor.poll()
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nstopping tandem ...", flush=True)
        return 0
    except (CrashLoopError, TimeoutError) as exc:
        print(f"tandem up failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        stack.stop()


def print_banner(stack: Stack, prometheus: str | None = None) -> None:
    cfg = stack.cfg
    model = served_name(cfg.model)
    metrics = "\n".join(f"metrics: {name} {url}" for name, url in stack.metrics_urls.items())
    prometheus_line = f"\n  prometheus: {prometheus}" if prometheus else ""
    print(
        f"""tandem is up: {stack.url}
  router {", ".join(f"127.0.0.1:{p}" for p in stack.router_ports.values())} · {cfg.num_prefill} prefill · {cfg.num_decode} decode · engine {cfg.engine}
  logs: {cfg.log_dir}/
{metrics}
  Prometheus targets (file_sd): {stack.targets_path}{prometheus_line}
  {_security_line(stack)}

try it:
  curl {stack.url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "temperature": 0, "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

Ctrl-C stops everything.""",
        flush=True,
    )


def _security_line(stack: Stack) -> str:
    if not stack.is_mutual_tls:
        return "gRPC: PLAINTEXT (TANDEM_GRPC_INSECURE=1): any local process may call any service"
    return (
        f"gRPC: mutual TLS, per-role authorization; certificates in {stack.pki.directory}/ "
        f"(dial as the operator with {stack.pki.directory}/operator/)"
    )
