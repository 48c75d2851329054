"""The planner's service shell: every tick it reads replicas from the connector and load from the source, hands
both to the core, applies the core's decisions (retrying a failing connector), and reports: the Planner gRPC
service (GetPlan), Prometheus metrics and log lines. No decision logic here."""

import argparse
import asyncio
import logging
import sys
import time

from engines.timing.profile import ProfileError, load_profile
from services.common.grpc_server import GrpcServer, run_until_signal
from services.common.metrics import MetricsEndpoint
from services.common.protos import planner_pb2, planner_pb2_grpc
from services.common.settings import SettingsError
from services.common.tls import process_tls
from services.planner.factory import make_connector, make_source
from services.planner.metrics import PlannerMetrics
from services.planner.perf_model import PerfModel
from services.planner.plan import plan_to_pb
from services.planner.settings import PlannerSettings, add_arguments, settings_from
from services.planner.state_machine import PlannerCore
from services.planner.types import ConnectorError, Decision, TickResult

log = logging.getLogger(__name__)
SERVICE_NAME = planner_pb2.DESCRIPTOR.services_by_name["Planner"].full_name


class PlannerServicer(planner_pb2_grpc.PlannerServicer):
    def __init__(self, service: "PlannerService"):
        self.service = service

    async def GetPlan(self, request, context):
        return self.service.plan


class PlannerService:
    def __init__(self, settings: PlannerSettings, connector=None, source=None, clock=time.monotonic):
        self.settings, self.clock = settings, clock
        model = PerfModel(load_profile(settings.profile), settings.slo, settings.sizing)
        self.core = PlannerCore(settings.planner_config, model)
        self.connector = connector or make_connector(settings)
        self.source = source or make_source(settings)
        self.metrics = PlannerMetrics(self.connector.name, {"ttft": settings.slo_ttft_s, "itl": settings.slo_itl_s})
        self.plan = planner_pb2.Plan(connector=self.connector.name)
        self.server = GrpcServer(settings.address, [SERVICE_NAME], self.metrics.registry, limits="planner")
        planner_pb2_grpc.add_PlannerServicer_to_server(PlannerServicer(self), self.server.server)
        self._warnings: tuple[str, ...] = ()
        self._task: asyncio.Task | None = None
        self._endpoint: MetricsEndpoint | None = None

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self) -> None:
        self._endpoint = MetricsEndpoint(self.metrics.registry, self.settings.host, self.settings.metrics_port)
        await self.server.start()
        self._task = asyncio.create_task(self._run(), name="planner-ticks")
        log.info(
            "planner serving on %s:%d (connector %s, source %s, tick %.0f s, adjustment %.0f s)",
            self.settings.host,
            self.port,
            self.connector.name,
            self.settings.source,
            self.settings.tick_s,
            self.settings.adjustment_interval_s,
        )

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.server.stop(grace_s)
        close = getattr(self.source, "close", None)
        if close is not None:
            await close()
        if self._endpoint is not None:
            self._endpoint.close()

    async def tick(self) -> TickResult:
        replicas = await self._replicas()
        obs = await self.source.observe(replicas)
        result = self.core.on_tick(obs, self.clock())
        self._log_warnings(result.warnings)
        for decision in result.decisions:
            await self._apply(decision)
        self.metrics.ticked(obs, result)
        self.plan = plan_to_pb(self.connector.name, obs, result, self.core, self.plan)
        return result

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # NOTE: one bad tick must not end the planner; the next one starts afresh
                log.exception("planner tick failed")
            await asyncio.sleep(self.settings.tick_s)

    async def _replicas(self):
        try:
            return await asyncio.to_thread(self.connector.replicas)
        except ConnectorError as exc:
            self.metrics.failed("replicas")
            log.warning("connector %s cannot read replicas: %s", self.connector.name, exc)
            return {}

    async def _apply(self, d: Decision) -> None:
        """Ask the connector for `d.target`, retrying with backoff; a tick that gives up leaves it to the next."""
        s = self.settings
        for attempt in range(1, s.connector_retries + 1):
            try:
                await asyncio.to_thread(self.connector.scale, d.role, d.target)
            except ConnectorError as exc:
                self.metrics.failed("scale")
                log.warning(
                    "scaling %s to %d failed (attempt %d of %d): %s",
                    d.role.value,
                    d.target,
                    attempt,
                    s.connector_retries,
                    exc,
                )
                if attempt < s.connector_retries:
                    await asyncio.sleep(s.connector_backoff_s * 2 ** (attempt - 1))
                continue
            self.metrics.scaled(d.role, d.current, d.target)
            log.info(
                "scaling %s from %d to %d: %s",
                d.role.value,
                d.current,
                d.target,
                d.reason,
                extra={"role": d.role.value, "current": d.current, "target": d.target, "reason": d.reason},
            )
            return
        log.error(
            "scaling %s to %d failed %d times; the next tick tries again", d.role.value, d.target, s.connector_retries
        )

    def _log_warnings(self, warnings: tuple[str, ...]) -> None:
        for line in warnings:
            if line not in self._warnings:  # NOTE: once per spell, not once per tick
                log.warning("%s", line)
        self._warnings = warnings


async def serve(settings: PlannerSettings) -> None:
    service = PlannerService(settings)
    await run_until_signal(service.start, service.stop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem serve planner", description="the tandem planner")
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
        load_profile(settings.profile)  # NOTE: a bad profile is a bad setting: fail now, in one line
        process_tls().check_bind(settings.address)
    except (SettingsError, ProfileError) as exc:
        print(f"tandem serve planner: error: {exc}", file=sys.stderr)
        sys.exit(2)
    from services.common.logs import setup_logging

    setup_logging("planner")
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
