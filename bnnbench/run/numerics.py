"""This machine's numerics class: what decides the bits of a seeded CPU run besides the code, its configuration and
torch's thread count.

One torch wheel rounds differently on different CPUs. ATen's vectorised kernels dispatch on
``torch.backends.cpu.get_cpu_capability()`` (the vector width sets the order of a reduction's additions; SLEEF's
``exp`` and ``log`` differ by instruction set), and MKL and oneDNN choose their GEMM kernels by the CPU's instruction
sets and vendor. Measured (results/README.md, Provenance): on an Intel Xeon with AVX-512 FP16 and AMX, the re-runs of
records made on CI's machines before 2026-11-27 move by 1e-12 relative (float64: nng_table4's PBP on yacht) to 1e-5
(float32: the UCI board's Laplace on yacht), and holding ATen (``ATEN_CPU_CAPABILITY``), MKL (``MKL_CBWR``), oneDNN
and OpenBLAS to one instruction set through the environment does not bring the bits back.

So a record stores the class it was made in (``versions["numerics"]``), and the regression check compares numbers
exactly within a class: a machine of another class is checked against that class's own baseline
(bnnbench.judge.baselines).
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import torch

from bnnbench.core.linalg import mkl_vendor

ISA_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw",
             "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "asimd", "sve", "sve2")
"""The instruction sets that the kernels of torch, MKL, oneDNN and OpenBLAS dispatch on (x86-64 and Arm names as
Linux's ``/proc/cpuinfo`` spells them)."""

UNRECORDED = "unrecorded"
"""The class of a record written before records stored one (CI's machines up to 2026-11-27)."""


def _cpuinfo_fields(cpuinfo: str | None) -> dict[str, str] | None:
    """The first processor's fields of ``/proc/cpuinfo`` (or of the text given); None where there is none."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.is_file():
            return None
        cpuinfo = path.read_text(errors="replace")
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_isa(cpuinfo: str | None = None) -> tuple[str, tuple[str, ...]]:
    """The CPU's vendor and which of :data:`ISA_FLAGS` it has, read from ``/proc/cpuinfo`` (Linux; elsewhere the
    processor's name and no flags)."""
    fields = _cpuinfo_fields(cpuinfo)
    if fields is None:
        return platform.processor() or "unknown", ()
    have = set((fields.get("flags") or fields.get("Features") or "").split())
    vendor = fields.get("vendor_id") or fields.get("CPU implementer") or "unknown"
    return vendor, tuple(f for f in ISA_FLAGS if f in have)


def cpu_model(cpuinfo: str | None = None) -> str:
    """The processor's model as ``/proc/cpuinfo`` numbers it (x86-64: ``<vendor> family <f> model <m>``; Arm:
    ``<implementer> part <p>``), which :func:`numerics_class` leaves out: two models with the same instruction sets
    are one class, yet MKL and oneDNN may pick their kernels by model, so a baseline names the model it was written
    on (bnnbench.judge.baselines)."""
    fields = _cpuinfo_fields(cpuinfo)
    if fields is None:
        return platform.processor() or "unknown"
    if "cpu family" in fields:
        return f"{fields.get('vendor_id', 'unknown')} family {fields['cpu family']} model {fields.get('model', '?')}"
    if "CPU part" in fields:
        return f"{fields.get('CPU implementer', 'unknown')} part {fields['CPU part']}"
    return fields.get("model name") or platform.processor() or "unknown"


def numerics_class(cpuinfo: str | None = None) -> str:
    """``torch <version>; aten <capability>; <machine> <vendor>: <instruction sets>``, and ``; mkl any vendor`` where
    this process runs MKL's kernels by instruction set alone (``bnnbench.core.linalg.mkl_vendor``): two machines of
    one class are expected to repeat a seeded CPU run bit for bit (at one thread count); a baseline, which makes the
    check exact on a class, holds only on the processor model it was written on (:func:`cpu_model`)."""
    vendor, flags = cpu_isa(cpuinfo)
    return (f"torch {torch.__version__}; aten {torch.backends.cpu.get_cpu_capability()}; "
            f"{platform.machine()} {vendor}: {' '.join(flags) or '-'}"
            + ("; mkl any vendor" if mkl_vendor.active() else ""))


def class_id(numerics: str) -> str:
    """A short file name for a class (the first 12 hex digits of its SHA-256)."""
    return hashlib.sha256(numerics.encode()).hexdigest()[:12]


def record_class(record: dict) -> str:
    """The numerics class a record was made in (:data:`UNRECORDED` for a record older than the field)."""
    return (record.get("versions") or {}).get("numerics") or UNRECORDED
