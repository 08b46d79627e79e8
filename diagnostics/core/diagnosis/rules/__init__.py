"""The rules: observed symptoms → findings with evidence and concrete `vllm serve` changes, one
module per family of symptoms:

- :mod:`.startup`: a server that did not start (its startup log);
- :mod:`.outages`: a server not serving (down, restarted, late answers, stalls, an engine that died);
- :mod:`.ranks`: data-parallel ranks side by side (hung, slow, requests not spread);
- :mod:`.memory`: the KV cache (preemption, more room, n > 1 samples not sharing blocks);
- :mod:`.queueing`: requests that wait or are turned away (the batch cap, LoRA slots, queue limits);
- :mod:`.latency`: head-of-line blocking, slow decode, TTFT over budget;
- :mod:`.features`: sleep mode and speculative decoding.

Every rule has one signature, ``run(ctx) -> list[Finding]``, and reads only the
:class:`~diagnostics.core.diagnosis.context.Context`. A rule body says what it found (id, severity,
title, evidence, suggestions, checks, time range); what each finding points to (knobs, chart), the
window it was judged on, how rules combine and which alerts and scenarios mirror them is the table
in :mod:`diagnostics.core.diagnosis.table`, stamped on by the runner. A rule that cannot run because
a metric is absent says so in an ``info`` finding; a symptom that came and went inside the window
is still reported, with its time range.
"""
