"""Stand-ins for what a GPU rank runs and a CPU cannot: each allocates what the CUDA path allocates (read from the
libraries' CUDA code paths), so the live memory the trace sees is the GPU run's, not the CPU fallback's.

- TRL's fused LM head (trl/kernels/chunked_logprob.py): on CUDA a Triton kernel folds each [4096 x 32768] logit
  tile into the per-token statistics in place and cuBLAS accumulates the gradients in fp32 (`addmm(out_dtype=
  float32)`); the CPU fallback (_forward_tile, _backward_tile, `a.float()` copies) holds several fp32 copies of the
  tile and of the weight chunk. Here the kernels and the fp32 accumulation allocate nothing, as on CUDA.
- Dropout: CUDA runs the fused native_dropout (a bool mask saved for backward); the CPU path multiplies by a mask
  in the input's dtype.
- bitsandbytes' 4-bit matmul (backends/cuda/ops.py gemm_4bit): past 1536 tokens, or where its kernel does not
  apply, it dequantizes the weight (fp32 absmax, and its dequantized copy when nested) and runs F.linear; below,
  its fused kernel allocates only the output. Which one it picks between 5 and 1536 tokens depends on the GPU model
  (a heuristic that needs the device): the fused kernel is assumed. Its backward's dequantize runs unchanged.
  bitsandbytes re-wraps FSDP's unsharded weight in a Params4bit to give it the module's quant state, which a
  FakeTensor cannot be; the quant state is attached directly.
- Activation offload (accelerate's offload_wrapper: torch's save_on_cpu around each checkpointed layer): on a GPU
  each tensor saved inside it (the checkpoint's inputs) is copied to pinned host memory and copied back to a new
  device tensor at the recompute. On the trace's `cpu` device the copy would be one more tensor on the device the
  tracker counts, and the copy back the same tensor: here the copy is host bytes (counted in `Host`) and the copy
  back allocates the device tensor it makes on a GPU.
- Values fake tensors do not have: transformers' SDPA mask skips the S x S mask when the 2-D attention mask is all
  ones (masking_utils `_ignore_causal_mask_sdpa`), but takes every fake tensor for a traced graph and builds it. The
  trace's rows are full length, as TRL's collator gives them an all-ones mask: the check is made on that mask's
  values, so no S x S mask is built where a GPU run builds none.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BNB_FUSED_MAX_TOKENS = 1536  # bitsandbytes backends/cuda/ops.py _gemm_4bit_custom_max_m


class _NoKernel:
    """A Triton kernel as `kernel[grid](...)` calls it: writes into buffers it is given, allocates nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _addmm_fp32(acc, a, b) -> None:
    """trl/kernels/chunked_logprob.py _addmm_fp32 on CUDA: cuBLAS accumulates a half-precision product into the fp32
    buffer (out_dtype), without the fp32 copies of both operands the CPU branch makes."""
    if a.dtype in (torch.float16, torch.bfloat16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a, b)


def _dropout(input, p=0.5, training=True, inplace=False):
    """torch.nn.functional.dropout as CUDA runs it: native_dropout, whose mask is bool."""
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


def _fix_quant_state(module) -> None:
    """bitsandbytes' fix_4bit_weight_quant_state_from_module, without re-wrapping the weight in a Params4bit."""
    if getattr(module.weight, "quant_state", None) is None:
        module.weight.quant_state = module.quant_state


class CudaKernels(TorchDispatchMode):
    """bitsandbytes' gemm_4bit with the CUDA dispatch's allocations (its fake kernel allocates only the output)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "namespace", None) == "bitsandbytes" and getattr(func, "_opname", None) == "gemm_4bit":
            return _gemm_4bit(*args, **kwargs)
        return func(*args, **kwargs)


def _gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, *_, **__):
    """backends/cuda/ops.py: _dequant_linear_fallback past the fused kernel's range, else the output alone."""
    k, n = A.shape[-1], shapeB[0]
    m = A.numel() // k
    if m <= BNB_FUSED_MAX_TOKENS and k % blocksize == 0:
        out = torch.empty((*A.shape[:-1], n), dtype=A.dtype, device=A.device)
        return out if bias is None else out + bias
    held = ()
    if absmax_8bit is not None:  # nested: the 8-bit absmax dequantized to fp32, and that plus the offset
        dequantized_absmax = torch.empty_like(absmax_8bit, dtype=torch.float32)
        held = (dequantized_absmax, dequantized_absmax + 0.0)
    dequantized = torch.empty(tuple(shapeB), dtype=A.dtype, device=A.device)
    out = torch.nn.functional.linear(A, dequantized, bias)
    del held, dequantized
    return out


class Host:
    """Bytes save_on_cpu keeps in host memory: live now, and the most at once."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def add(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)


class _HostCopy:
    """A saved tensor's pinned host copy, by its shape (the tensor's bytes leave the device the tracker counts)."""

    __slots__ = ("size", "dtype", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.size, self.dtype = t.size(), t.dtype


def _save_on_host(host: Host):
    """torch.autograd.graph.save_on_cpu(pin_memory=True), as a GPU runs it."""

    class save_on_host(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
            def pack(t: torch.Tensor):
                copy, n = _HostCopy(t), t.numel() * t.element_size()  # torch.empty(t.size()) and copy_
                host.add(n)
                weakref.finalize(copy, host.add, -n)
                return t.device, copy

            def unpack(packed) -> torch.Tensor:
                device, copy = packed
                return torch.empty(copy.size, dtype=copy.dtype, device=device)  # the host copy .to(device)

            super().__init__(pack, unpack)

    return save_on_host


def _sdpa_mask_skip(original):
    """masking_utils._ignore_causal_mask_sdpa on the values of the trace's all-ones 2-D mask (see above)."""

    def skip(padding_mask, *args, **kwargs):
        return original(None, *args, **kwargs)

    return skip


@contextlib.contextmanager
def cuda_paths(host: Host | None = None):
    """While the step runs: the stand-ins above in place of the CPU paths; everything restored after. `host`
    counts what activation offload moves to host memory."""
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper
    from transformers import masking_utils
    from trl.kernels import chunked_logprob as head

    patches = [
        (checkpoint_wrapper, "save_on_cpu", _save_on_host(host or Host())),
        (masking_utils, "_ignore_causal_mask_sdpa", _sdpa_mask_skip(masking_utils._ignore_causal_mask_sdpa)),
        (head, "_use_triton", lambda device: True),
        (head, "_forward_kernel", _NoKernel()),
        (head, "_backward_kernel", _NoKernel()),
        (head, "triton", type("triton", (), {"cdiv": staticmethod(_cdiv)})),
        (head, "_addmm_fp32", _addmm_fp32),
        (torch.nn.functional, "dropout", _dropout),
    ]
    try:
        import bitsandbytes.nn.modules as bnb_modules

        patches.append((bnb_modules, "fix_4bit_weight_quant_state_from_module", _fix_quant_state))
    except ImportError:  # no 4-bit run needs it
        pass
    saved = [(obj, name, getattr(obj, name, None)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        with CudaKernels():
            yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
