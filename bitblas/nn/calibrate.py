"""``quantize_model(..., calibration=...)``: GPTQ-style calibrated quantization of a whole model.

Sequential, layer by layer in the order the model runs them (GPTQ's "true sequential" order): the
layers are grouped into stages, a stage being consecutive layers that take the very same input
tensor (q/k/v projections, gate/up projections); for each stage in turn the calibration data runs
through the model, whose earlier layers already compute with their quantized weights, forward
pre-hooks collect each stage layer's input Hessian ``2 X^T X / n`` (float32, K x K, one per layer
of the stage, freed after it), and the stage's layers are quantized by
:func:`bitblas.quantization.gptq.gptq_quantize_weight`. When each forward runs every layer once in
the same order and the data is given as tensors / batches, a pass stops right after the stage's
layers (a callable runs whole passes). While calibrating, the float layers hold their dequantized
weights; the original weights are restored before the bitblas layers are swapped in (or on error).
"""
from __future__ import annotations

import logging
import time
import warnings
from typing import Callable, Dict, List, Mapping, Tuple

import torch
import torch.nn as nn

from ..quantization.gptq import HessianAccumulator, gptq_quantize_weight
from ..quantization.quantize import TORCH_DTYPES
from .linear import Linear

logger = logging.getLogger(__name__)

__all__ = ["calibration_runner", "quantize_calibrated"]


class _Stop(Exception):
    """Raised by a hook to end a calibration pass once the layers it is for have run."""


def _device_of(model: nn.Module):
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _call(model: nn.Module, batch, dev):
    if isinstance(batch, torch.Tensor):
        return model(batch.to(dev))
    if isinstance(batch, Mapping):
        return model(**{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return model(*(v.to(dev) if isinstance(v, torch.Tensor) else v for v in batch))
    raise TypeError(f"calibration: a batch must be a tensor, a dict of model keyword arguments or a tuple of "
                    f"positional arguments, got {type(batch).__name__}")


def calibration_runner(calibration) -> Tuple[Callable[[nn.Module, bool], None], bool]:
    """(run(model, stoppable), batched) for ``calibration``: a tensor (e.g. input ids [B, T]; one
    forward), a non-empty list / tuple of batches (tensors, dicts of keyword arguments, tuples of
    positional arguments; one forward each), or a callable ``f(model)`` that runs the model itself."""
    if isinstance(calibration, torch.Tensor):
        batches = [calibration]
    elif isinstance(calibration, (list, tuple)):
        batches = list(calibration)
        if not batches:
            raise ValueError("calibration: an empty list of batches")
        for b in batches:
            if not isinstance(b, (torch.Tensor, Mapping, tuple, list)):
                raise TypeError(f"calibration: a batch must be a tensor, a dict of model keyword arguments or a "
                                f"tuple of positional arguments, got {type(b).__name__}")
    elif callable(calibration):
        def run_callable(model, stoppable):
            calibration(model)
        return run_callable, False
    else:
        raise TypeError(f"calibration: expected input ids (a tensor), a list of batches or a callable f(model), "
                        f"got {type(calibration).__name__}")
    if any(isinstance(b, torch.Tensor) and b.numel() == 0 for b in batches):
        raise ValueError("calibration: a batch has no elements")

    def run(model, stoppable):
        dev = _device_of(model)
        for b in batches:
            try:
                _call(model, b, dev)
            except _Stop:
                if not stoppable:
                    raise
    return run, True


def _input(args, kwargs):
    """The input of an nn.Linear call (positional, or the keyword ``input``)."""
    return args[0] if args else kwargs.get("input")


def _record(model: nn.Module, layers: Dict[str, nn.Linear], run) -> Tuple[List[List[str]], bool]:
    """Run the calibration once (float model): the stages, in order, and whether every forward pass
    calls each layer once in the same order (then a pass may stop after a stage)."""
    calls: List[str] = []
    same: List[bool] = []
    prev = [None]

    def hook(name):
        def pre(module, args, kwargs):
            x = _input(args, kwargs)
            same.append(x is not None and x is prev[0])
            prev[0] = x
            calls.append(name)
        return pre

    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in layers.items()]
    try:
        run(model, False)
    finally:
        for h in handles:
            h.remove()
        prev[0] = None
    first: Dict[str, int] = {}
    for i, n in enumerate(calls):
        first.setdefault(n, i)
    order = sorted(first, key=first.get)
    stages: List[List[str]] = []
    for n in order:
        i = first[n]
        if stages and same[i] and i > 0 and calls[i - 1] == stages[-1][-1]:
            stages[-1].append(n)
        else:
            stages.append([n])
    period = len(order)
    repeats = bool(calls) and len(calls) % period == 0 and all(
        calls[i] == order[i % period] for i in range(len(calls)))
    return stages, repeats


@torch.no_grad()
def quantize_calibrated(model: nn.Module, float_layers: Dict[str, nn.Linear], new: Dict[str, Linear],
                        names: List[str], prequantized: List[str], cfg, calibration, percdamp: float = 0.01,
                        act_order: bool = False):
    """Load GPTQ-quantized weights of the float layers ``names`` into their bitblas layers ``new[name]``,
    running ``calibration`` through ``model``. ``prequantized``: layers whose bitblas layer is already
    loaded; they compute with its weights during calibration. The float layers' weights are as they
    were on return (also on error)."""
    run, batched = calibration_runner(calibration)
    originals: Dict[str, torch.Tensor] = {}

    def use_quantized(name):
        layer = float_layers[name]
        originals.setdefault(name, layer.weight.data)
        layer.weight.data = new[name].dequantized_weight().to(device=layer.weight.device, dtype=layer.weight.dtype)

    t0 = time.perf_counter()
    try:
        for name in prequantized:
            use_quantized(name)
        todo = {n: float_layers[n] for n in names}
        stages, repeats = _record(model, todo, run)
        stoppable = batched and repeats
        for si, stage in enumerate(stages):
            accs = {n: HessianAccumulator(todo[n].in_features, todo[n].weight.device) for n in stage}

            def collect(name):
                def pre(module, args, kwargs):
                    accs[name].add(_input(args, kwargs))
                return pre

            def stop(module, args):
                raise _Stop()

            handles = [todo[n].register_forward_pre_hook(collect(n), with_kwargs=True) for n in stage]
            if stoppable and si + 1 < len(stages):
                handles.append(todo[stages[si + 1][0]].register_forward_pre_hook(stop))
            try:
                run(model, stoppable)
            finally:
                for h in handles:
                    h.remove()
            for n in stage:
                layer, bl = todo[n], new[n]
                t = time.perf_counter()
                acc = accs.pop(n)
                if acc.n == 0:
                    raise RuntimeError(f"layer {n!r}: the calibration did not reach it in stage {si}")
                samples, H = acc.n, acc.hessian()
                del acc
                c = bl.config
                plan = bl._plan
                sd = TORCH_DTYPES["float32" if plan.scale_dtype in (None, "float8_e4m3") else plan.scale_dtype]
                q = gptq_quantize_weight(layer.weight.detach(), H, c.W_dtype, c.group_size, c.with_scaling,
                                         c.with_zeros, c.zeros_mode, scale_dtype=sd, method=cfg.method,
                                         percdamp=percdamp, act_order=act_order)
                del H
                try:
                    bl.load_and_transform_weight(q.codes, q.scale, q.zeros, layer.bias, global_scale=q.global_scale)
                except (ValueError, TypeError, NotImplementedError) as e:
                    raise type(e)(f"layer {n!r}: {e}") from e
                use_quantized(n)
                logger.info("quantize_model: %s quantized with calibration (%d samples) in %.2f s", n, samples,
                            time.perf_counter() - t)
        unseen = [n for n in names if n not in {m for st in stages for m in st}]
        for n in unseen:        # never called by the calibration: quantized from the weights alone
            layer = float_layers[n]
            new[n].load_and_transform_weight(layer.weight, bias=layer.bias, method=cfg.method)
        if unseen:
            warnings.warn(f"quantize_model: the calibration never ran {len(unseen)} layer(s), quantized without it: "
                          f"{', '.join(unseen)}", UserWarning, stacklevel=3)
    finally:
        for name, w in originals.items():
            float_layers[name].weight.data = w
    logger.info("quantize_model: %d layers calibrated in %d stages, %.1f s", len(names), len(stages),
                time.perf_counter() - t0)
