"""The target model: what the sidebar can point at (configured targets, the simulated engine, a
typed URL, an instance opened from the Fleet page) and which one the session chose."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from diagnostics.core.targets import PrometheusInstance, TargetsConfig, normalize_url
from diagnostics.sim.server import SIM_DCGM_PATH
from diagnostics.ui import state


@dataclass(frozen=True, slots=True)
class Selected:
    """The chosen target: where its metrics are read from, and the key for that URL only."""

    url: str
    label: str
    api_key: str | None = field(default=None, repr=False)
    simulated: bool = False
    prometheus: PrometheusInstance | None = None
    gpu_metrics_url: str | None = None  # a dcgm-exporter /metrics read for GPU health (NVML otherwise)


def options(config: TargetsConfig) -> list[str]:
    """Configured targets first; the built-in simulation and a custom URL unless the deployment is
    locked to its list (``allow_custom_targets = false``)."""
    extra = [state.SIMULATED, state.CUSTOM] if config.allow_custom else []
    instance = opened()
    return ([instance.label] if instance is not None else []) + [t.name for t in config.targets] + extra


def opened() -> PrometheusInstance | None:
    """The instance last opened from the Fleet page, if any."""
    value = state.get(state.PROM_INSTANCE)
    return value if isinstance(value, PrometheusInstance) else None


def resolve(config: TargetsConfig, simulator_url: Callable[[], str]) -> Selected | None:
    """The chosen target from session state, without drawing anything (``simulator_url`` is asked
    only when the simulated engine is the choice: asking starts it). The simulated engine's GPU
    metrics URL is its own DCGM-shaped endpoint; a typed URL's is the one typed beside it.

    Raises ``ValueError`` for a URL that cannot be used.
    """
    choices = options(config)
    if not choices:
        return None
    choice = state.get(state.TARGET_NAME)
    if choice not in choices:
        choice = choices[0]
    if choice == state.SIMULATED:
        url = simulator_url()
        return Selected(url, "simulated engine", None, simulated=True, gpu_metrics_url=url + SIM_DCGM_PATH)
    instance = opened()
    if instance is not None and choice == instance.label:
        return Selected(instance.instance, instance.label, None, prometheus=instance)
    if choice == state.CUSTOM:
        url = str(state.get(state.CUSTOM_URL) or "")
        if not url.strip():
            return None
        normal = normalize_url(url)
        typed = str(state.get(state.API_KEY) or "") or None
        gpu_url = str(state.get(state.GPU_METRICS_URL) or "").strip()
        # Only a key typed for this URL, or the configured key of a target at this very URL.
        return Selected(normal, normal, typed or config.key_for(normal),
                        gpu_metrics_url=normalize_url(gpu_url, "GPU metrics URL") if gpu_url else None)
    target = next(t for t in config.targets if t.name == choice)
    return Selected(normalize_url(target.url), target.name, target.api_key, gpu_metrics_url=target.gpu_metrics_url)
