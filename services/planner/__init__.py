"""The planner: sizes the prefill and decode pools against latency SLOs and scales them through a connector."""
