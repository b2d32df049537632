"""The tensor-core GEMV for int8 activations (bitblas/schedule/gemv/, ``GEMVMmaHint``
with ``A_dtype="int8"``): ``mma.sync m16n8k32`` with int/uint 1/2/4/8-bit weight codes decoded to
bytes as the 16 x 32 A operand (16 output channels) and 1..16 int8 activation rows (chunks of 16 up
to 64, mma.row_chunks; with ``GEMVMmaHint.chunk_loop``, the default there, one block serves
every chunk and decodes each weight vector once) as the 32 x 8 B operand, exact int32
accumulation. The float-activation kernel is mma.py; this one reuses
its tiling (lanes ``(g, q)`` stream vectors ``c = ((step * U + u) * k_warps + warp) * 4 + q`` of
channels ``g`` and ``g + 8`` of each 16-channel tile) and the int8 rows kernel's gather (int8).

Fragments (PTX ISA, m16n8k32 .s8/.u8): lane (g = lane // 4, q = lane % 4) holds
``a0`` = A[g, 4q..4q+3], ``a1`` = A[g+8, 4q..4q+3], ``a2`` = A[g, 16+4q..], ``a3`` = A[g+8, 16+4q..];
``b0`` = B[4q..4q+3, g], ``b1`` = B[16+4q.., g]; ``c0, c1`` = C[g, 2q], C[g, 2q+1], ``c2, c3``
= C[g+8, 2q..2q+1]. The K slot of a byte depends on ``q`` (and the register), never on ``g``, so
slots 4q.. / 16+4q.. may stand for any K positions that lane quad ``q`` chooses, as long as the
weights of both channels and the activations of every token use the same ones: mma step ``s``
of a vector takes decoded words ``2s`` and ``2s + 1`` of channel ``g`` (a0, a2) and ``g + 8`` (a1,
a3), and the activation words ``2s``, ``2s + 1`` of token ``g`` gathered into the decode's K order
(``prmt``, int8._i8_gather) as b0, b1. One vector of V codes gives ``V / 4`` words: ``V / 8``
mma per channel pair and token tile. testing/test_gemv_mma_int8.py checks this with a Python model
of the fragment layout on the generated helper source.

Codes: unsigned codes stay in the low bits of each byte (the rows kernel's decode without XOR,
``.u8`` A, ``uint8`` weights as they are); int8 weights are ``.s8`` as they are; signed sub-byte
codes (stored offset-binary, ``u = q + 2**(b-1)``) are placed in the *high* bits of each byte and
their top bit flipped (``((w << (8 - b - b*p)) & mask) ^ 0x80..``: one shift and one ``lop3`` per
field, as many as the unsigned decode), i.e. the byte is ``u * 2**(8-b) - 128 = q * 2**(8-b)`` as
an ``.s8``; the int32 sum is ``2**(8-b)`` times the true one (no per-token activation-sum
correction is needed) and is divided back exactly at the end (arithmetic shift for int32 results,
an exact power-of-two factor for float ones). The magnitude stays within the int8 x int8 range
(``|q| * 2**(8-b) <= 128``). (The alternative, the unsigned field ``u`` corrected by
``-2**(b-1) * sum(a)``, needs the per-token sums of the *store's* tokens ``2q, 2q+1`` while a lane
sums token ``g``: a cross-lane exchange per group with group scales; the shifted codes avoid it.)

Scales: without group scales the int32 tile goes through the k-split reduction (shared memory,
int32) to the store, which applies the per-channel scale, the per-token activation scale and
the bias as the rows kernel does (``store_line``; int32 output: the exact sum + bias). Group
scales: each vector step's int32 tile (the 4 lanes' vectors, 4 V consecutive K positions) is
promoted ``acc += float(partial) * scale[channel, group] * 2**-(8-b)``; that needs the 4 V
positions inside one group (``group_size % (4 V) == 0``; :func:`mma_i8_vec_bytes` picks a vector
width that gives it, or refuses).

float8_e4m3 activations (W4A-fp8 / W2A-fp8, sm_89+): the same tiling with ``mma.sync m16n8k32
.f32.e4m3.e4m3`` (its fragments are the 8-bit ones above), the codes decoded to the e4m3 bytes of
their values by the fused wgmma GEMM's ``prmt`` table (:func:`~.decode.e4m3_code_dec`; no factor)
and the activations gathered into its slots. The float8 mma keeps fewer bits in its sums than
float32, so every vector step's sums go to a fresh float32 tile that is then added into the
float32 accumulators (times the group scale where there is one), as the int8 group-scaled path
promotes its int32 tiles.

measurements: docs/performance.md
"""
from __future__ import annotations

from typing import Optional

from .decode import e4m3_code_dec, e4m3_code_slots
from .emit import e4m3_acts, pdl_trigger, step_loop, vec_bytes
from .int8 import gather_lines, i8_consts
from .mma import (chunk_loop, chunk_loop_unsupported, mma_chains, mma_entry, mma_lanes, mma_store, mma_tile_unsupported,
                  mma_tiles)

__all__ = ["mma_int8_unsupported", "mma_i8_vec_bytes", "mma_i8_helpers", "code_shift"]


def mma_i8_vec_bytes(plan, want: int = 0) -> Optional[int]:
    """Weight bytes per lane vector of the int8 tensor-core GEMV: the GEMV's rule
    (``emit.vec_bytes``) with, for group scales, 4 vectors (one mma k-range of the 4 lanes
    of a quad) inside one group."""
    return vec_bytes(plan, want, group_vectors=4)


def mma_int8_unsupported(plan, hint) -> Optional[str]:
    """None when the int8 tensor-core GEMV takes ``plan`` with ``hint``, else why not."""
    c = plan.config
    if plan.float_acts:
        return f"A_dtype={c.A_dtype!r}: this kernel takes int8 activations (or float8_e4m3 ones)"
    if plan.w.kind not in ("int", "uint") or plan.w.bits not in ((2, 4) if e4m3_acts(plan) else (1, 2, 4, 8)):
        return (f"W_dtype={c.W_dtype!r}: the byte-activation tensor-core GEMV takes int/uint 1/2/4/8-bit weights "
                "(float8_e4m3 activations: 2- and 4-bit)")
    why = mma_tile_unsupported(hint)
    if why:
        return why
    why = chunk_loop_unsupported(plan, hint)
    if why:
        return why
    if mma_i8_vec_bytes(plan, hint.vec_bytes) is None:
        vals = {vb: vb * 8 // plan.w.bits for vb in ((hint.vec_bytes,) if hint.vec_bytes else (16, 8, 4))}
        if plan.groups > 1:
            return (f"group_size={c.group_size}, K={c.K}: the int8 tensor-core GEMV needs 4 weight vectors (one "
                    f"mma k-step of a lane quad) inside one group and >= 16 values per vector; {c.W_dtype} "
                    f"vectors of {', '.join(f'{vb} bytes hold {v}' for vb, v in vals.items())} values")
        return (f"K={c.K}, vec_bytes={hint.vec_bytes}: the int8 tensor-core GEMV needs a weight vector of 16..64 "
                f"{c.W_dtype} values dividing K")
    return None


def mma_i8_helpers(tag: str, bits: int, storage: str, nw: int, order=None, f8: bool = False):
    """CUDA helpers: ``bb_mdec`` (weight words -> mma A bytes), ``bb_mprep`` (activation words
    -> the same K order) and ``bb_mma`` (``NA / 2`` m16n8k32 steps of one vector per lane), for
    codes stored as ``storage`` (bitblas.formats.code_storage); ``f8``: float8_e4m3 activations
    (the codes' e4m3 bytes, float32 sums)."""
    k = i8_consts(bits, "plain")
    signed = storage != "plain"
    F = k["F"]
    na = nw * F
    src = {}
    lines = [f"__device__ __forceinline__ void bb_mprep_{tag}(const unsigned* a, unsigned* ap) {{"]
    lines += gather_lines(bits, nw, order, e4m3_code_slots(bits) if f8 else None)
    lines.append("}")
    src[f"bb_mprep_{tag}"] = "\n" + "\n".join(lines) + "\n"
    if f8:
        src[f"bb_mdec_{tag}"] = e4m3_code_dec(tag, bits, storage, nw, name=f"bb_mdec_{tag}")
        src.update(mma_chains(tag, na // 2, "m16n8k32.row.col.f32.e4m3.e4m3.f32", "float", "f"))
        return src

    lines = [f"__device__ __forceinline__ void bb_mdec_{tag}(const unsigned* w, unsigned* d) {{"]
    hi = (((1 << bits) - 1) << (8 - bits)) * 0x01010101
    for j in range(nw):
        for p in range(F):
            if bits == 8:
                lines.append(f"  d[{j}] = w[{j}];")
            elif signed:                     # field p to the top of its byte: q * 2**(8-bits) as s8
                s = 8 - bits - bits * p
                x = f"(w[{j}] << {s})" if s else f"w[{j}]"
                if storage == "offset":      # u * 2**(8-bits) - 128: the top bit flipped
                    lines.append(f"  d[{j * F + p}] = ({x} & 0x{hi:08x}u) ^ 0x80808080u;")
                else:
                    lines.append(f"  d[{j * F + p}] = {x} & 0x{hi:08x}u;")
            else:                            # field p at the bottom of its byte: u as u8
                s = bits * p
                x = f"(w[{j}] >> {s})" if s else f"w[{j}]"
                lines.append(f"  d[{j * F + p}] = {x} & 0x{k['mask']:08x}u;")
    lines.append("}")
    src[f"bb_mdec_{tag}"] = "\n" + "\n".join(lines) + "\n"

    at = "s8" if signed else "u8"
    src.update(mma_chains(tag, na // 2, f"m16n8k32.row.col.s32.{at}.s8.s32", "int", "r"))
    return src


def code_shift(plan) -> int:
    """log2 of the factor the decoded bytes carry (signed sub-byte codes at the top of the byte)."""
    b = plan.w.bits
    return 8 - b if plan.w.kind == "int" and b < 8 and not e4m3_acts(plan) else 0


def body(plan, hint, add, e):
    """The kernel body (see the module docstring); ``e``: template.kernel_script's locals."""
    why = mma_int8_unsupported(plan, hint)
    if why:
        raise ValueError(f"{hint}: {why}")
    NW, NA = e["NW"], e["NA"]
    tag = "m" + e["tag"]
    f8 = e4m3_acts(plan)
    hs = mma_i8_helpers(tag, plan.w.bits, plan.w_storage, NW, plan.w_order, f8=f8)

    def hsrc(name):
        return repr(hs[name])

    SH = code_shift(plan)
    KW, R, TT, U, NS, ST, guard, NBLK = mma_tiles(hint, e)
    sdt = e["sdt"]                            # group scales (per-channel ones are applied at the store)
    adt = "float32" if sdt or f8 else "int32"
    pdt = "float32" if f8 else "int32"        # a step's tile of sums (promoted: group scales, float8)
    promote = bool(sdt) or f8
    CL = chunk_loop(hint, e["m"])
    mma_entry(add, hint, NBLK, KW, ST, U, R, NW, NA, TT, sdt, None, adt, CL,
               [f"    ip = T.alloc_local(({1 if CL else TT}, 8), {pdt!r})"] if promote else [])
    cexpr, cload, load, acts = mma_lanes(add, e, R, TT, KW, U, guard, adt, loop=CL)

    def process(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        acts(ind1, step, f"T.cuda.func_call('bb_mprep_{tag}', ar.ptr_to([0]), ap.ptr_to([t, 0]), "
                         f"source_code={hsrc(f'bb_mprep_{tag}')})")
        add(f"{ind1}for r in T.unroll({R}):")
        add(f"{ind1}    for h in T.unroll(2):")
        add(f"{ind1}        T.cuda.func_call('bb_mdec_{tag}', wq.ptr_to([{slot}, u, r, h, 0]), dq.ptr_to([h, 0]), "
            f"source_code={hsrc(f'bb_mdec_{tag}')})")
        mma = (f"T.cuda.func_call('bb_mma_{tag}', dq.ptr_to([0, 0]), dq.ptr_to([1, 0]), ap.ptr_to([t, 0]), "
               "@ACC@, source_code=" + hsrc(f"bb_mma_{tag}") + ")")
        add(f"{ind1}    for t in T.unroll({TT}):")
        mma_into(ind1 + "        ", mma, slot, "t", 2)

    def mma_into(ind, mma, slot, it, chains):
        """The mma of tile ``r`` and token tile ``t`` into ``acc[r, t]``; with group scales or
        float8 activations into the tile ``ip[it]`` (4 V positions of one group, ``chains``
        accumulator sets), promoted to float32 (times the group scale)."""
        if not promote:
            add(f"{ind}{mma.replace('@ACC@', 'acc.ptr_to([r, t, 0])')}")
            return
        f = f" * {float(2.0 ** -SH)!r}" if SH else ""
        tot = f"ip[{it}, j] + ip[{it}, j + 4]" if chains == 2 else f"ip[{it}, j]"
        add(f"{ind}for j in T.unroll({4 * chains}):")
        add(f"{ind}    ip[{it}, j] = {'T.float32(0)' if f8 else '0'}")
        add(f"{ind}{mma.replace('@ACC@', f'ip.ptr_to([{it}, 0])')}")
        add(f"{ind}for j in T.unroll(4):")
        part = f"({tot})" if f8 else f"T.Cast('float32', {tot})"
        scale = f" * (T.Cast('float32', sr[{slot}, u, r, j // 2]){f})" if sdt else ""
        add(f"{ind}    acc[r, t, j] = acc[r, t, j] + {part}{scale}")

    def process_cl(ind, step, slot):
        """The chunk loop: decode the step's vectors of every channel tile once, then per token
        tile gather its activations and run (and, with group scales, promote) every tile's mma."""
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        add(f"{ind1}for r in T.unroll({R}):")
        add(f"{ind1}    for h in T.unroll(2):")
        add(f"{ind1}        T.cuda.func_call('bb_mdec_{tag}', wq.ptr_to([{slot}, u, r, h, 0]), dqr.ptr_to([r, h, 0]), "
            f"source_code={hsrc(f'bb_mdec_{tag}')})")
        add(f"{ind1}for t in T.unroll({TT}):")
        acts(ind1 + "    ", step, f"T.cuda.func_call('bb_mprep_{tag}', ar.ptr_to([0]), ap.ptr_to([0, 0]), "
                                   f"source_code={hsrc(f'bb_mprep_{tag}')})", one=True)
        add(f"{ind1}    for r in T.unroll({R}):")
        mma = (f"T.cuda.func_call('bb_mma1_{tag}', dqr.ptr_to([r, 0, 0]), dqr.ptr_to([r, 1, 0]), ap.ptr_to([0, 0]), "
               "@ACC@, source_code=" + hsrc(f"bb_mma1_{tag}") + ")")
        mma_into(ind1 + "        ", mma, slot, "0", 1)

    step_loop(add, NS, ST, load, process_cl if CL else process)
    pdl_trigger(add, hint)

    # promoted: the two chains were summed at each promotion; the chunk loop has one
    mma_store(add, e, R, TT, KW, f"T.shift_right(acc[r, t, j], {SH})" if SH and not sdt else "acc[r, t, j]",
               fold=not promote and not CL)
