"""Whole-model conversion: nn.Linear layers -> bitblas.Linear, from float weights or checkpoints.

Every conversion is done in two phases: all new layers are built and loaded first (any error names
the layer and leaves the model untouched), then they are swapped in.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..formats import get_format
from ..quantization.quantize import QuantizedWeight
from ..quantization.search import METHODS
from .checkpoint import from_compressed_tensors
from .linear import Linear

__all__ = ["QuantizationConfig", "quantize_model", "load_gptq_model", "load_awq_model",
           "load_compressed_tensors_model", "find_linear_layers", "check_state_dict"]

logger = logging.getLogger(__name__)

_TORCH_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


@dataclass(frozen=True)
class QuantizationConfig:
    """How :func:`quantize_model` builds each ``bitblas.Linear``.

    ``A_dtype=None``: each layer's weight dtype (float16, bfloat16 or float32). ``with_scaling=None``:
    True for quantized formats. ``with_zeros=None``: True for unsigned integer formats with scales
    (uint8/4/2/1: asymmetric min/max quantization, so negative weights are represented), False
    otherwise (signed formats are symmetric). ``group_size`` -1: per output channel. Integer /
    float8 ``A_dtype`` quantizes activations per token inside the layer (e.g. BitNet:
    A_dtype="int8", W_dtype="int2"). ``method``: how float weights are quantized
    (:func:`bitblas.quantization.quantize_weight`): "mse" (default; per group, the clipped or
    least-squares-refitted scale and zero point with the smallest squared error, never worse than
    round-to-nearest) or "rtn" (plain round-to-nearest, absmax / min-max).
    """

    W_dtype: str = "uint4"
    A_dtype: Optional[str] = None
    group_size: int = 128
    with_scaling: Optional[bool] = None
    with_zeros: Optional[bool] = None
    zeros_mode: str = "original"
    out_dtype: Optional[str] = None
    opt_M: Optional[Tuple[int, ...]] = Linear.opt_M
    method: str = "mse"

    def __post_init__(self):
        get_format(self.W_dtype, "W", "W_dtype")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is invalid; accepted: {', '.join(map(repr, METHODS))}")
        if self.A_dtype is not None:
            get_format(self.A_dtype, "A", "A_dtype")
        if isinstance(self.opt_M, list):
            object.__setattr__(self, "opt_M", tuple(self.opt_M))

    @classmethod
    def from_dict(cls, d: Mapping) -> "QuantizationConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - fields)
        if bad:
            raise ValueError(f"config: unknown field(s) {bad}; accepted: {sorted(fields)}")
        return cls(**d)

    def linear_kwargs(self, layer: nn.Linear) -> dict:
        a = self.A_dtype
        if a is None:
            a = _TORCH_NAMES.get(layer.weight.dtype)
            if a is None:
                raise ValueError(f"weight dtype {layer.weight.dtype} has no bitblas activation format; set A_dtype")
        return dict(A_dtype=a, W_dtype=self.W_dtype, group_size=self.group_size, with_scaling=self.with_scaling,
                    with_zeros=self.zeros_default(), zeros_mode=self.zeros_mode, out_dtype=self.out_dtype,
                    opt_M=self.opt_M)

    def zeros_default(self) -> bool:
        """``with_zeros``, or for None: True for unsigned integer formats with scales."""
        if self.with_zeros is not None:
            return bool(self.with_zeros)
        return get_format(self.W_dtype).kind == "uint" and self.with_scaling is not False


def _as_config(config) -> QuantizationConfig:
    if config is None:
        return QuantizationConfig()
    if isinstance(config, QuantizationConfig):
        return config
    if isinstance(config, Mapping):
        return QuantizationConfig.from_dict(config)
    raise TypeError(f"config: expected a bitblas.nn.QuantizationConfig or a dict, got {type(config).__name__}")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(name == p or name.endswith("." + p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def find_linear_layers(model: nn.Module, skip: Iterable[str] = ()) -> List[Tuple[str, nn.Linear]]:
    """(name, module) of every plain ``nn.Linear`` in ``model`` not matched by ``skip`` (exact names,
    name suffixes such as "lm_head", or fnmatch patterns such as "*.mlp.*")."""
    skip = list(skip)
    return [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear and not _matches(n, skip)]


_HF_RECORDER: List = []      # bitblas.hf.record_config, handed in by bitblas/__init__.py (set_hf_recorder)


def set_hf_recorder(fn) -> None:
    """``fn(model)`` records the quantization_config of a converted transformers model (bitblas.hf's
    record_config, wired by bitblas/__init__.py: nn sits below the transformers integration)."""
    _HF_RECORDER[:] = [fn]


def _record_hf_config(model: nn.Module):
    """A transformers model (transformers already imported): record the bitblas quantization_config on
    ``model.config``, so that ``save_pretrained`` / ``from_pretrained`` round-trip (bitblas.hf)."""
    if "transformers" not in sys.modules or not hasattr(getattr(model, "config", None), "to_dict"):
        return
    if not type(model).__module__.startswith("transformers."):
        return
    for fn in _HF_RECORDER:
        fn(model)


def swap_modules(model: nn.Module, replacements: Dict[str, nn.Module]):
    for name, new in replacements.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    if replacements and not getattr(model, "_bitblas_checked_load", False):
        model.register_load_state_dict_pre_hook(_check_before_load)
        model._bitblas_checked_load = True


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], prefix: str = ""):
    """Check every bitblas layer's tensors in ``state_dict`` (format, shapes, dtypes) against ``model``
    without loading anything; raises naming the first bad key."""
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            m.check_state_dict(state_dict, f"{prefix}{name}." if name else prefix)


def _check_before_load(module, state_dict, prefix, *args):
    """Pre-hook of converted models: ``model.load_state_dict`` checks all bitblas layers before the
    first tensor is copied, so a bad checkpoint leaves the model as it was."""
    check_state_dict(module, state_dict, prefix)


def new_linear(layer: nn.Linear, kwargs: dict, target) -> Linear:
    """A bitblas.Linear shaped like ``layer``, its buffers on ``layer``'s device (meta for a meta skeleton)."""
    return Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, target=target,
                  device=layer.weight.device, **kwargs)


def _load_prequantized(new: Linear, q, layer_bias):
    """Load pre-quantized tensors; the float layer's bias unless they bring their own."""
    if isinstance(q, QuantizedWeight):
        new.load_and_transform_weight(q.codes, q.scale, q.zeros, layer_bias, global_scale=q.global_scale)
    elif isinstance(q, Mapping):
        q = dict(q)
        bias = q.pop("bias", None)
        if bias is None:
            bias = layer_bias
        if "qzeros" in q and "codes" not in q:
            fmt = q.pop("format", "gptq")
            if fmt == "awq":
                new.repack_from_awq(**q, bias=bias)
            elif fmt in ("gptq", "gptq_v2"):
                new.repack_from_gptq(**q, bias=bias, checkpoint_format=fmt)
            else:
                raise ValueError(f"format={fmt!r} is invalid; accepted: 'gptq', 'gptq_v2', 'awq'")
        else:
            unknown = sorted(set(q) - {"codes", "scale", "zeros", "global_scale"})
            if unknown or "codes" not in q:
                raise ValueError(f"expected keys codes (, scale, zeros, global_scale, bias) or GPTQ/AWQ's qweight, "
                                 f"qzeros, scales (, g_idx, bias, format); got {sorted(q)}")
            new.load_and_transform_weight(q["codes"], q.get("scale"), q.get("zeros"), bias,
                                          global_scale=q.get("global_scale"))
            return
    else:
        raise TypeError(f"expected a QuantizedWeight or a dict of tensors, got {type(q).__name__}")


@torch.no_grad()
def quantize_model(model: nn.Module, config=None, skip: Iterable[str] = ("lm_head",),
                   weights: Optional[Mapping[str, object]] = None, target=None,
                   skip_unsupported: bool = False, calibration=None, *, percdamp: float = 0.01,
                   act_order: bool = False) -> nn.Module:
    """Replace every plain ``nn.Linear`` of ``model`` (in place) by a ``bitblas.Linear``; returns ``model``.

    ``config``: a :class:`QuantizationConfig` or a dict of its fields. ``skip``: layers left as they
    are (names, suffixes or fnmatch patterns; default: "lm_head"). ``weights``: pre-quantized
    tensors by layer name, each a :class:`~bitblas.quantization.QuantizedWeight`, a dict
    ``{"codes", "scale", "zeros", "global_scale", "bias"}``, or a GPTQ / AWQ layer's tensors
    ``{"qweight", "qzeros", "scales", "g_idx", "bias", "format": "gptq" | "gptq_v2" | "awq"}``;
    other layers are quantized from their float weights (``config.method``). New layers live on each old
    layer's device. A layer on the meta device (a skeleton, e.g. built under ``torch.device("meta")``)
    becomes a bitblas layer with meta buffers, to be filled by ``load_state_dict(..., assign=True)``.

    ``skip_unsupported=True``: layers the config cannot take (e.g. ``in_features`` 1376 with
    ``group_size=128``) stay float; they are listed in a warning and in
    ``model.bitblas_skipped_layers`` (name -> reason). Otherwise such a layer raises, naming it.
    Nothing changes unless every (other) layer converts.

    ``calibration``: quantize with GPTQ error compensation (:mod:`bitblas.nn.calibrate`) against the
    inputs each layer sees when the model runs on it: input ids (a tensor, one forward), a list of
    batches (tensors, dicts of keyword arguments or tuples of positional arguments), or a callable
    ``f(model)`` that runs the model. Layer by layer in the order the model runs them, each seeing the
    already quantized layers before it. ``percdamp`` (dampening, a fraction of the Hessian's mean
    diagonal) and ``act_order`` (columns by decreasing input energy; the plain per-group layout is
    kept) apply only with ``calibration``. Without it, each layer is quantized from its weights alone.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    cfg = _as_config(config)
    if calibration is None and (act_order is not False or percdamp != 0.01):
        raise ValueError("percdamp / act_order apply to calibrated quantization only; pass calibration=...")
    if calibration is not None:
        from ..quantization.gptq import check_options
        from .calibrate import calibration_runner
        check_options(percdamp, act_order=act_order)
        calibration_runner(calibration)         # checks its type before any work
    skip = [skip] if isinstance(skip, str) else list(skip)
    layers = find_linear_layers(model, skip)
    weights = dict(weights or {})
    names = {n for n, _ in layers}
    unknown = sorted(set(weights) - names)
    if unknown:
        raise ValueError(f"weights given for {unknown}, which are not nn.Linear layers of the model (or are skipped)")
    replacements: Dict[str, Linear] = {}
    skipped: Dict[str, str] = {}
    calibrated: List[str] = []
    for name, layer in layers:
        try:
            new = new_linear(layer, cfg.linear_kwargs(layer), target)
        except (ValueError, NotImplementedError) as e:
            if skip_unsupported and name not in weights:
                skipped[name] = str(e)
                continue
            raise type(e)(f"layer {name!r}: {e}") from e
        try:
            if name in weights:
                _load_prequantized(new, weights[name], layer.bias)
            elif calibration is not None:
                if layer.weight.is_meta:
                    raise ValueError("calibration needs the float weights, but this layer is on the meta device")
                calibrated.append(name)
            elif not layer.weight.is_meta:
                new.load_and_transform_weight(layer.weight, bias=layer.bias, method=cfg.method)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise type(e)(f"layer {name!r}: {e}") from e
        replacements[name] = new
    if calibrated:
        from .calibrate import quantize_calibrated
        quantize_calibrated(model, dict(layers), replacements, calibrated,
                            [n for n in replacements if n in weights], cfg, calibration, percdamp, act_order)
    swap_modules(model, replacements)
    if skipped:
        listed = "; ".join(f"{n} ({r})" for n, r in skipped.items())
        warnings.warn(f"quantize_model: {len(skipped)} layer(s) the config does not support stay float: {listed}",
                      UserWarning, stacklevel=3)
    if skipped or skip_unsupported:
        model.bitblas_skipped_layers = dict(skipped)
    if replacements:
        _record_hf_config(model)
    logger.info("quantize_model: replaced %d linear layers (%s)%s", len(replacements), cfg.W_dtype,
                f", {len(skipped)} left float" if skipped else "")
    return model


def _load_checkpoint_model(model, state_dict, fmt, bits, group_size, skip, linear_kwargs, target, strict):
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a mapping of tensors, got {type(state_dict).__name__}")
    skip = [skip] if isinstance(skip, str) else list(skip)
    layers = [(n, m) for n, m in find_linear_layers(model, skip) if n + ".qweight" in state_dict]
    used = set()
    replacements: Dict[str, Linear] = {}
    for name, layer in layers:
        keys = ("qweight", "qzeros", "scales") + (("g_idx",) if fmt != "awq" else ())
        t = {k: state_dict.get(f"{name}.{k}") for k in keys}
        bias = state_dict.get(f"{name}.bias")
        used.update(f"{name}.{k}" for k in keys + ("bias",))
        try:
            if t["qzeros"] is None or t["scales"] is None:
                raise ValueError(f"the checkpoint has {name}.qweight but no {name}.qzeros / {name}.scales")
            kw = dict(dict(A_dtype=_TORCH_NAMES.get(layer.weight.dtype, "float16"), zeros_mode="original"),
                      **(linear_kwargs or {}))
            new = new_linear(layer, dict(kw, W_dtype=f"uint{bits}", group_size=group_size, with_scaling=True,
                                          with_zeros=True), target)
            if fmt == "awq":
                new.repack_from_awq(qweight=t["qweight"], qzeros=t["qzeros"], scales=t["scales"], bias=bias)
            else:
                new.repack_from_gptq(qweight=t["qweight"], qzeros=t["qzeros"], scales=t["scales"], g_idx=t["g_idx"],
                                     bias=bias, checkpoint_format=fmt)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise type(e)(f"layer {name!r}: {e}") from e
        replacements[name] = new
    return _finish_load(model, state_dict, used, replacements, strict, fmt)


def _finish_load(model, state_dict, used, replacements, strict, fmt):
    """Check the checkpoint's other tensors against the model, swap the new layers in, load the rest."""
    rest = {k: v for k, v in state_dict.items() if k not in used}
    # check the remaining tensors against the model before anything changes
    own = model.state_dict()
    replaced_prefixes = tuple(n + "." for n in replacements)
    own = {k: v for k, v in own.items() if not k.startswith(replaced_prefixes)}
    unexpected = sorted(k for k in rest if k not in own)
    if unexpected and strict:
        more = " ..." if len(unexpected) > 8 else ""
        raise ValueError(f"state_dict has keys the model does not: {unexpected[:8]}{more}"
                         " (a quantized layer the model lacks, or one in skip?)")
    for k, v in rest.items():
        if k in own and isinstance(v, torch.Tensor) and v.shape != own[k].shape:
            raise ValueError(f"{k}: checkpoint shape {list(v.shape)} != model shape {list(own[k].shape)}")
    missing = sorted(k for k in own if k not in rest)
    if missing and strict:
        raise ValueError(f"state_dict lacks keys of the model: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    swap_modules(model, replacements)
    model.load_state_dict({k: v for k, v in rest.items() if k in own}, strict=False)
    _record_hf_config(model)
    logger.info("loaded %s checkpoint: %d quantized layers", fmt, len(replacements))
    return model


@torch.no_grad()
def load_gptq_model(model: nn.Module, state_dict: Mapping[str, torch.Tensor], bits: int = 4,
                    group_size: int = 128, checkpoint_format: str = "gptq", skip: Iterable[str] = (),
                    linear_kwargs: Optional[dict] = None, target=None, strict: bool = True) -> nn.Module:
    """Load a GPTQ checkpoint into a float model built with the same architecture (in place).

    Every ``nn.Linear`` whose ``<name>.qweight`` is in ``state_dict`` becomes a ``bitblas.Linear``
    (uint``bits``, ``group_size``, act-order ``g_idx`` supported); the other tensors (embeddings,
    norms, an unquantized lm_head) are loaded as usual. ``checkpoint_format``: "gptq" (zeros stored
    minus 1) or "gptq_v2". All shapes are checked before the model changes.
    """
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"checkpoint_format={checkpoint_format!r} is invalid; accepted: 'gptq', 'gptq_v2'")
    return _load_checkpoint_model(model, state_dict, checkpoint_format, bits, group_size, skip, linear_kwargs,
                                  target, strict)


@torch.no_grad()
def load_awq_model(model: nn.Module, state_dict: Mapping[str, torch.Tensor], bits: int = 4, group_size: int = 128,
                   skip: Iterable[str] = (), linear_kwargs: Optional[dict] = None, target=None,
                   strict: bool = True) -> nn.Module:
    """Load an AutoAWQ (GEMM) checkpoint into a float model of the same architecture (in place)."""
    return _load_checkpoint_model(model, state_dict, "awq", bits, group_size, skip, linear_kwargs, target, strict)


_CT_KEYS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")


def _ct_bits(packed: torch.Tensor, K: int, name: str) -> int:
    fits = [b for b in (1, 2, 4, 8) if packed.shape[-1] == -(-K * b // 32)]
    if len(fits) != 1:
        raise ValueError(f"{name}.weight_packed of shape {list(packed.shape)} does not tell the bit width for "
                         f"in_features={K}; pass quantization_config (its config_groups give num_bits)")
    return fits[0]


def _ct_schemes(quantization_config) -> List[Tuple[List[str], dict]]:
    """(targets, weights args) of every config group of a compressed-tensors ``quantization_config``."""
    if quantization_config is None:
        return []
    if not isinstance(quantization_config, Mapping):
        raise TypeError(f"quantization_config: expected the checkpoint's quantization_config dict, got "
                        f"{type(quantization_config).__name__}")
    fmt = quantization_config.get("format", "pack-quantized")
    out = []
    for gname, group in (quantization_config.get("config_groups") or {}).items():
        w = dict(group.get("weights") or {})
        gfmt = group.get("format") or fmt
        if gfmt != "pack-quantized":
            raise NotImplementedError(f"quantization_config: config group {gname!r} has format {gfmt!r}; "
                                      "supported: 'pack-quantized'")
        if w.get("type", "int") != "int":
            raise NotImplementedError(f"quantization_config: config group {gname!r} has weights of type "
                                      f"{w.get('type')!r}; supported: 'int'")
        if group.get("input_activations"):
            raise NotImplementedError(f"quantization_config: config group {gname!r} quantizes activations; "
                                      "supported: weight-only schemes (W4A16, W8A16)")
        out.append((list(group.get("targets") or []), w))
    return out


def _ct_match(name: str, module: nn.Module, targets: Sequence[str]) -> bool:
    import re
    for t in targets:
        if t.startswith("re:"):
            if re.match(t[3:], name):
                return True
        elif t == type(module).__name__ or t == name or name.endswith("." + t):
            return True
    return False


@torch.no_grad()
def load_compressed_tensors_model(model: nn.Module, state_dict: Mapping[str, torch.Tensor],
                                  quantization_config: Optional[Mapping] = None, skip: Iterable[str] = (),
                                  linear_kwargs: Optional[dict] = None, target=None,
                                  strict: bool = True) -> nn.Module:
    """Load a compressed-tensors ``pack-quantized`` checkpoint (llm-compressor W4A16 / W8A16, int weights,
    group or channel scales, symmetric or with zero points, act-order ``weight_g_idx``) into a float model
    of the same architecture (in place).

    Every ``nn.Linear`` whose ``<name>.weight_packed`` is in ``state_dict`` becomes a ``bitblas.Linear``:
    ``int{bits}`` with scales for symmetric schemes, ``uint{bits}`` with zero points otherwise. Bits and
    group size are read from the tensors; ``quantization_config`` (the checkpoint's
    ``config.json["quantization_config"]``) is checked against them. All shapes are checked before
    the model changes.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a mapping of tensors, got {type(state_dict).__name__}")
    schemes = _ct_schemes(quantization_config)
    skip = [skip] if isinstance(skip, str) else list(skip)
    layers = [(n, m) for n, m in find_linear_layers(model, skip) if n + ".weight_packed" in state_dict]
    used = set()
    replacements: Dict[str, Linear] = {}
    for name, layer in layers:
        t = {k: state_dict.get(f"{name}.{k}") for k in _CT_KEYS}
        bias = state_dict.get(f"{name}.bias")
        used.update(f"{name}.{k}" for k in _CT_KEYS + ("bias",))
        try:
            if t["weight_scale"] is None:
                raise ValueError(f"the checkpoint has {name}.weight_packed but no {name}.weight_scale")
            K = layer.in_features
            bits = _ct_bits(t["weight_packed"], K, name)
            scheme = next((w for targets, w in schemes if _ct_match(name, layer, targets)), None)
            if schemes and scheme is None:
                raise ValueError("no config group of quantization_config targets this layer")
            if scheme is not None and scheme.get("num_bits", bits) != bits:
                raise ValueError(f"quantization_config says num_bits={scheme.get('num_bits')}, but "
                                 f"weight_packed holds {bits}-bit values")
            ws = t["weight_scale"]
            groups = ws.shape[-1] if ws.dim() == 2 else 1
            gs = -1 if groups == 1 else K // max(groups, 1)
            imp = from_compressed_tensors(t["weight_packed"], ws, t["weight_shape"], t["weight_zero_point"],
                                          t["weight_g_idx"], bits=bits, in_features=K,
                                          out_features=layer.out_features, group_size=gs)
            symmetric = t["weight_zero_point"] is None
            kw = dict(dict(A_dtype=_TORCH_NAMES.get(layer.weight.dtype, "float16")), **(linear_kwargs or {}))
            kw.update(W_dtype=f"{'int' if symmetric else 'uint'}{bits}", group_size=gs, with_scaling=True,
                      with_zeros=not symmetric)
            if not symmetric:
                kw.setdefault("zeros_mode", "original")
            new = new_linear(layer, kw, target)
            if symmetric:
                new.load_and_transform_weight((imp.codes.to(torch.int16) - (1 << (bits - 1))), imp.scale, None,
                                              bias)
                if imp.perm is not None:
                    new.load_state_dict({"perm": imp.perm}, strict=False)
            else:
                new.load_imported(imp, bias)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise type(e)(f"layer {name!r}: {e}") from e
        replacements[name] = new
    return _finish_load(model, state_dict, used, replacements, strict, "compressed-tensors")
