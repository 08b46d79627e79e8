"""Which targets a viewer may pick, from ``.streamlit/secrets.toml`` and the environment (pure).

Secrets::

    allow_custom_targets = false      # viewers may only pick from the list below
    api_key_env = "VLLM_API_KEY"      # default variable for the API key
    [targets]
    prod-a = "http://10.0.0.5:8000"
    prod-b = { url = "http://10.0.0.6:8000", api_key_env = "PROD_B_KEY" }
    prod-c = { url = "http://10.0.0.7:8000", gpu_metrics_url = "http://10.0.0.7:9400/metrics" }

    prometheus_url = "http://prometheus:9090"   # the Fleet page reads this Prometheus
    prometheus_selector = '{job="vllm"}'         # which of its series are vLLM servers

``VLLM_URL`` in the environment adds a target (``VLLM_GPU_METRICS_URL`` its dcgm-exporter, read for
GPU health where NVML cannot be: the dashboard is not on the GPU host); ``PROMETHEUS_URL`` / ``PROMETHEUS_SELECTOR`` set the
fleet's Prometheus. A key belongs to the target it was configured for:
a URL a viewer types gets no configured key (only one typed beside it), unless it *is* a configured
target's URL. Keys never leave this module's values through ``repr``: they are excluded from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

DEFAULT_API_KEY_ENV = "VLLM_API_KEY"


@dataclass(frozen=True, slots=True)
class TargetChoice:
    """A named target; ``api_key`` is resolved from secrets or the environment and never shown."""

    name: str
    url: str
    api_key: str | None = field(default=None, repr=False)
    gpu_metrics_url: str | None = None  # a dcgm-exporter /metrics for this server's GPUs


@dataclass(frozen=True, slots=True)
class PrometheusInstance:
    """One vLLM server read through Prometheus (opened from the Fleet page)."""

    url: str  # the Prometheus
    selector: str  # matchers, as promql.parse_selector returns them
    instance: str  # the instance label
    model: str | None = None

    @property
    def label(self) -> str:
        return f"{self.instance} · via Prometheus"


@dataclass(frozen=True, slots=True)
class TargetsConfig:
    targets: tuple[TargetChoice, ...]
    allow_custom: bool
    problems: tuple[str, ...] = ()
    prometheus_url: str | None = None
    prometheus_selector: str = ""

    def key_for(self, url: str) -> str | None:
        """The configured key of the target at ``url`` (None for any other URL)."""
        return next((t.api_key for t in self.targets if same_url(t.url, url)), None)


def normalize_url(url: str, what: str = "URL") -> str:
    """``host:port`` or ``http://host:port/`` → ``http://host:port`` (the collector's key): http when
    no scheme is given, no trailing slash. ``ValueError``, naming ``what``, for an empty URL, one that
    is not http(s), has no host or a bad port, or carries credentials (they would end up in
    recordings, logs and page links; an API key has its own path)."""
    text = url.strip()
    if not text:
        raise ValueError(f"empty {what}")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        host, _ = parts.hostname, parts.port  # .port raises on a port that is not a number in range
    except ValueError:
        raise ValueError(f"not a valid {what}: {url!r}") from None
    if parts.scheme.lower() not in ("http", "https") or not host or any(c.isspace() for c in host):
        raise ValueError(f"not an http(s) {what}: {url!r}")
    if "@" in parts.netloc:
        raise ValueError(f"credentials in the {what} are not accepted: pass the API key separately")
    return text.rstrip("/")


def same_url(a: str, b: str) -> bool:
    """The same server, spelled with or without scheme, case or trailing slash (never a URL that
    :func:`normalize_url` refuses)."""
    try:
        return normalize_url(a).lower() == normalize_url(b).lower()
    except ValueError:
        return False


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _key(entry: Mapping[str, Any], env: Mapping[str, str], default: str | None) -> str | None:
    if isinstance(entry.get("api_key"), str) and entry["api_key"]:
        return str(entry["api_key"])
    var = entry.get("api_key_env")
    if isinstance(var, str) and var:
        return env.get(var) or None
    return default


def _gpu_metrics_url(value: Any, where: str, problems: list[str]) -> str | None:
    """A configured GPU metrics URL, normalised; None (and a problem named) when it cannot be used."""
    if value is None or value == "":
        return None
    try:
        return normalize_url(str(value), "GPU metrics URL")
    except ValueError as exc:
        problems.append(f"{where}: {exc}; GPU health falls back to NVML")
        return None


def targets_from(secrets: Mapping[str, Any], env: Mapping[str, str]) -> TargetsConfig:
    """Read the target list; malformed entries are skipped and named in ``problems``."""
    default_key = _key(secrets, env, env.get(DEFAULT_API_KEY_ENV) or None)
    targets: list[TargetChoice] = []
    problems: list[str] = []
    listed = secrets.get("targets")
    if isinstance(listed, Mapping):
        for name, entry in listed.items():
            if isinstance(entry, str):
                targets.append(TargetChoice(str(name), entry, default_key))
            elif isinstance(entry, Mapping) and isinstance(entry.get("url"), str):
                gpu_url = _gpu_metrics_url(entry.get("gpu_metrics_url"), f"secrets: target {name!r}", problems)
                targets.append(TargetChoice(str(name), entry["url"], _key(entry, env, default_key), gpu_url))
            else:
                problems.append(f"secrets: target {name!r} needs a URL")
    env_url = env.get("VLLM_URL")
    if env_url and all(t.url != env_url for t in targets):
        gpu_url = _gpu_metrics_url(env.get("VLLM_GPU_METRICS_URL"), "environment: VLLM_GPU_METRICS_URL", problems)
        targets.insert(0, TargetChoice("VLLM_URL", env_url, default_key, gpu_url))
    allow = secrets.get("allow_custom_targets", True)
    if isinstance(allow, bool):
        allow_custom = allow
    elif isinstance(allow, str) and allow.strip().lower() in _TRUE | _FALSE:
        allow_custom = allow.strip().lower() in _TRUE
    else:
        # Fail closed: a setting meant to lock the deployment down must not open it by a typo.
        allow_custom = False
        problems.append(f"secrets: allow_custom_targets = {allow!r} is not true or false; custom URLs are off")
    if not targets and not allow_custom:
        problems.append("secrets: allow_custom_targets = false but no [targets] are listed")
    prom_url = secrets.get("prometheus_url") or env.get("PROMETHEUS_URL") or None
    prom_selector = secrets.get("prometheus_selector") or env.get("PROMETHEUS_SELECTOR") or ""
    if prom_url is not None and not isinstance(prom_url, str):
        problems.append("secrets: prometheus_url must be a URL string")
        prom_url = None
    if not isinstance(prom_selector, str):
        problems.append("secrets: prometheus_selector must be a string such as '{job=\"vllm\"}'")
        prom_selector = ""
    return TargetsConfig(tuple(targets), allow_custom, tuple(problems), prom_url, prom_selector)
