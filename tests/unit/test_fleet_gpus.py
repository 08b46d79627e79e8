"""dcgm-exporter's series through Prometheus, joined to each vLLM instance: by the pod holding the
GPU when both sides carry pod labels (also when Prometheus renamed them exported_pod), else by the
host of the instance; an instance neither reaches gets no reading (never a neighbour's)."""

from __future__ import annotations

from typing import Any

from diagnostics.core.fleet.gpus import dcgm_query, host_of, join
from diagnostics.core.metrics.gpu import ClockEvent


def up(instance: str, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": "up", "job": "vllm", "instance": instance, **labels}, "value": [100.0, "1"]}


def dcgm(name: str, value: float, instance: str, gpu: str, **labels: str) -> dict[str, Any]:
    metric = {"__name__": name, "job": "dcgm", "instance": instance, "gpu": gpu, "UUID": f"GPU-{instance}-{gpu}",
              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": labels.pop("Hostname", "node-a"), **labels}
    return {"metric": metric, "values": [[100.0, str(value)], [115.0, str(value)]]}


def test_the_query_asks_for_every_field_the_readings_use() -> None:
    query = dcgm_query()
    assert query.startswith('{__name__=~"') and "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in query
    assert "DCGM_FI_DEV_FB_USED" in query and "DCGM_FI_DEV_ENFORCED_POWER_LIMIT" in query


def test_hosts_are_read_from_instances() -> None:
    assert (host_of("10.0.0.7:8000"), host_of("[::1]:8000"), host_of("node-a")) == ("10.0.0.7", "::1", "node-a")


def test_a_pod_mapped_gpu_joins_its_pod_and_not_the_pod_beside_it() -> None:
    """Two vLLM pods on one node; dcgm-exporter (honor_labels off) maps GPU 0 to vllm-a, GPU 1 to vllm-b."""
    targets = [up("10.1.0.5:8000", pod="vllm-a", namespace="inference"),
               up("10.1.0.6:8000", pod="vllm-b", namespace="inference")]
    series = [dcgm("DCGM_FI_DEV_GPU_TEMP", 89, "10.2.0.9:9400", "0", exported_pod="vllm-a",
                   exported_namespace="inference", pod="dcgm-exporter-x"),
              dcgm("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 64, "10.2.0.9:9400", "0", exported_pod="vllm-a",
                   exported_namespace="inference", pod="dcgm-exporter-x"),
              dcgm("DCGM_FI_DEV_GPU_TEMP", 60, "10.2.0.9:9400", "1", exported_pod="vllm-b",
                   exported_namespace="inference", pod="dcgm-exporter-x")]
    joined = join(targets, series)
    a, b = joined["10.1.0.5:8000"], joined["10.1.0.6:8000"]
    assert (a.by, b.by) == ("pod", "pod")
    assert [ts for ts, _ in a.readings] == [100.0, 115.0]
    [gpu_a] = a.last.devices if a.last else ()
    [gpu_b] = b.last.devices if b.last else ()
    assert (gpu_a.index, gpu_a.temperature_celsius, gpu_a.clock_events) == (0, 89.0, ClockEvent.HW_THERMAL_SLOWDOWN)
    assert (gpu_b.index, gpu_b.temperature_celsius, gpu_b.clock_events) == (1, 60.0, None)
    assert a.last is not None and a.last.source == "Prometheus (DCGM, joined by pod)"


def test_without_pod_labels_the_gpus_of_the_instances_host_are_joined() -> None:
    targets = [up("10.0.0.7:8000"), up("10.0.0.8:8000")]
    series = [dcgm("DCGM_FI_DEV_GPU_UTIL", 97, "10.0.0.7:9400", "0"), dcgm("DCGM_FI_DEV_GPU_UTIL", 40, "10.0.0.8:9400", "0",
                                                                           Hostname="node-b")]
    joined = join(targets, series)
    assert {i: j.by for i, j in joined.items()} == {"10.0.0.7:8000": "host", "10.0.0.8:8000": "host"}
    assert joined["10.0.0.7:8000"].last.devices[0].utilization_gpu_perc == 0.97  # type: ignore[union-attr]
    assert joined["10.0.0.8:8000"].last.devices[0].utilization_gpu_perc == 0.40  # type: ignore[union-attr]


def test_the_hostname_label_joins_when_the_exporter_is_scraped_by_name() -> None:
    joined = join([up("gpu-node-7:8000")], [dcgm("DCGM_FI_DEV_GPU_TEMP", 70, "10.9.9.9:9400", "0", Hostname="gpu-node-7")])
    assert joined["gpu-node-7:8000"].by == "host"


def test_an_instance_no_join_reaches_has_no_reading() -> None:
    joined = join([up("10.0.0.7:8000", pod="vllm-a")], [dcgm("DCGM_FI_DEV_GPU_TEMP", 70, "10.0.0.99:9400", "0",
                                                              Hostname="elsewhere", pod="vllm-z")])
    assert joined == {}


def test_pods_of_the_same_name_in_two_namespaces_each_join_their_own_gpu() -> None:
    """A StatefulSet names its pods alike in every namespace: vllm-0 in team-a and vllm-0 in team-b,
    on one node. dcgm-exporter (in its own namespace, honor_labels off) maps GPU 0 to team-a/vllm-0 and
    GPU 1 to team-b/vllm-0: each server gets its own GPU only, by pod."""
    targets = [up("10.1.0.5:8000", pod="vllm-0", namespace="team-a"),
               up("10.1.0.6:8000", pod="vllm-0", namespace="team-b")]
    mapped = {"pod": "dcgm-exporter-x", "namespace": "gpu-operator"}
    series = [dcgm("DCGM_FI_DEV_GPU_TEMP", 89, "10.2.0.9:9400", "0", exported_pod="vllm-0",
                   exported_namespace="team-a", **mapped),
              dcgm("DCGM_FI_DEV_GPU_TEMP", 60, "10.2.0.9:9400", "1", exported_pod="vllm-0",
                   exported_namespace="team-b", **mapped)]
    joined = join(targets, series)
    a, b = joined["10.1.0.5:8000"], joined["10.1.0.6:8000"]
    assert (a.by, b.by) == ("pod", "pod")
    assert [(d.index, d.temperature_celsius) for d in a.last.devices] == [(0, 89.0)]  # type: ignore[union-attr]
    assert [(d.index, d.temperature_celsius) for d in b.last.devices] == [(1, 60.0)]  # type: ignore[union-attr]


def test_a_nan_from_prometheus_is_an_unknown_field_not_a_number() -> None:
    """Prometheus answers a NaN sample as the string "NaN": the field is unknown (None), and the other
    fields of the device stand."""
    series = [dcgm("DCGM_FI_DEV_GPU_TEMP", 70, "10.0.0.7:9400", "0"),
              dcgm("DCGM_FI_DEV_POWER_USAGE", 0, "10.0.0.7:9400", "0")]
    series[1]["values"] = [[100.0, "NaN"], [115.0, "NaN"]]
    [device] = join([up("10.0.0.7:8000")], series)["10.0.0.7:8000"].last.devices  # type: ignore[union-attr]
    assert (device.temperature_celsius, device.power_watts) == (70.0, None)
