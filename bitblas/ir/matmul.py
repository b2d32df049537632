"""Lower a plan to one TensorIR function: decode/dequantize, matmul, epilogue.

Blocks (names the schedules rely on):
  ``B_decode`` [N, K]  the dequantized weight (codes -> values, scales and zeros applied where the
                       plan says), in ``plan.decode_dtype``;
  ``C``        [M, N]  the reduction over K, in ``plan.accum``;
  ``D``        [M, N]  the epilogue (per-channel / per-token / global scales, bias, output cast).
M is ``plan.m`` or the symbolic variable ``m``.

``fp8_values=True`` (float8 activations and weights; the fp8 tensor-core schedule): ``B_decode``
holds the weight's bit patterns (int8) and ``C`` multiplies the float8 values themselves
(``reinterpret`` of the bits, cast to float32) instead of looking the codes up in tables, the
form that schedule tensorizes into ``mma.sync`` e4m3 / e5m2. Integer weights of at most 4 bits
with float8_e4m3 activations: ``B_decode`` holds the e4m3 bit patterns of their values
(:func:`e4m3_bits`, exact).
"""
from __future__ import annotations

from tvm import te, tirx

from ..code_order import order_bits
from ..formats import FORMATS, Format
from ..plan import M_VAR, Plan

__all__ = ["emit_matmul", "e4m3_bits", "e4m3_codes", "decode_code", "slot_of", "decoded_weight", "scale_value", "zero_value", "placeholders"]


def slot_of(k, order):
    """The slot (in code units along the row) of code ``k`` of a weight whose 32-bit words hold
    their codes in ``order`` (``Plan.w_order``: code ``j`` of a word in slot ``order[j]``; every
    such order is a permutation of the bits of ``j``, so the slot is a sum of shifted bits)."""
    n, img = len(order), order_bits(order)
    # floordiv / floormod by constants (not shifts and masks): TVM's bound analysis then keeps a
    # thread's byte region to the words its codes lie in
    fdiv, fmod = ((lambda a, b: a // b), (lambda a, b: a % b)) if isinstance(k, int) else (tirx.floordiv,
                                                                                          tirx.floormod)
    slot = fdiv(k, n) * n
    for i, t in enumerate(img):
        slot = slot + fmod(fdiv(k, 1 << i), 2) * (1 << t)
    return slot


def decode_code(buf, row, k, fmt: Format, storage: str, order=None):
    """The integer code of element (row, k) of ``buf`` (codes packed along its last axis), as int32.

    ``storage`` (:func:`bitblas.formats.code_storage`): "offset" (the field minus 2**(bits-1)),
    "twos" (sign-extended two's complement), "plain" (the unsigned code / table index).
    ``order``: the code order inside each 32-bit word (``Plan.w_order``; None: natural).
    """
    bits = fmt.bits
    if fmt.packed:
        cpb = fmt.codes_per_byte
        if order is not None:
            k = slot_of(k, order)
        byte = buf[row, k // cpb].astype("int32")
        u = (byte >> ((k % cpb) * bits).astype("int32")) & ((1 << bits) - 1)
    elif storage == "twos":
        return buf[row, k].astype("int32")      # int8 storage: the cast sign-extends
    else:
        u = buf[row, k].astype("int32") & 0xFF
    half = 1 << (bits - 1)
    if storage == "offset":
        return u - half
    if storage == "twos":
        return (u ^ half) - half
    return u


def e4m3_bits(v):
    """The float8_e4m3 bit pattern (int8) of an int32 expression ``v`` with |v| < 16 (every such
    integer is exact in e4m3: sign, exponent ``e + 7`` with 2**e <= |v|, 3 mantissa bits).

    By way of float32, without branches and with ``v`` evaluated once: the bits of ``v + 1.5 *
    2**23`` as a float, minus that bias, are the float ``v`` (exact for |v| < 2**22); its exponent
    byte and top 3 mantissa bits, ``(bits >> 20) & 0x7ff``, minus ``(127 - 7) << 3`` are the e4m3
    exponent and mantissa (0 stays 0 by the max), and bit 31 the sign. ~8 instructions a value;
    the select chain it replaces compiled to ~23 (PTX of the int4 -> e4m3 dequantize kernel, 476
    instructions per 16 values against 110 for int4 -> int8; now 272). H200, W4A-fp8 per channel,
    decode-then-GEMM at 4096 x 8192^2: 503.7 µs with the select chain (~77 beyond the dense fp8
    GEMM), 475.8 and 468.8 with this form in two runs beside a dense fp8 GEMM of 443.1 (~26-33
    beyond; W4A8's int8 decode ~28); `benchmark.matmul --formats w4afp8-chan,fp8 --m 4096`."""
    f = tirx.reinterpret("float32", v + 0x4B400000) - tirx.const(12582912.0, "float32")
    b = tirx.reinterpret("int32", f)
    mag = tirx.max(((b >> 20) & 0x7FF) - 960, 0)
    return (mag | ((b >> 24) & 0x80)).astype("int8")


def e4m3_codes(plan: Plan) -> bool:
    """Integer weights the float8_e4m3 kernels take as e4m3 values (int / uint of at most 4 bits
    with float8_e4m3 activations: every value is exact)."""
    return plan.a.name == "float8_e4m3" and plan.w.kind in ("int", "uint") and plan.w.bits <= 4


def _group_len(plan: Plan) -> int:
    """K elements per scale group (the whole row for per-channel scales)."""
    return plan.config.K if plan.groups == 1 else plan.config.group_size


def scale_value(plan: Plan, ph: dict, dtype: str):
    """``scale_at(n, k)``: the weight scale of element (n, k) in ``dtype`` (table-coded scales,
    nvfp4's float8_e4m3, looked up in ``s_table`` first). ``ph``: the plan's placeholders by name."""
    gsize = _group_len(plan)
    sfmt = FORMATS.get(plan.scale_dtype)

    def scale_at(n, k):
        s = ph["scale"][n, k // gsize]
        if sfmt is not None and sfmt.kind == "table":
            return ph["s_table"][s.astype("int32") & 0xFF].astype(dtype)
        return s.astype(dtype)

    return scale_at


def zero_value(plan: Plan, ph: dict, dtype: str):
    """``zero_at(n, g)``: the zero point of channel n, group g, in ``dtype`` (quantized zeros
    decoded from their codes). ``ph``: the plan's placeholders by name."""
    c, w = plan.config, plan.w

    def zero_at(n, g):
        z = ph["zeros"]
        if c.zeros_mode == "quantized":    # codes [groups, N] packed along N
            return decode_code(z, g, n, w, plan.w_storage).astype(dtype)
        return z[n, g].astype(dtype)

    return zero_at


def decoded_weight(plan: Plan, ph: dict, dec: str):
    """``weight(n, k)``: the decoded weight element the matmul multiplies with, in ``dec``.

    Codes are decoded (``decode_code``, table lookup), cast to ``dec``, and, for float decodes with
    group or channel scales applied before the reduction, scaled and shifted there:
    ``v * s``, ``(v - z) * s`` ("original", "quantized") or ``v * s - z`` ("rescale"), each
    operation rounded in ``dec``. Per-channel scales of integer-activation plans
    (``plan.scale_in_epilogue``), integer decodes and the nvfp4 global scale are left to the
    caller. ``ph``: the plan's placeholders by name. This is the one definition of a decoded
    weight: ``emit_matmul``'s ``B_decode`` and the dequantize kernel both use it.
    """
    c, w = plan.config, plan.w
    gsize = _group_len(plan)
    float_decode = not dec.startswith("int")  # float16, bfloat16, float32 (not "bfloat16".startswith("float"))
    scale_at = scale_value(plan, ph, dec if float_decode else "float32")
    zero_of = zero_value(plan, ph, dec) if c.with_zeros else None

    def zero_at(n, k):
        return zero_of(n, k // gsize)

    def weight(n, k):
        if w.kind == "float":
            v = ph["W"][k, n] if c.layout == "nn" else ph["W"][n, k]
            return v.astype(dec)
        q = decode_code(ph["W"], n, k, w, plan.w_storage, plan.w_order)
        v = ph["w_table"][q] if w.kind == "table" else q
        v = v.astype(dec)
        if not c.with_scaling or not float_decode or plan.scale_in_epilogue:
            return v
        s = scale_at(n, k)
        if not c.with_zeros:
            return v * s
        if c.zeros_mode == "rescale":
            return v * s - zero_at(n, k)
        return (v - zero_at(n, k)) * s

    return weight


def placeholders(plan: Plan, m, names=None) -> dict:
    """te placeholders of the plan's non-output arguments (``names``: only those), by name; ``m``
    replaces ``M_VAR`` in shapes."""
    ph = {}
    for spec in plan.args:
        if spec.role != "output" and (names is None or spec.name in names):
            shape = tuple(m if s == M_VAR else s for s in spec.shape)
            ph[spec.name] = te.placeholder(shape, spec.dtype, name=spec.name)
    return ph


def emit_matmul(plan: Plan, fp8_values: bool = False) -> tirx.PrimFunc:
    c = plan.config
    if plan.nvfp4_acts:
        raise NotImplementedError("nvfp4 activations have no TensorIR form: their kernels are hand-written "
                                  "(bitblas/schedule/nvfp4.py)")
    if fp8_values and not (all((f.torch_dtype or "").startswith("float8") for f in (plan.a, plan.w))
                           or e4m3_codes(plan)):
        raise ValueError(f"fp8_values=True needs float8 activations and weights (or integer codes of at most 4 "
                         f"bits with float8_e4m3 activations), not {c.A_dtype} x {c.W_dtype}")
    if fp8_values and c.with_scaling and not plan.scale_in_epilogue:
        raise NotImplementedError("fp8_values=True with group scales (the scales apply in the epilogue only)")
    m = te.var(M_VAR, "int32") if plan.m is None else plan.m
    ph = placeholders(plan, m)
    a, w, dec, acc = plan.a, plan.w, plan.decode_dtype, plan.accum
    float_decode = not dec.startswith("int")
    scale_at = scale_value(plan, ph, dec if float_decode else "float32")
    w_f8 = w.torch_dtype if w.torch_dtype else "float8_e4m3fn"      # the float8 dtype of B_decode's bits
    if fp8_values and e4m3_codes(plan):
        def weight(n, k):                     # integer codes: their values' e4m3 bits
            return e4m3_bits(decode_code(ph["W"], n, k, w, plan.w_storage, plan.w_order))
    elif fp8_values:
        def weight(n, k):
            return ph["W"][n, k]              # the bits (int8); C reinterprets them
    else:
        weight = decoded_weight(plan, ph, dec)

    def act(i, k):
        if a.kind == "float":
            return ph["A"][i, k].astype(acc)
        q = decode_code(ph["A"], i, k, a, plan.a_storage)
        return ph["a_table"][q] if a.kind == "table" else q

    B = te.compute((c.N, c.K), weight, name="B_decode")
    k = te.reduce_axis((0, c.K), name="k")
    int_grouped = (not float_decode) and c.with_scaling and not plan.scale_in_epilogue

    def body(i, j):
        if fp8_values:
            return te.sum(tirx.reinterpret(a.torch_dtype, ph["A"][i, k]).astype("float32")
                          * tirx.reinterpret(w_f8, B[j, k]).astype("float32"), axis=k)
        if int_grouped:  # integer products, float group scales: scale each product in float32
            return te.sum((act(i, k) * B[j, k]).astype("float32") * scale_at(j, k), axis=k)
        return te.sum(act(i, k).astype(acc) * B[j, k].astype(acc), axis=k)

    C = te.compute((m, c.N), body, name="C")

    def epilogue(i, j):
        v, v_dtype = C[i, j], acc  # PrimExprs have no .dtype in TVM 0.27: track it here
        # an integer sum with a float output goes to float32 before anything is added to it: a
        # float bias added in int32 would be truncated toward zero (only an int32 output stays exact)
        float_out = c.out_dtype != "int32"
        if plan.scale_in_epilogue or c.with_act_scaling or w.global_scale or (float_out and v_dtype != "float32"):
            v, v_dtype = v.astype("float32"), "float32"
            if plan.scale_in_epilogue:
                v = v * scale_at(j, 0)
            if c.with_act_scaling:
                v = v * ph["a_scale"][i]
            if w.global_scale:
                v = v * ph["global_scale"][0]
        if c.with_bias:
            v = v + ph["bias"][j].astype(v_dtype)
        return v.astype(c.out_dtype)

    D = te.compute((m, c.N), epilogue, name="D")
    inputs = [ph[s.name] for s in plan.args if s.role != "output"]
    return te.create_prim_func(inputs + [D])
