"""The ``compile`` setting: a method's whole update step through ``torch.compile`` (inductor).

``Method.step(state, batch, noise, lr_scale)`` is a pure function of the state's tensors, the minibatch and the draws,
so it compiles whole: sampling from the draws, the forward pass, the gradients (``torch.autograd.grad``, traced into the
graph with dynamo's ``trace_autograd_ops``) or closed-form cotangents, and the update, as one graph. The draws stay
eager (``Method.noise`` reads a ``torch.Generator``), so a compiled run draws exactly the eager run's numbers; its state
then differs from the eager one by float rounding only (fused kernels sum in another order: ~1e-6 relative in float32
per step, tests/run/test_contract.py), which over thousands of steps moves the last digits of a record's metrics: a
compiled run is another configuration (``results.HASH_DEFAULTS``: ``compile`` is hashed when on).

Measured on this 2-core CPU (``bench/compile_step.py``): the Boston step of BBB (slang_uci) and VOGN (vadam_uci) at
20 and 100 replicas runs 1.3-2x faster compiled, after 5-30 s of compilation in a fresh cache and ~1-4 s with a warm
one (the compile time counts in a run's wall time). Inductor keeps its compiled kernels and graphs between processes
in ``TORCHINDUCTOR_CACHE_DIR``, here under the data cache (``<cache>/inductor/ops-<digest>``, a directory per version of
the package's operators: ``operators_key``) unless set.

A graph is specialised to its inputs' strides, dispatch keys and Python numbers, so the compiled update passes the
state row-major (``_contiguous``; noisy K-FAC's step returns its factor roots C = L^-T transposed, which had compiled
a second graph at its second step) and, on a CPU, ``lr_scale`` as a 0-d tensor (as a float it was a constant of the
graph, and the lr drop at half time compiled a third): one graph for a fit.

Only methods that declare ``compilable = True`` are compiled (their compiled step is checked against the eager one), and
only on an MLP, or on a GPU (a convolutional network's step is a few large kernels on a CPU; on a GPU its launches
weigh); for the others the setting changes nothing, and the resolved configuration records ``compile: false`` for them.
A method whose step reads a tensor on the host between its parts compiles its pure part (``Method.compiled_step``): HMC
compiles its proposal, the whole leapfrog trajectory of L_max steps with the accept test (``HMC.propose``; the warm-up's
adaptation and the kept draws stay eager; its state contiguous and, from the first step on, inference tensors, so that a
fit compiles it once; with automatic dynamic shapes, ``Method.compile_dynamic``, so that active learning's fits on a row
more each round compile it once more in all), 5.5x faster than eager at NNG Table 4's net; its kernels, about a dozen
tiny ones per leapfrog step, are called from inductor's C++ wrapper on a CPU (``Method.compile_cpp_wrapper``; the same
kernels), which took its transition from 1.19-1.35x NumPyro's to 0.91-0.93x (``bench/hmc_numpyro.py``); its chains move
as the eager ones to float rounding and accept alike, though in float32 its step-size adaptation, which reads alpha =
exp(H - H'), a difference of large energies, differs by 1-4e-5 relative (tests/run/test_contract.py). SLANG compiles its
step with the per-example gradients back-propagated in closed form (``SLANG.compiled_step``: autograd's graph would
break at the eigensolver); at L = 1 on the CPU the Gram matrices' top eigenpairs come from a SIMD kernel that the graph
calls as an operator (``linalg.top_eigpair``; the eager step's LAPACK ``?syevr`` loop, one matrix per call, is 3-4x
slower at R = 100), so the step is one graph: 1.9-2.0x at R = 100, 2.1-2.3x at R = 20 against 5c21305
(``bench/step_ab.py``; 1.4x and 1.8x with LAPACK eager between the compiled parts, as at L > 1). Noisy K-FAC compiles as
one graph, its factor roots C = L^-T by a SIMD kernel that the graph calls as an operator (``linalg.chol_root``, 2.4-3x
LAPACK's calls) and its Cholesky fallback (``inv_chol_t``: eigenvalues clamped where a factor is not numerically
positive definite) as another operator that clamps the failed replicas alone (a batch-shaped ``torch.cond`` branch had
made the UCI board's step 2.5-3x slower than eager: a diverging candidate fails at every step), ``torch.cond`` where
LAPACK factorises (a GPU, factors above the kernel's size): 1.6x at R = 100, 1.75x at R = 20 on Boston. The
inducing-point families compile on their MLP (``InducingFamily.compiles_with``; App. G's setting: factorised 2.0-2.2x,
global inducing 1.3-1.5x), not on their convolutional architectures (not tried). PBP compiles each point's ADF update
(``PBP.adf_point``, its gradients by ``torch.func.grad``), a few dozen tiny kernels on ``[R, P]`` that eagerly are bound
by their dispatch; the loop over a minibatch's points and the prior's EP sweep stay eager: 4.5x at NNG Table 1's
kin8nm setting (``bench/step_ab.py --methods pbp``). Not compilable at present: K-FAC (convolutional) and full Gaussian
VI (its compiled full-covariance step is 1.2e-5 off in float32, its mean-field step on an MLP does not compile).

On a GPU (``device=cuda``) the compiled step also runs as a CUDA graph (``torch.compile(mode="reduce-overhead")``,
inductor's CUDA-graph trees): the small networks' steps are bound by kernel launches there (an MNIST Adam step takes
2.0 ms on an H200, most of it launching), and a graph replays the step's hundreds of kernels in one launch. The engine
passes each step's new state to the next and reads the step's statistics before the next step, so every update begins
a new graph step (``torch.compiler.cudagraph_mark_step_begin``), and the compiled function's outputs are copied out of
the graphs' memory pool before they are returned (``_owned``): a step that dynamo splits into several graphs (a graph
break at an autograd call, at SLANG's eager eigensolver) reads its input state after its first graph has replayed, and
a new graph step lets that replay overwrite the previous step's outputs, which are this step's inputs (the first GPU
lease to run it, 2026-11-27, met ``accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run`` in every compiled method). Inductor's comprehensive padding is off on the GPU: with it, a padded intermediate
crossing a graph break failed the next graph's stride check (noisy K-FAC's convolutional step, the same lease).
Inductor leaves a graph that cannot be captured (a host synchronisation, a CPU tensor) running as plain compiled
kernels and says so in its log; the numbers are the compiled step's either way. Timed by ``make gpu-queue``'s
``bench_cuda_graphs`` (results/README.md, Speed).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from bnnbench.methods.base import Method
from bnnbench.core.models import MLP
from bnnbench.core.models.convnet import ConvNet

# dynamo re-traces for each new shape or constant (a short last batch, float32 and float64);
# past this many versions of one step it would silently fall back to eager
_CACHE_SIZE_LIMIT = 64


def new_run() -> None:
    """Forget the compiled versions of the runs before this one in the process (``torch._dynamo.reset``), where dynamo
    is loaded. Dynamo keeps a function's versions per code object, one per set of guards (shapes, Python constants
    such as a step size), and past ``recompile_limit`` versions it runs the function eagerly: App. G's 235 cells share
    ``InducingFamily.step``, so that in one ``bnnbench reproduce`` process (``make reproduce-tables``) every cell after
    the 64th would have run eager, at half the speed (with the limit set to 1, the second of three cells on yacht took
    72 s against the first's 36 s). A run's fits share their versions (a selection's rounds, the final fit); runs share
    none (their shapes or constants differ), and inductor's compiled graphs stay in its cache on disk."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def compile_mode(device: torch.device | str | None) -> str | None:
    """``torch.compile``'s mode on ``device``: CUDA graphs on a GPU (``"reduce-overhead"``), the default elsewhere."""
    return "reduce-overhead" if device is not None and torch.device(device).type == "cuda" else None


def compiles(method: Method | type[Method], setting: bool, conv: bool = False,
             device: torch.device | str | None = None, settings=None) -> bool:
    """Whether a run with ``compile=setting`` on ``device`` compiles ``method``'s step: a ``compilable`` method's (with
    its ``settings``, where given: ``Method.compiles_with``), on an MLP, or on a convolutional network (``conv``) on a
    GPU, where its launches weigh (on a CPU its step is a few large kernels)."""
    gpu = compile_mode(device) == "reduce-overhead"
    able = bool(getattr(method, "compilable", False))
    if able and settings is not None and hasattr(method, "compiles_with"):
        able = method.compiles_with(settings)
    return bool(setting) and able and (not conv or gpu)


def operators_key(root: Path | None = None) -> str:
    """A digest of the package's (or ``root``'s) modules that define operators (``torch.library.custom_op``): a cached
    graph holds the output layouts their shape rules gave when it was compiled, and inductor's cache key does not
    cover those rules, so a graph cached before a rule changed would fail its layout checks (``assert_size_stride``)."""
    root = root or Path(__file__).resolve().parents[1]
    texts = (f.read_bytes() for f in sorted(root.rglob("*.py")))
    text = b"".join(t for t in texts if b"torch.library.custom_op" in t)
    return hashlib.sha256(text).hexdigest()[:12]


def _use_cache_dir() -> None:
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from bnnbench.core.data.store import cache_dir
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor" / f"ops-{operators_key()}")


def _owned(fn, mode: str | None):
    """``fn`` whose tensor outputs, under CUDA graphs, are copies outside the graphs' memory pool (module docstring)."""
    if mode != "reduce-overhead":
        return fn

    def owned(*args, **kwargs):
        return pytree.tree_map(lambda v: v.clone() if torch.is_tensor(v) else v, fn(*args, **kwargs))
    return owned


def compiled_step(method: Method, device: torch.device | None = None):
    """``method.step`` compiled: the same signature, the same results to float rounding; on a CUDA ``device`` the
    compiled step runs as a CUDA graph (``compile_mode``), each call a new graph step."""
    _use_cache_dir()
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, _CACHE_SIZE_LIMIT)
    mode = compile_mode(device)
    if mode == "reduce-overhead":
        import torch._inductor.config
        torch._inductor.config.comprehensive_padding = False
    # a CPU graph's kernels called from C++ where the method asks (``Method.compile_cpp_wrapper``); under CUDA graphs
    # the wrapper runs once per capture, so it stays Python there
    options = {"cpp_wrapper": True} if mode is None and getattr(method, "compile_cpp_wrapper", False) else None
    dynamic = getattr(method, "compile_dynamic", False)
    fn = method.compiled_step(lambda f: _owned(torch.compile(f, dynamic=dynamic, mode=mode, options=options), mode))

    def step(state, batch, noise, lr_scale: float = 1.0):
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        else:
            lr_scale = graph_lr_scale(lr_scale)
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return fn(state, batch, noise, lr_scale)
    return step


def graph_lr_scale(lr_scale: float) -> torch.Tensor:
    """``lr_scale`` as a CPU graph takes it: a 0-d tensor, not a float, which dynamo would bake in (the lr drop would
    compile the step again)."""
    return torch.tensor(lr_scale, dtype=torch.float64)


def _contiguous(state, inference: bool = False):
    """``state`` with its tensors row-major (and, with ``inference``, as inference tensors): a graph is specialised to
    its inputs' strides and dispatch keys, so a first state made otherwise, or a step that returns a transposed factor
    (noisy K-FAC's C = L^-T), would compile a second graph."""
    def fix(v):
        if not torch.is_tensor(v):
            return v
        if inference and not v.is_inference():
            return v.clone(memory_format=torch.contiguous_format)
        return v.contiguous()
    return pytree.tree_map(fix, state)


def compiled_update(method: Method, device: torch.device | None = None):
    """``method.update`` with its step compiled (``compiled_step``, as CUDA graphs on a CUDA ``device``), or
    ``method.update`` itself for a method that is not ``compilable``."""
    conv = isinstance(method.model, ConvNet) or not isinstance(method.model, MLP)   # a ConvNet is an MLP subclass
    if not compiles(method, True, conv=conv, device=device, settings=method.cfg):
        return method.update
    step = compiled_step(method, device)
    # the state the last step returned, where its layout was already the graph's (row-major tensors): passed back, it
    # skips ``_contiguous``'s walk over the state (0.1 ms a step for App. G's); a graph's outputs keep their layout
    last = {"state": None, "as_taken": None}

    def update(state, batch, generator, lr_scale: float = 1.0):   # as Method.update
        if method.needs_autograd:
            new = step(state if state is last["state"] else _contiguous(state), batch,
                       method.noise(state, batch, generator), lr_scale)
        else:
            with torch.inference_mode():
                # the first state, made outside inference mode, as inference tensors like every later one
                if state is not last["state"]:
                    state = _contiguous(state, inference=True)
                new = step(state, batch, method.noise(state, batch, generator), lr_scale)
        if last["as_taken"] is None:
            last["as_taken"] = all(v.is_contiguous() for v in pytree.tree_leaves(new[0]) if torch.is_tensor(v))
        last["state"] = new[0] if last["as_taken"] else None
        return new
    return update
