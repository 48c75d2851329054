"""The names of the ways KV moves between engines, written once: settings validate against them, engines declare
one in their capabilities, workers pick their connector and label their metrics by them. Names only, no logic."""

BYTES = "bytes"  # PullKv streams a KvExport the decode engine writes into fresh blocks
STAGING = "grpc"  # PullKv through shared-memory staging regions the engines copy from and into
NIXL = "nixl"  # the decode engine READs the prefill engine's blocks itself (PullKv stays the fallback)
TRTLLM = "trtllm"  # TensorRT-LLM's own cache transceiver, named by its disaggregated params
AUTO = "auto"  # a setting, not a transport: NIXL when it imports, else STAGING

LOADING = (STAGING, NIXL)  # what a runner with a KvMover loads through
SETTINGS = (AUTO, NIXL, STAGING, BYTES)  # TANDEM_KV_TRANSPORT
ENGINE = (BYTES, *LOADING)  # what a native or sim engine is built with
