"""The tensor-core kernel of the GEMV template (bitblas/schedule/gemv/, ``GEMVMmaHint``):
``mma.sync m16n8k16`` with the decoded weights as the 16 x 16 operand and 1..16 activation rows as
the 16 x 8 operand, K split over warps; 17..64 rows run as chunks of 16 rows (:func:`row_chunks`):
with ``GEMVMmaHint.chunk_loop`` (the default) one block serves every chunk of its channel tile,
decoding each weight vector once for up to 8 token tiles of 8 rows; otherwise one block per chunk
and channel tile, each chunk's block the 16-row kernel (the chunks after the first read the
channel tile's weights from L2 and decode them again). The decode, scale and store lines come from
template.py's ``kernel_script`` (its locals, ``e``); which plans it takes:
:func:`mma_gemv_unsupported`.

measurements: docs/performance.md
"""
from __future__ import annotations

from typing import Optional

from .decode import ACT
from .emit import device_entry, mma_decodable, pdl_trigger, reduce_k_warps, split_steps, step_loop


def scale_helper(name: str, act: str, NP: int, halves: bool = False) -> str:
    """``name(d, s, c)``: the ``NP`` decoded pairs ``d`` scaled in place, ``d = d * s + c`` per pair
    (one ``hfma2``). ``halves``: the first half of the pairs with the scale and zero term of quad
    lane 0, the second half with lane 2's (four shuffles; every lane of the warp calls it): 2-bit
    codes in natural order with groups of half a slab (fused_wgmma)."""
    t2 = ACT[act][1]
    cvt = "__float2half2_rn" if act == "float16" else "__float2bfloat162_rn"
    lines = [f"__device__ __forceinline__ void {name}(unsigned* d, float s, float c) {{"]
    if halves:
        lines += ["  const float s0 = __shfl_sync(0xffffffffu, s, 0, 4), s1 = __shfl_sync(0xffffffffu, s, 2, 4);",
                  "  const float c0 = __shfl_sync(0xffffffffu, c, 0, 4), c1 = __shfl_sync(0xffffffffu, c, 2, 4);",
                  f"  const {t2} s2[2] = {{{cvt}(s0), {cvt}(s1)}};",
                  f"  const {t2} c2[2] = {{{cvt}(c0), {cvt}(c1)}};"]
    else:
        lines += [f"  const {t2} s2 = {cvt}(s);", f"  const {t2} c2 = {cvt}(c);"]
    for i in range(NP):
        sc, cc = (f"s2[{2 * i // NP}]", f"c2[{2 * i // NP}]") if halves else ("s2", "c2")
        lines.append(f"  {{ {t2} v = __hfma2(*reinterpret_cast<{t2}*>(&d[{i}]), {sc}, {cc}); "
                     f"d[{i}] = *reinterpret_cast<unsigned*>(&v); }}")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def mma_helpers(tag: str, act: str, NP: int):
    """CUDA helpers of the tensor-core kernel: scale the decoded pairs in place (``bb_scl``, one
    ``hfma2`` per pair: :func:`scale_helper`) and run the ``NP // 2`` mma steps of one 16-byte weight
    vector per lane."""
    ab = "f16" if act == "float16" else "bf16"
    src = {f"bb_scl_{tag}": scale_helper(f"bb_scl_{tag}", act, NP)}
    src.update(mma_chains(tag, NP // 2, f"m16n8k16.row.col.f32.{ab}.{ab}.f32", "float", "f"))
    return src


def mma_chains(tag: str, steps: int, op: str, ctype: str, cons: str) -> dict:
    """``bb_mma_{tag}`` (two accumulator chains) and ``bb_mma1_{tag}`` (one, for the chunk loop)."""
    return {f"bb_mma{n}_{tag}": _mma_chain(f"bb_mma{n}_{tag}", steps, op, ctype, cons, chains)
            for n, chains in (("", 2), ("1", 1))}


def _mma_chain(name: str, steps: int, op: str, ctype: str, cons: str, chains: int = 2) -> str:
    """``name(dg, dh, b, c)``: ``steps`` mma.sync ``op`` of one lane vector, A = decoded
    words 2s, 2s+1 of channels g (``dg``) and g+8 (``dh``), B = activation words 2s, 2s+1,
    alternating between two accumulator sets ``c[0..3]`` / ``c[4..7]`` (two independent chains;
    ``chains=1``: one set, the independent token tiles of a chunk loop interleave instead)."""
    lines = [f"__device__ __forceinline__ void {name}(const unsigned* dg, const unsigned* dh, "
             f"const unsigned* b, {ctype}* c) {{"]
    for s in range(steps):
        o = 4 * (s % chains)
        lines.append(f'  asm volatile("mma.sync.aligned.{op} '
                     '{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" '
                     f': "+{cons}"(c[{o}]), "+{cons}"(c[{o + 1}]), "+{cons}"(c[{o + 2}]), "+{cons}"(c[{o + 3}]) '
                     f': "r"(dg[{2 * s}]), "r"(dh[{2 * s}]), "r"(dg[{2 * s + 1}]), "r"(dh[{2 * s + 1}]), '
                     f'"r"(b[{2 * s}]), "r"(b[{2 * s + 1}]));')
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def body(plan, hint, add, e):
    """Tensor cores for 1..16 rows (chunks of 16 up to 64): ``mma.sync m16n8k16`` with the
    *weights* as the 16 x 16 A operand (16 output channels) and the activation rows as the 16 x 8
    B operand (8 rows per token tile, two tiles above 8 rows), float32 accumulation.

    Lane ``l`` (group ``g = l // 4``, ``q = l % 4``) of a warp streams the 16-byte vectors
    ``c = ((step * U + u) * k_warps + warp) * 4 + q`` of channels ``g`` and ``g + 8`` of each
    16-channel tile, so the four lanes of a channel read 64 contiguous bytes per vector index. A
    dot product does not care in which order K is summed, so the K positions of the mma fragment
    need not be consecutive: the decoded pairs of a vector (``bb_dec``: values k and k + P of
    each 32-bit word) are the A fragment registers as they come, and the activations are paired
    the same way (``bb_prep``'s ``prmt``), which is all the B fragment needs. One vector of
    ``V`` codes feeds ``V / 4`` k16 steps of two channels, i.e. ``V / 8`` mma per lane-vector
    pair (alternating between two accumulator sets, two independent mma chains); group scales and
    float zero points are applied to the decoded pairs (``hfma2(d, s, c)``, float16 / bfloat16
    weights as the mma consumes them), a per-channel scale to the float32 sum at the store (as
    fast as on the pairs; a fresh tile per group step promoted with the group scale, as the int8
    kernel does, measured slower). Any decoder that yields half pairs works the
    same way: int/uint 1/2/4/8-bit, float8, fp4_e2m1 / nvfp4 (float8 scale bytes decoded per
    vector, global scale at the store) and nf4. ``k_warps`` warps of a block split K and meet in
    shared memory; blocks own ``rows_per_warp`` channels (multiples of 16). Out-of-range rows are
    clamped on load and not stored; vectors past K are clamped on load and meet zeroed
    activations (the mma is executed by every lane, so nothing is predicated inside a warp)."""
    c = plan.config
    why = mma_gemv_unsupported(plan, hint)
    if why:
        raise ValueError(f"{hint}: {why}")
    NW, NA = e["NW"], e["NA"]
    tag = e["tag"]
    hs = mma_helpers(tag, c.A_dtype, NA)

    def hsrc(name):
        return repr(hs[name])

    KW, R, TT, U, NS, ST, guard, NBLK = mma_tiles(hint, e)
    sdt, zdt = e["sdt"], e["zdt"]
    # the scale: one per channel at the store (float32, exact), else on the decoded pairs (hfma2)
    at_store = c.with_scaling and plan.groups == 1 and not e["float_zeros"] and not e["s_f8"]
    CL = chunk_loop(hint, e["m"])
    mma_entry(add, hint, NBLK, KW, ST, U, R, NW, NA, TT, None if at_store else sdt, zdt, "float32", CL)
    add("    sv = T.alloc_local((2,), 'float32')")
    add("    cv = T.alloc_local((2,), 'float32')")
    add("    ov = T.alloc_local((2,), 'int32')")
    add("    asum = T.alloc_local((1,), 'float32')")
    cexpr, cload, load, acts = mma_lanes(add, e, R, TT, KW, U, guard, "float32", scales=not at_store, loop=CL)

    def s_raw(slot):
        if at_store:                          # the scale lines then give the decode's offset only
            return "T.float32(1)"
        return f"sr[{slot}, u, r, h]" if sdt else None

    def decode(ind, step, slot, ptr):
        """Channel half ``h`` of tile ``r``, vector ``u``: scale / offset registers, the decode
        into the words at ``ptr`` (pointer text), the scale on the pairs."""
        for ln in e["scale_lines"](ind, cload(step), "h", s_raw(slot), f"zr[{slot}, u, r, h]" if zdt else None):
            add(ln)
        add(e["dec_line"](ind, f"wq.ptr_to([{slot}, u, r, h, 0])", "ov[h]", ptr))
        if (c.with_scaling or e["float_zeros"]) and not at_store:
            add(f"{ind}T.cuda.func_call('bb_scl_{tag}', {ptr}, sv[h], cv[h], source_code={hsrc(f'bb_scl_{tag}')})")

    def process(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        acts(ind1, step, f"asum[0] = {e['prep_expr']('ar', 'ap.ptr_to([t, 0])')}")
        add(f"{ind1}for r in T.unroll({R}):")
        add(f"{ind1}    for h in T.unroll(2):")
        decode(ind1 + "        ", step, slot, "dq.ptr_to([h, 0])")
        add(f"{ind1}    for t in T.unroll({TT}):")
        add(f"{ind1}        T.cuda.func_call('bb_mma_{tag}', dq.ptr_to([0, 0]), dq.ptr_to([1, 0]), ap.ptr_to([t, 0]), "
            f"acc.ptr_to([r, t, 0]), source_code={hsrc(f'bb_mma_{tag}')})")

    def process_cl(ind, step, slot):
        """The chunk loop: decode the step's vectors of every channel tile once, then per token
        tile of 8 rows gather its activations and run the mma of every channel tile."""
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        add(f"{ind1}for r in T.unroll({R}):")
        add(f"{ind1}    for h in T.unroll(2):")
        decode(ind1 + "        ", step, slot, "dqr.ptr_to([r, h, 0])")
        add(f"{ind1}for t in T.unroll({TT}):")
        acts(ind1 + "    ", step, f"asum[0] = {e['prep_expr']('ar', 'ap.ptr_to([0, 0])')}", one=True)
        add(f"{ind1}    for r in T.unroll({R}):")
        add(f"{ind1}        T.cuda.func_call('bb_mma1_{tag}', dqr.ptr_to([r, 0, 0]), dqr.ptr_to([r, 1, 0]), "
            f"ap.ptr_to([0, 0]), acc.ptr_to([r, t, 0]), source_code={hsrc(f'bb_mma1_{tag}')})")

    step_loop(add, NS, ST, load, process_cl if CL else process)
    pdl_trigger(add, hint)

    val = "acc[r, t, j]"
    if at_store:
        val = f"{val} * T.Cast('float32', scale[n0 + r * 16 + g + (j // 2) * 8, 0])"
    mma_store(add, e, R, TT, KW, val, fold=not CL)


def row_class(m: int) -> int:
    """The largest row count whose tensor-core GEMV kernel has the same token tiles and chunks as
    ``m`` rows' (8: one token tile of 8 rows; 16: two; above 16: whole chunks of 16). The kernel
    takes its row count at run time, so the one built for ``row_class(m)`` rows serves ``m``."""
    return 8 if m <= 8 else 16 * row_chunks(m)


def row_chunks(m: int) -> int:
    """Chunks of 16 activation rows: a block serves one chunk of one channel tile (17..64 rows:
    2..4 chunks; the blocks of one channel tile are adjacent, so all but one read its weights from
    L2)."""
    return -(-m // 16)


def mma_tiles(hint, e):
    """(k_warps, 16-channel tiles, token tiles of 8 rows, vectors per step, steps, register slots,
    whether the last step runs past K, blocks) of a tensor-core GEMV hint (float or int8). Blocks:
    channel tiles x :func:`row_chunks` (block ``bx`` serves chunk ``bx % chunks``)."""
    m, N, NC = e["m"], e["N"], e["NC"]
    KW = max(1, hint.k_warps)
    R = hint.rows_per_warp // 16              # 16-channel tiles per block
    TT = 1 if m <= 8 else 2                   # token tiles of 8 rows (per chunk of 16)
    NIT = -(-NC // (4 * KW))                  # vectors per lane
    U, NS = split_steps(NIT, hint.unroll)
    ST = 2 if hint.stages >= 2 and NS > 1 else 1
    if chunk_loop(hint, m):                   # every chunk in the block: 2 token tiles per chunk
        return KW, R, 2 * row_chunks(m), U, NS, ST, NIT * 4 * KW != NC, -(-N // (16 * R))
    return KW, R, TT, U, NS, ST, NIT * 4 * KW != NC, -(-N // (16 * R)) * row_chunks(m)


def mma_gemv_unsupported(plan, hint) -> Optional[str]:
    """None when the mma GEMV (``GEMVMmaHint``, float activations) takes ``plan`` with ``hint``, else why not."""
    if not plan.float_acts:
        return f"A_dtype={plan.config.A_dtype!r}: the tensor-core GEMV takes float16/bfloat16 activations"
    if not mma_decodable(plan.w):
        return ("the tensor-core GEMV decodes int/uint 1/2/4/8-bit, fp4_e2m1 / nvfp4, nf4 and float8 codes to "
                "half pairs")
    return mma_tile_unsupported(hint) or chunk_loop_unsupported(plan, hint)


def mma_tile_unsupported(hint) -> Optional[str]:
    """The tile limits both tensor-core GEMVs (float and int8 activations) share."""
    if hint.rows_per_warp % 16 or hint.rows_per_warp <= 0:
        return f"rows_per_warp={hint.rows_per_warp} must be a positive multiple of 16 (mma tiles of 16 channels)"
    if hint.k_warps > 8:
        return f"k_warps={hint.k_warps}: at most 8 warps split K"
    return None



def chunk_loop_unsupported(plan, hint):
    """None unless the chunk loop's K-warp reduction (every token tile's fragments of the K warps
    but one, 4-byte values) needs more than the 48 KB of static shared memory, else why."""
    if not chunk_loop(hint, plan.m or 1):
        return None
    kw, tiles = max(1, hint.k_warps), hint.rows_per_warp // 16 * 2 * row_chunks(plan.m)
    red = (kw - 1) * tiles * 4 * 32 * 4
    if red <= 48 * 1024:
        return None
    return (f"chunk_loop=True with {plan.m} rows: (k_warps - 1) * rows_per_warp / 16 * token tiles * 512 = "
            f"{red} bytes of shared memory for the K warps' reduction, more than 49152")


def chunk_loop(hint, m: int) -> bool:
    """Whether the tensor-core kernel for ``m`` rows loops over its 16-row chunks in the block
    (``hint.chunk_loop`` and more than 16 rows)."""
    return hint.chunk_loop and m > 16


def mma_entry(add, hint, NBLK, KW, ST, U, R, NW, NA, TT, sdt, zdt, adt, loop, extra=()):
    """Kernel entry, grid / block, and the registers both tensor-core GEMVs hold: ``ST`` slots of
    weight words (raw group scales ``sdt``, zeros ``zdt``) per step, vector, tile and channel half,
    the ``extra`` allocation lines, the raw and gathered activation words (every token tile's, or
    with the chunk ``loop`` one tile's), the decoded words (one tile's, or with the loop every
    tile's: ``dqr``) and the ``adt`` accumulators (two chains of 4 per tile pair; the loop: one)."""
    device_entry(add, hint, NBLK, 32 * KW, (ST, U, R, 2), NW, sdt, zdt)
    for ln in extra:
        add(ln)
    add(f"    ar = T.alloc_local(({NA},), 'uint32')")
    add(f"    ap = T.alloc_local(({1 if loop else TT}, {NA}), 'uint32')")
    add(f"    dqr = T.alloc_local(({R}, 2, {NA}), 'uint32')" if loop else f"    dq = T.alloc_local((2, {NA}), 'uint32')")
    add(f"    acc = T.alloc_local(({R}, {TT}, {4 if loop else 8}), {adt!r})")


def mma_lanes(add, e, R, TT, KW, U, guard, adt, scales=True, loop=False):
    """The lane layout of both tensor-core GEMVs (lane ``(g, q)``, warp ``kw``; channels ``g`` and
    ``g + 8`` of each 16-channel tile), zeroed ``adt`` accumulators; returns ``(cexpr, cload,
    load, acts)``: a step's vector index, the same clamped to K, the emitter of a step's weight
    (and raw scale / zero) loads into register slot ``slot``, and the emitter of a step's
    activation words per token tile (``prep``: the line gathering ``ar`` into ``ap[t]``; words past
    K zeroed). With ``KW > 1`` warps, also their shared reduction buffer ``red``. ``scales=False``:
    no raw group scales in the step registers (applied at the store). ``loop``: the chunk loop
    (every row in the block, one accumulator chain of 4 per tile pair)."""
    m, N, NC, NA = e["m"], e["N"], e["NC"], e["NA"]
    if KW > 1:
        add(f"    red = T.alloc_buffer(({KW - 1}, {R * TT * 4}, 32), {adt!r}, scope='shared')")
    add("    lane = T.meta_var(tx % 32)")
    add("    g = T.meta_var(tx % 32 // 4)")
    add("    q = T.meta_var(tx % 4)")
    add("    kw = T.meta_var(tx // 32)")
    YC = 1 if loop else row_chunks(m)
    add(f"    n0 = T.meta_var(bx * {16 * R})" if YC == 1 else f"    n0 = T.meta_var(bx // {YC} * {16 * R})")
    add("    y0 = T.meta_var(0)" if YC == 1 else f"    y0 = T.meta_var(bx % {YC} * 16)")
    add(f"    for r, t, j in T.grid({R}, {TT}, {4 if loop else 8}):")
    add(f"        acc[r, t, j] = T.{adt}(0)")
    nr = f"T.min(n0 + r * 16 + h * 8 + g, {N - 1})"

    def cexpr(step):
        return f"(((({step}) * {U} + u) * {KW} + kw) * 4 + q)"

    def cload(step):
        return f"T.min({cexpr(step)}, {NC - 1})" if guard else cexpr(step)

    def load(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        add(f"{ind}    for r, h in T.grid({R}, 2):")
        for ln in e["load_lines"](ind + "        ", nr, cload(step), f"{slot}, u, r, h", scales):
            add(ln)

    def acts(ind, step, prep, one=False):
        """Every token tile ``t`` into ``ap[t]``; ``one``: only tile ``t`` of the caller's loop, into
        ``ap[0]`` (the chunk loop)."""
        at = "0" if one else "t"
        if not one:
            add(f"{ind}for t in T.unroll({TT}):")
            ind += "    "
        for ln in e["lda_lines"](ind, f"T.min(y0 + t * 8 + g, {e['rows']} - 1)", cload(step), "ar"):
            add(ln)
        add(f"{ind}{prep}")
        if guard:
            add(f"{ind}if {cexpr(step)} >= {NC}:")
            add(f"{ind}    for v in T.unroll({NA}):")
            add(f"{ind}        ap[{at}, v] = T.uint32(0)")
    return cexpr, cload, load, acts


def mma_store(add, e, R, TT, KW, val="acc[r, t, j]", fold=True):
    """Reduce the ``KW`` warps' C fragments in shared memory (``red``) and store: ``acc[r, t, j]``
    (``fold``: plus ``acc[r, t, j + 4]``, the second mma chain) is channel n0 + r*16 + g + 8*(j // 2),
    row y0 + t*8 + q*2 + j % 2; ``val`` the stored expression of it."""
    N = e["N"]
    if fold:
        add(f"    for r, t, j in T.grid({R}, {TT}, 4):")
        add("        acc[r, t, j] = acc[r, t, j] + acc[r, t, j + 4]")
    ind = "    "
    if KW > 1:
        ind = reduce_k_warps(add, KW, "r, t, j", f"{R}, {TT}, 4", "acc[r, t, j]",
                              lambda k: f"red[{k}, (r * {TT} + t) * 4 + j, lane]")
    add(f"{ind}for r, t, j in T.grid({R}, {TT}, 4):")
    add(f"{ind}    if y0 + t * 8 + q * 2 + j % 2 < {e['rows']} and n0 + r * 16 + g + (j // 2) * 8 < {N}:")
    add(e["store_line"](ind + "        ", "y0 + t * 8 + q * 2 + j % 2", "n0 + r * 16 + g + (j // 2) * 8", val))
