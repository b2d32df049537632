"""Hugging Face transformers integration: ``BitBLASConfig`` and its quantizer (``pip install "bitblas[hf]"``).

Importing this module registers ``quant_method="bitblas"`` with transformers through its public API
for external quantizers (``transformers.quantizers.register_quantization_config`` /
``register_quantizer``)::

    from transformers import AutoModelForCausalLM
    from bitblas.hf import BitBLASConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16,
                                                 quantization_config=BitBLASConfig(W_dtype="uint4", group_size=128))
    model.save_pretrained(out)          # config.json records the quantization_config
    model = AutoModelForCausalLM.from_pretrained(out)    # bitblas layers, packed tensors loaded as saved

Quantize on load: the model is built on the meta device, and each ``nn.Linear`` weight is quantized
(:func:`bitblas.quantize_model`'s rules and ``method``) as it is read from the checkpoint, so the
float model is never materialized whole. Loading a saved bitblas model builds the ``bitblas.Linear``
skeletons first and hands each layer its tensors through the layer's own ``load_state_dict`` (format
record checked, packed tensors taken as they are). A fresh process needs ``import bitblas.hf`` before
``from_pretrained`` of a saved folder, so that transformers knows the quant method.

Quantizing on load sees one weight at a time, so it is weight-only (``method``); calibrated (GPTQ-style)
quantization needs the float model and data: ``bitblas.quantize_model(model, config, calibration=ids)``
(``BitBLASConfig(dataset=...)`` raises, saying so). The result saves and reloads like any bitblas model.
"""
from __future__ import annotations

import logging
import warnings
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from transformers.core_model_loading import ConversionOps, WeightConverter
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING
from transformers.quantizers.quantizers_utils import should_convert_module
from transformers.utils.quantization_config import QuantizationConfigMixin

from .formats import get_format
from .nn.convert import QuantizationConfig, find_linear_layers, new_linear, quantize_model, swap_modules
from .nn.linear import Linear

__all__ = ["BitBLASConfig", "BitBLASHfQuantizer", "QUANT_METHOD", "record_config"]

logger = logging.getLogger(__name__)

QUANT_METHOD = "bitblas"
_FIELDS = ("W_dtype", "A_dtype", "group_size", "with_scaling", "with_zeros", "zeros_mode", "out_dtype", "method")


class BitBLASConfig(QuantizationConfigMixin):
    """transformers quantization config for bitblas layers.

    The bitblas fields are :class:`bitblas.nn.QuantizationConfig`'s (``W_dtype``, ``A_dtype``,
    ``group_size``, ``with_scaling``, ``with_zeros``, ``zeros_mode``, ``out_dtype``, ``method``; the
    same defaults: uint4, group 128, zero points on for unsigned formats, method "mse").
    ``modules_to_not_convert``: module names or patterns left float (transformers' matching; None:
    the output embedding / tied and last modules, i.e. ``lm_head``). ``skip_unsupported``: layers
    the format cannot take (e.g. in_features not a multiple of group_size) stay float instead of
    raising.
    """

    def __init__(self, W_dtype: str = "uint4", A_dtype: Optional[str] = None, group_size: int = 128,
                 with_scaling: Optional[bool] = None, with_zeros: Optional[bool] = None,
                 zeros_mode: str = "original", out_dtype: Optional[str] = None,
                 modules_to_not_convert: Optional[List[str]] = None, skip_unsupported: bool = False,
                 method: str = "mse", **kwargs):
        kwargs.pop("quant_method", None)
        calib = sorted(set(kwargs) & {"dataset", "calibration", "calibration_dataset"})
        if calib:
            raise ValueError(f"BitBLASConfig: {calib[0]!r} is not a field: quantizing on load reads one weight at a "
                             "time and cannot run calibration data through the model; load the float model and "
                             "call bitblas.quantize_model(model, config, calibration=...) (GPTQ-style)")
        if kwargs:
            raise ValueError(f"BitBLASConfig: unknown field(s) {sorted(kwargs)}; accepted: "
                             f"{sorted(_FIELDS + ('modules_to_not_convert', 'skip_unsupported'))}")
        self.quant_method = QUANT_METHOD
        self.W_dtype, self.A_dtype, self.group_size = W_dtype, A_dtype, group_size
        self.with_scaling, self.with_zeros, self.zeros_mode, self.out_dtype = with_scaling, with_zeros, zeros_mode, \
            out_dtype
        self.method = method
        if modules_to_not_convert is not None and (isinstance(modules_to_not_convert, str) or not all(
                isinstance(m, str) for m in modules_to_not_convert)):
            raise TypeError(f"modules_to_not_convert: expected a list of module names, got {modules_to_not_convert!r}")
        self.modules_to_not_convert = None if modules_to_not_convert is None else list(modules_to_not_convert)
        self.skip_unsupported = bool(skip_unsupported)
        self.post_init()

    def post_init(self):
        self.bitblas_config()                   # every value checked, errors name the field

    def bitblas_config(self) -> QuantizationConfig:
        """The :class:`bitblas.nn.QuantizationConfig` of these fields."""
        return QuantizationConfig(**{f: getattr(self, f) for f in _FIELDS})


class _Quantize(ConversionOps):
    """Quantize on load: an ``nn.Linear``'s float weight becomes its bitblas layer, swapped in."""

    def __init__(self, hf_quantizer: "BitBLASHfQuantizer"):
        self.hf_quantizer = hf_quantizer

    def __deepcopy__(self, memo):
        return self

    def convert(self, input_dict, model=None, full_layer_name=None, missing_keys=None, **kwargs):
        (key, values), = input_dict.items()
        weight = values[0] if isinstance(values, list) else values
        name = full_layer_name.rpartition(".")[0]
        new = self.hf_quantizer._pending.pop(name)
        old = model.get_submodule(name)
        bias = old.bias if old.bias is not None and not old.bias.is_meta else None
        try:
            new.load_and_transform_weight(weight, bias=bias, method=self.hf_quantizer.quantization_config.method)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise type(e)(f"layer {name!r}: {e}") from e
        new._is_hf_initialized = True
        swap_modules(model, {name: new})
        if missing_keys is not None:
            missing_keys.discard(full_layer_name)
        return {}


def _load_layer(name: str, layer, state: dict) -> None:
    """``layer.load_state_dict(state)`` (assigning, format record checked), errors naming the layer."""
    try:
        result = layer.load_state_dict(state, strict=False, assign=True)
    except (ValueError, TypeError, RuntimeError) as e:
        raise type(e)(f"layer {name!r}: {e}") from e
    if result.unexpected_keys:
        raise ValueError(f"layer {name!r}: unexpected tensors {result.unexpected_keys}")


class _Deserialize(ConversionOps):
    """Load a saved bitblas layer: all its tensors (those a plain ``nn.Linear`` does not have) go
    through the layer's own ``load_state_dict`` (format record checked, packed tensors assigned)."""

    def __init__(self, hf_quantizer: "BitBLASHfQuantizer"):
        self.hf_quantizer = hf_quantizer

    def __deepcopy__(self, memo):
        return self

    def convert(self, input_dict, model=None, full_layer_name=None, missing_keys=None, **kwargs):
        name = full_layer_name.rpartition(".")[0]
        layer = model.get_submodule(name)
        self.hf_quantizer._deserialized.add(name)
        state = {k.lstrip("."): (v[0] if isinstance(v, list) else v) for k, v in input_dict.items()}
        if not isinstance(layer, Linear) and set(state) != {"_extra_state"}:
            raise ValueError(f"{name}: the checkpoint holds bitblas tensors ({sorted(state)}) but the model's "
                             f"module is a {type(layer).__name__}")
        _load_layer(name, layer, state)
        layer._is_hf_initialized = True
        if missing_keys is not None:
            # a state without a format record is Microsoft BitBLAS's Linear's: the record is not missing
            for k in set(state) | {"_extra_state"}:
                missing_keys.discard(f"{name}.{k}")
        return {}


class BitBLASHfQuantizer(HfQuantizer):
    """The transformers quantizer of ``quant_method="bitblas"`` (see the module docstring)."""

    requires_calibration = False
    quantization_config: BitBLASConfig

    def __init__(self, quantization_config: BitBLASConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._pending: Dict[str, Linear] = {}
        self.serialized_names = {}
        self._skeletons: Dict[str, Dict[str, torch.Tensor]] = {}     # pre-quantized: each layer's meta buffers
        self._deserialized = set()                                   # layers _Deserialize loaded

    def validate_environment(self, *args, **kwargs):
        device_map = kwargs.get("device_map")
        if isinstance(device_map, dict) and "disk" in device_map.values():
            raise ValueError("bitblas: device_map with 'disk' offloading is not supported")

    @property
    def quantized_element_size(self) -> Optional[float]:
        fmt = get_format(self.quantization_config.W_dtype)
        return None if fmt.kind == "float" else fmt.bits / 8

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        if self.pre_quantized:
            return False
        name, _, tensor = param_name.rpartition(".")
        return tensor == "weight" and name in self._pending

    def _skip_names(self, model) -> List[str]:
        patterns = self.get_modules_to_not_convert(model, self.quantization_config.modules_to_not_convert,
                                                   getattr(model, "_keep_in_fp32_modules", None))
        return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and
                not should_convert_module(n, patterns)]

    def _process_model_before_weight_loading(self, model, **kwargs):
        cfg = self.quantization_config.bitblas_config()
        skip = self._skip_names(model)
        if self.pre_quantized:
            # the bitblas layers as they were saved (meta buffers), filled by _Deserialize
            quantize_model(model, cfg, skip=skip, skip_unsupported=self.quantization_config.skip_unsupported)
            names = set()
            for n, m in model.named_modules():
                if isinstance(m, Linear):
                    names |= set(m.state_dict(keep_vars=True)) | set(m._buffers)
                    self._skeletons[n] = {k: t for k, t in m._buffers.items() if t is not None}
            # the names a plain nn.Linear has load as usual; the others are collected per layer
            names -= {"weight", "bias"}
            if names:
                self.serialized_names = {"._extra_state": sorted("." + n for n in names)}
            return
        # quantize on load: build each layer's bitblas skeleton now (errors name the layer before any
        # weight is read); _Quantize fills and swaps it when the layer's float weight arrives
        skipped = {}
        for name, layer in find_linear_layers(model, skip):
            try:
                self._pending[name] = new_linear(layer, cfg.linear_kwargs(layer), None)
            except (ValueError, NotImplementedError) as e:
                if not self.quantization_config.skip_unsupported:
                    raise type(e)(f"layer {name!r}: {e}") from e
                skipped[name] = str(e)
        if skipped:
            warnings.warn(f"bitblas: {len(skipped)} layer(s) the config does not support stay float: "
                          + "; ".join(f"{n} ({r})" for n, r in skipped.items()), UserWarning, stacklevel=2)
        if not self._pending:
            logger.warning("bitblas: no nn.Linear layer of the model is quantized")

    def get_quantize_ops(self):
        return _Quantize(self)

    def get_weight_conversions(self):
        # transformers 5.24's HfQuantizer builds these from get_load_operations() and serialized_names;
        # 5.17's returns [] and knows neither, so its loader assigned the tensors without the layers' load
        # hook: built here for both (update_weight_conversions appends them in both)
        if not self.pre_quantized:
            return []
        return [WeightConverter(names, param, [_Deserialize(self)]) for param, names in self.serialized_names.items()]

    def _load_assigned(self, model):
        """Layers whose tensors transformers assigned itself instead of handing them to _Deserialize (a
        loader that does not run the quantizer's converters): their tensors and format record (kept by
        ``Linear.set_extra_state``) go through the layer's ``load_state_dict`` now, checked against the
        skeleton's shapes and converted once where the format asks (a ``bitblas.Linear/1`` or ``/2`` save)."""
        for name, skeleton in self._skeletons.items():
            layer = model.get_submodule(name)
            if not isinstance(layer, Linear):
                continue
            record = layer.pop_assigned_record()
            if name in self._deserialized:
                continue
            # transformers marks each tensor it assigned from the checkpoint (not the missing ones it allocated)
            state = {k: t for k, t in layer._buffers.items() if getattr(t, "_is_hf_initialized", False)}
            if record is not None:
                state["_extra_state"] = record
            if not state:
                continue
            layer._buffers.update({k: skeleton[k] for k in state if k in skeleton})
            _load_layer(name, layer, state)

    def _process_model_after_weight_loading(self, model, **kwargs):
        if self.pre_quantized:
            self._load_assigned(model)
        if self._pending:
            # layers whose weight the checkpoint did not hold (initialized by transformers): quantize now
            left = set(self._pending)
            self._pending.clear()
            others = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in left]
            quantize_model(model, self.quantization_config.bitblas_config(), skip=others)
        # the deserialize converter only loads; it has nothing to revert when the model is saved
        convs = getattr(model, "_weight_conversions", None)
        if convs:
            model._weight_conversions = [c for c in convs if not any(isinstance(op, _Deserialize)
                                                                       for op in getattr(c, "operations", ()))]
        return model

    def is_serializable(self) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def record_config(model: nn.Module) -> Optional[BitBLASConfig]:
    """Set ``model.config.quantization_config`` of a transformers model converted outside
    ``from_pretrained`` (``quantize_model``, ``load_gptq_model``, ...) to the :class:`BitBLASConfig` its
    bitblas layers share, so that ``save_pretrained`` records it and ``from_pretrained`` rebuilds them;
    the float ``nn.Linear`` layers are listed in ``modules_to_not_convert``. Returns the config, or
    None (with a warning) when the layers differ in format, which one config cannot describe."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    if not layers:
        return None
    kinds = set()
    for m in layers:
        a_float = get_format(m.A_dtype, "A", "A_dtype").kind == "float"
        kinds.add((m.W_dtype, None if a_float else m.A_dtype, m.group_size, m.with_scaling, m.with_zeros,
                   m.zeros_mode if m.with_zeros else "original", None if m.out_dtype == m.A_dtype else m.out_dtype))
    if len(kinds) != 1:
        warnings.warn(f"bitblas: the model's bitblas layers use {len(kinds)} different formats; save_pretrained "
                      "cannot record one quantization_config for them (from_pretrained would not rebuild them)",
                      UserWarning, stacklevel=3)
        return None
    (w, a, g, sc, z, zm, out), = kinds
    floats = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    qc = BitBLASConfig(W_dtype=w, A_dtype=a, group_size=g, with_scaling=sc, with_zeros=z, zeros_mode=zm,
                       out_dtype=out, modules_to_not_convert=floats)
    config.quantization_config = qc
    return qc


def _register():
    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD) is not BitBLASConfig:
        if QUANT_METHOD in AUTO_QUANTIZATION_CONFIG_MAPPING:
            raise RuntimeError(f"transformers already has a quant_method {QUANT_METHOD!r} "
                               f"({AUTO_QUANTIZATION_CONFIG_MAPPING[QUANT_METHOD].__name__}); bitblas.hf cannot "
                               "register its own")
        register_quantization_config(QUANT_METHOD)(BitBLASConfig)
    if AUTO_QUANTIZER_MAPPING.get(QUANT_METHOD) is not BitBLASHfQuantizer:
        if QUANT_METHOD in AUTO_QUANTIZER_MAPPING:
            raise RuntimeError(f"transformers already has a quantizer {QUANT_METHOD!r}; bitblas.hf cannot register "
                               "its own")
        register_quantizer(QUANT_METHOD)(BitBLASHfQuantizer)


_register()
