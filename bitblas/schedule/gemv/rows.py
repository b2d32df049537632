"""The rows kernel of the GEMV template (bitblas/schedule/gemv/, ``GEMVRowsHint``): a warp owns ``rows_per_warp`` output channels; its lanes walk K in 16-byte vectors
of packed weights (one warp pass over a row reads 512 contiguous bytes), ``unroll`` vectors per row
per step. ``stages`` register slots of weights form a ring: the loads of ``stages - 1`` steps are
in flight while a step is decoded (the default, 2 slots of 4 vectors, measured faster than every
smaller step with a deeper ring). Each lane's sums are warp-reduced and one
lane stores each output.

``act_smem`` (one activation row): the block first stages the whole row in shared memory, each
vector position's activations already paired for the decoder (``bb_prep``) and laid out
``[position // 32, word // 4, position % 32, word % 4]``, so that a warp's read of a word quad is
one conflict-free 16-byte load per lane. The loop then reads 16-byte words from shared memory
instead of re-reading the activations through L1 (a lane's 64 bytes lie 64 bytes apart from its
neighbour's: 16 L1 wavefronts per load instead of 4) and pairing them with ``prmt`` per step.

The decode, scale and store lines come from template.py's ``kernel_script`` (its locals, ``e``);
the decode and the int8 (dp4a) path: emit.py's and template.py's docstrings.

measurements: docs/performance.md
"""
from __future__ import annotations

from .emit import LDS4, STS4, device_entry, keeps_act_sum, l2_prefetch, pdl_trigger, split_steps, step_loop


def _stage_acts(add, e, threads, il):
    """Every thread stages vector positions ``tx``, ``tx + threads``, ..: the raw activations
    (``ar``) paired by the decoder's prep into ``ap``, stored as word quads into ``aps`` (and the
    vector's activation sum into ``ass``); then the block synchronises."""
    NC, APW = e["NC"], e["ap_len"]
    apbase = "ap.ptr_to([0, 0])" if il else "ap.ptr_to([0])"
    ap_at = (lambda j: f"ap.ptr_to([0, {j}])") if il else (lambda j: f"ap.ptr_to([{j}])")
    add(f"    for it in T.serial({-(-NC // threads)}):")
    ind = "        "
    if NC % threads:
        add(f"{ind}if it * {threads} + tx < {NC}:")
        ind += "    "
    cs = f"(it * {threads} + tx)"
    for ln in e["lda_lines"](ind, "0", cs, "ar"):
        add(ln)
    add(f"{ind}asum[0] = {e['prep_expr']('ar', apbase)}")
    for j in range(APW // 4):
        add(f"{ind}T.cuda.func_call('bb_sts4', aps.ptr_to([{cs} // 32, {j}, {cs} % 32, 0]), {ap_at(4 * j)}, "
            f"source_code={STS4!r})")
    if keeps_act_sum(e["plan"]):
        add(f"{ind}ass[{cs}] = asum[0]")
    add("    T.cuda.cta_sync()")


def _row_acts(add, e, ind, col, staged, apdst, asum_dst):
    """The paired activations of activation row ``i`` at vector position ``col`` into the local
    ``apdst(word)`` (a pointer text) and their sum into ``asum_dst``: loaded and paired (``prep``),
    or with ``staged`` = (``col // 32``, ``col % 32``) as index texts, read from shared memory."""
    if not staged:
        for ln in e["lda_lines"](ind, "i", col, "ar"):
            add(ln)
        add(f"{ind}{asum_dst} = {e['prep_expr']('ar', apdst(0))}")
        return
    blk, lane = staged
    for j in range(e["ap_len"] // 4):
        add(f"{ind}T.cuda.func_call('bb_lds4', aps.ptr_to([{blk}, {j}, {lane}, 0]), {apdst(4 * j)}, "
            f"source_code={LDS4!r})")
    if keeps_act_sum(e["plan"]):
        add(f"{ind}{asum_dst} = ass[({blk}) * 32 + {lane}]")


def _row_locals(add, e, R, m, WARPS, interleave=False):
    """The registers of the rows kernel beside its weight buffers, and zeroed accumulators
    (``interleave``: paired activations of every row, one decoded vector; see :func:`_row_dot_il`)."""
    NA = e["NA"]
    add(f"    ar = T.alloc_local(({NA},), 'uint32')")
    if interleave:
        add(f"    ap = T.alloc_local(({m}, {e['ap_len']}), {e['ap_dtype']!r})")
        add(f"    dq = T.alloc_local(({e['ap_len']},), {e['ap_dtype']!r})")
        add(f"    asums = T.alloc_local(({m},), 'float32')")
    else:
        add(f"    ap = T.alloc_local(({e['ap_len']},), {e['ap_dtype']!r})")
        add(f"    dq = T.alloc_local(({R}, {e['ap_len']}), {e['ap_dtype']!r})")
    add(f"    acc = T.alloc_local(({R}, {m}), {e['acc_dtype']!r})")
    if e["i8"]:                               # group scales; asum: the dp4a chain's start
        if e["sdt"]:
            add(f"    sv = T.alloc_local(({R},), 'float32')")
        add("    asum = T.alloc_local((1,), 'int32')")
    else:
        add(f"    sv = T.alloc_local(({R},), 'float32')")
        add(f"    cv = T.alloc_local(({R},), 'float32')")
        add(f"    ov = T.alloc_local(({R},), 'int32')")
        add("    asum = T.alloc_local((1,), 'float32')")
    add("    lane = T.meta_var(tx % 32)")
    add(f"    n0 = T.meta_var((bx * {WARPS} + tx // 32) * {R})")
    add(f"    for r, i in T.grid({R}, {m}):")
    add(f"        acc[r, i] = T.{e['acc_dtype']}(0)")


def _acc_line(e, ind, dptr, apptr, asum, slot):
    """``acc[r, i]`` plus the dot product of the decoded weight vector ``dptr`` with the paired
    activations ``apptr``, scaled: by ``sv[r]`` (one scale per vector, the activation sum term
    with float zero points), or with two float8 block scales per vector (nvfp4) each block's dot
    by its scale (the raw bytes of register slot ``slot``, :func:`~.emit.block_dot_helpers`)."""
    if e["SB"] > 1:
        return (f"{ind}acc[r, i] = "
                f"{e['dsb_expr'](dptr, apptr, f'sr[{slot}, u, r]', 'acc[r, i]')}")
    tail = f" + cv[r] * {asum}" if e["need_asum"] else ""
    return f"{ind}acc[r, i] = acc[r, i] + sv[r] * {e['dot_expr'](dptr, apptr)}{tail}"


def _row_dot(add, e, ind1, R, m, col, slot, staged=None):
    """Per activation row: load and pair the activations of vector ``col`` (``staged``: read
    them paired from shared memory, at (block, lane) index texts), then accumulate the dot
    products with the ``R`` decoded weight vectors."""
    add(f"{ind1}for i in T.unroll({m}):")
    _row_acts(add, e, ind1 + "    ", col, staged, lambda j: f"ap.ptr_to([{j}])", "asum[0]")
    add(f"{ind1}    for r in T.unroll({R}):")
    if e["i8"]:                               # exact int32 per vector; float32 with group scales
        dot = e["idot_expr"]("dq.ptr_to([r, 0])", "ap.ptr_to([0])", "asum[0]")
        add(f"{ind1}        acc[r, i] = acc[r, i] + " + (f"sv[r] * T.Cast('float32', {dot})" if e["sdt"] else dot))
        return
    add(_acc_line(e, ind1 + "        ", "dq.ptr_to([r, 0])", "ap.ptr_to([0])", "asum[0]", slot))


def _row_decode(add, e, ind, slot, cidx, sdt, zdt, dst):
    """Scale / offset registers and the decode of weight vector r of register slot ``slot``."""
    for ln in e["scale_lines"](ind, cidx, "r", f"sr[{slot}, u, r]" if sdt else None,
                               f"zr[{slot}, u, r]" if zdt else None):
        add(ln)
    add(e["dec_line"](ind, f"wq.ptr_to([{slot}, u, r, 0])", "ov[r]", dst))


def _row_dot_il(add, e, ind1, R, m, col, slot, step_cidx, sdt, zdt, staged=None):
    """Float activations, interleaved: the paired activations of every row first, then each of the
    ``R`` weight vectors decoded and used at once (one decoded vector live instead of ``R``: more
    channels per warp fit the registers, and each activation load serves more of them)."""
    add(f"{ind1}for i in T.unroll({m}):")
    _row_acts(add, e, ind1 + "    ", col, staged, lambda j: f"ap.ptr_to([i, {j}])", "asums[i]")
    add(f"{ind1}for r in T.unroll({R}):")
    _row_decode(add, e, ind1 + "    ", slot, step_cidx, sdt, zdt, "dq.ptr_to([0])")
    add(f"{ind1}    for i in T.unroll({m}):")
    add(_acc_line(e, ind1 + "        ", "dq.ptr_to([0])", "ap.ptr_to([i, 0])", "asums[i]", slot))


def _row_store(add, e, R, m, N):
    """Warp-reduce every (row, activation) accumulator; one lane each stores it."""
    add(f"    for r in T.unroll({R}):")
    add(f"        for i in T.unroll({m}):")
    add("            acc[r, i] = T.cuda.warp_sum(acc[r, i])")
    add(f"            if lane == (r * {m} + i) % 32 and n0 + r < {N}:")
    add(e["store_line"]("                ", "i", "n0 + r", "acc[r, i]"))


def body(plan, hint, add, e):
    """Warps own ``rows_per_warp`` rows; lanes walk all of K, ``unroll`` vectors per row per step;
    with ``stages=ST >= 2`` the packed weights and raw scales / zeros of steps s+1 .. s+ST-1 are
    in flight while step s is decoded (``ST`` register slots). Activations are re-read (L1) for
    every step."""
    m, N, NC, NW = e["m"], e["N"], e["NC"], e["NW"]
    NIT = -(-NC // 32)
    U, NS = split_steps(NIT, hint.unroll)
    R, WARPS = hint.rows_per_warp, hint.warps
    ST = max(1, min(hint.stages, NS))
    NBLK = -(-N // (R * WARPS))
    sdt, zdt = e["sdt"], e["zdt"]
    PF = min(hint.l2_prefetch, NS)
    device_entry(add, hint, NBLK, 32 * WARPS, (ST, U, R), NW, sdt, zdt, wait=not PF)
    # interleaved decode and dot: 8 channels per warp spill registers without it; the nf4 table
    # decoder gains a little; int codes with 4 channels gain nothing, so they keep the decoded
    # vectors of all rows
    il = not e["i8"] and (R >= 8 or e["dec"] == "lut4")
    _row_locals(add, e, R, m, WARPS, interleave=il)
    if hint.act_smem:                         # m == 1 (gemv_hint_unsupported)
        add(f"    aps = T.alloc_buffer(({-(-NC // 32)}, {e['ap_len'] // 4}, 32, 4), {e['ap_dtype']!r}, "
            "scope='shared')")
        if keeps_act_sum(e["plan"]):
            add(f"    ass = T.alloc_buffer(({-(-NC // 32) * 32},), {'int32' if e['i8'] else 'float32'!r}, "
                "scope='shared')")
    nr = f"T.min(n0 + r, {N - 1})"

    def cexpr(step):
        return f"((({step}) * {U} + u) * 32 + lane)"

    def cload(step):
        return cexpr(step) if NC % 32 == 0 else f"T.min({cexpr(step)}, {NC - 1})"

    if PF:
        l2_prefetch(add, hint, PF, U, R, lambda step: e["vec_ptrs"](nr, cload(step)))

    def load(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        add(f"{ind}    for r in T.unroll({R}):")
        for ln in e["load_lines"](ind + "        ", nr, cload(step), f"{slot}, u, r"):
            add(ln)

    def process(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        if NC % 32:
            add(f"{ind1}if {cexpr(step)} < {NC}:")
            ind1 += "    "
        staged = (f"({step}) * {U} + u", "lane") if hint.act_smem else None
        if il:
            _row_dot_il(add, e, ind1, R, m, cexpr(step), slot, cload(step), sdt, zdt, staged)
            return
        add(f"{ind1}for r in T.unroll({R}):")
        _row_decode(add, e, ind1 + "    ", slot, cload(step), sdt, zdt, "dq.ptr_to([r, 0])")
        _row_dot(add, e, ind1, R, m, cexpr(step), slot, staged)

    # staged activations: the first steps' weight loads go out before the staging and its barrier
    stage = (lambda: _stage_acts(add, e, 32 * WARPS, il)) if hint.act_smem else None
    step_loop(add, NS, ST, load, process, after_prologue=stage, unroll=hint.act_smem)
    pdl_trigger(add, hint)
    _row_store(add, e, R, m, N)
