"""tandem's services: gateway, router, planner, prefill and decode workers, speaking gRPC."""
