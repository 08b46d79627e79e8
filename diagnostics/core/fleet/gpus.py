"""dcgm-exporter's series read through Prometheus, joined to each vLLM instance (pure): GPU health
on the Fleet page and for an instance opened from it, when the dashboard is nowhere near the GPUs.

dcgm-exporter runs once per GPU node (a DaemonSet in Kubernetes) and Prometheus scrapes it as its
own job, so its series share no ``instance`` with vLLM's. The join, in this order:

1. **by pod**: with Kubernetes pod mapping, dcgm-exporter labels each GPU's series with the pod
   that holds the GPU (``pod``, ``namespace``; ``exported_pod`` / ``exported_namespace`` when
   Prometheus renamed them because the scrape set its own, ``honor_labels: false``). A vLLM target
   carrying ``pod`` (and ``namespace``) labels of its own (Kubernetes service discovery relabelled
   into the target) gets the GPUs of that pod.
2. **by host**: otherwise the host part of the vLLM ``instance`` (``10.0.0.7:8000`` → ``10.0.0.7``)
   against the host part of the exporter's ``instance`` or its ``Hostname`` label: every GPU of the
   node the server runs on (a node shared by several servers shows all its GPUs for each).

An instance neither join reaches has no GPU reading, said as such; never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.metrics.dcgm import METRIC_NAMES, devices_from_samples
from diagnostics.core.metrics.gpu import GpuReading


def dcgm_query() -> str:
    """Every dcgm-exporter series the typed readings use (one query for the whole fleet)."""
    return '{__name__=~"' + "|".join(METRIC_NAMES) + '"}'


def host_of(instance: str) -> str:
    """``10.0.0.7:8000`` → ``10.0.0.7``; ``[::1]:8000`` → ``::1``; a bare host stays."""
    text = instance.strip()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


@dataclass(frozen=True, slots=True)
class GpuJoin:
    """The GPU readings joined to one vLLM instance, and how they were joined ("pod" or "host")."""

    instance: str
    by: str
    readings: tuple[tuple[float, GpuReading], ...]

    @property
    def last(self) -> GpuReading | None:
        return self.readings[-1][1] if self.readings else None


def _workload_pod(labels: Mapping[str, str]) -> tuple[str, str] | None:
    pod = labels.get("exported_pod") or labels.get("pod")
    if not pod:
        return None
    return labels.get("exported_namespace") or labels.get("namespace") or "", pod


def join(targets: Sequence[Mapping[str, Any]], dcgm: Sequence[Mapping[str, Any]],
         source: str = "Prometheus") -> dict[str, GpuJoin]:
    """``targets``: an ``up`` query's answer for the vLLM instances (their target labels);
    ``dcgm``: :func:`dcgm_query`'s answer, instant (``value``) or range (``values``). Each vLLM
    instance that a join reaches → its GPU readings per timestamp, oldest first."""
    series = []
    for s in dcgm:
        labels = {str(k): str(v) for k, v in s.get("metric", {}).items()}
        name = labels.pop("__name__", "")
        points = s.get("values") or ([s["value"]] if "value" in s else [])
        hosts = {h for h in (host_of(labels.get("instance", "")), labels.get("Hostname", "")) if h}
        series.append((name, labels, points, _workload_pod(labels), hosts))
    out: dict[str, GpuJoin] = {}
    for target in targets:
        labels = target.get("metric", {})
        instance = labels.get("instance")
        if not instance:
            continue
        pod = (str(labels.get("namespace", "")), str(labels["pod"])) if labels.get("pod") else None
        by, matched = "pod", [s for s in series if pod is not None and s[3] is not None and _same_pod(pod, s[3])]
        if not matched:
            host = host_of(str(instance))
            by, matched = "host", [s for s in series if host in s[4]]
        if not matched:
            continue
        by_ts: dict[float, list[tuple[str, Mapping[str, str], float]]] = {}
        for name, dcgm_labels, points, _, _ in matched:
            for ts, value in points:
                by_ts.setdefault(float(ts), []).append((name, dcgm_labels, _number(value)))
        readings = tuple((ts, GpuReading(devices_from_samples(samples), source=f"{source} (DCGM, joined by {by})"))
                         for ts, samples in sorted(by_ts.items()))
        out[str(instance)] = GpuJoin(str(instance), by, readings)
    return out


def _same_pod(vllm: tuple[str, str], gpu: tuple[str, str]) -> bool:
    return vllm[1] == gpu[1] and (not vllm[0] or not gpu[0] or vllm[0] == gpu[0])


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan
