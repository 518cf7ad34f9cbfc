"""ChatTTS's transformer in int8: its Linear layers with int8 weights and activations quantized as they come.

Only the Llama's Linear layers change: on the CPU they are nearly all of a decode step's time. The embeddings,
the heads that pick each token, the DVAE decoder and Vocos stay in full precision, so the sampler reads fp32
logits and the audio is made from fp32 hidden states as before.

The kernels are torch.ao's dynamic quantization (fbgemm/oneDNN on x86), deprecated in favour of torchao but
still shipped with the pinned torch: the benchmarks page's "Why these int8 kernels" says why they were chosen over
torchao's, whose CPU kernels pay only under ``torch.compile``, which would compile afresh for every batch size
and cache length a decode loop that admits segments mid-call goes through.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import warnings

import torch

#: A qconfig for each Linear: weights quantized per output channel (closer to fp32 than one scale per matrix, at
#: the same speed), activations per tensor at each call.
_PER_CHANNEL = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}


def int8_supported(device: str) -> str | None:
    """Return why int8 cannot run on ``device`` here, or None when it can."""
    if torch.device(device).type != "cpu":
        return (
            f"int8 runs on the CPU only: on {device} it is not offered (no GPU int8 kernel has been measured against "
            "fp16 here; until one beats it, fp16 is the fast path there); use mode balanced"
        )
    if not torch.backends.quantized.supported_engines or torch.backends.quantized.supported_engines == ["none"]:
        return "this torch build has no quantized CPU kernels (fbgemm, oneDNN or qnnpack); use mode balanced"
    return None


def quantize_linear_layers(module: torch.nn.Module) -> int:
    """Swap every Linear of ``module`` for its dynamic int8 version in place; return how many were swapped."""
    before = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
    with warnings.catch_warnings():
        # torch.ao says on every call that it and its quantized tensors are deprecated; the pinned torch still
        # ships them (see the module's note). Other warnings pass.
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings(
            "ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel", category=UserWarning
        )
        torch.ao.quantization.quantize_dynamic(module, _PER_CHANNEL, dtype=torch.qint8, inplace=True)  # type: ignore[no-untyped-call]
    after = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
    own_memory(module)
    gc.collect()
    give_back_freed_memory()
    return before - after


def own_memory(module: torch.nn.Module) -> None:
    """Copy ``module``'s remaining parameters and buffers out of the weights file they were mapped from.

    The loader maps the weights file, and the file stays mapped while any tensor of it lives: the norms left
    behind would keep the fp32 Linear weights that quantizing read resident (as file pages) for good.
    """
    with torch.no_grad():
        for layer in module.modules():
            for parameter in layer.parameters(recurse=False):
                parameter.data = parameter.data.clone()
            for name, buffer in list(layer.named_buffers(recurse=False)):
                kept = name not in layer._non_persistent_buffers_set
                layer.register_buffer(name, buffer.clone(), persistent=kept)


def quantized_bytes(module: torch.nn.Module) -> int:
    """Return the bytes of ``module``'s int8 Linear weights and their biases (packed: not among its parameters)."""
    total = 0
    for layer in module.modules():
        if isinstance(layer, torch.ao.nn.quantized.dynamic.Linear):
            weight, bias = layer._weight_bias()  # type: ignore[no-untyped-call]
            total += weight.numel() * weight.element_size()
            total += 0 if bias is None else bias.numel() * bias.element_size()
    return total


def give_back_freed_memory() -> None:
    """Ask glibc to return the fp32 weights' freed pages to the system, so the host's resident memory shows it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
